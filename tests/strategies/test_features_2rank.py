"""Activation checkpointing, gradient accumulation under ``fabric.no_backward_sync`` and mixed precision on 2 real
gloo ranks, against one process of eager PyTorch (``features_scenarios``).

All scenarios run as one job on the session's pair of rank processes (``tests/helpers/rank_pool.py``); each is asserted
as its own test. Tolerances: float32 runs use ``torch.testing.assert_close``'s float32 defaults (the distributed sum
differs from the one-process sum only in summation order). Half-precision runs are compared at the scale of each tensor:
``max |got - ref| <= k * eps * max |ref|`` with ``eps`` the format's relative spacing (bfloat16 2**-7, float16 2**-10)
and ``k = 4``: both sides round every op's result to that format but in a different order (each rank's half of the batch
reduced separately, thunder's decompositions vs eager's kernels), which costs a few units of the last place of the
largest values; measured 1.4 (bf16-true), 0.7 (bf16-mixed) and 0.6 (16-mixed) units. A real mistake is far outside it: a
gradient not averaged over ranks is off by 100%, a micro-batch left out by a third.

Over a minute (about 100 s beside the other pytest worker), in the first test: 17 scenarios, each a thunder compile
(two of them of a case-2 function, which compile reuse cannot share) and a one-process reference.
"""

from __future__ import annotations

import pytest
import torch

from tests.strategies.common import SharedRun
from tests.strategies.features_scenarios import ACCUMULATION, CHECKPOINTING, MICRO, PRECISION, run_all
from thunderviz.trace.diff import collective_changes, diff_traces
from thunderviz.trace.ledger import ledger_from_bundle

EPS = {"bf16-true": 2**-7, "bf16-mixed": 2**-7, "16-mixed": 2**-10}
UNITS = 4

#: Every feature scenario, one job: the first test pays for it.
_run = SharedRun(run_all, timeout=1500)
#: pytest's default 600 s per test would cut the first test that pays for the shared run short on a loaded machine.
pytestmark = pytest.mark.timeout(1600)


def _close(got: dict, ref: dict, precision: str | None = None) -> None:
    assert got.keys() == ref.keys()
    for name in ref:
        if precision is None:
            torch.testing.assert_close(got[name], ref[name].float(), msg=name)
        else:
            scale = float(ref[name].float().abs().max())
            err = float((got[name] - ref[name].float()).abs().max())
            assert err <= UNITS * EPS[precision] * scale, f"{name}: off by {err:.3g}, {err / scale:.3g} of its scale"


def _by_trace(bundle) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for e in ledger_from_bundle(bundle).collectives():
        out.setdefault(e.trace, {}).setdefault(e.kind, 0)
        out[e.trace][e.kind] += 1
    return out


# -- activation checkpointing ---------------------------------------------------------------------------------------

CHECKPOINTED_ACCUMULATION = [a for a in ACCUMULATION if a[3]]


@pytest.mark.parametrize(("kind", "case"), CHECKPOINTING)
def test_checkpointing_trains_like_one_process_without_it(kind, case):
    for r in _run():
        c = r[("checkpointing", kind, case)]
        assert c["checkpointed"] == ["blocks.0", "blocks.1"]
        assert abs(c["loss"] - c["ref_loss"]) <= 1e-6 * abs(c["ref_loss"])
        _close(c["grads"], c["ref_grads"])


@pytest.mark.parametrize(("kind", "case"), [*CHECKPOINTING, *((a[0], a[2]) for a in CHECKPOINTED_ACCUMULATION)])
def test_the_decision_log_names_the_checkpointed_modules(kind, case):
    r0 = _run()[0]
    key = ("checkpointing", kind, case)
    reason = (
        r0[key]["reason"]
        if key in r0
        else next(r0[("accumulation", *a)]["reason"] for a in CHECKPOINTED_ACCUMULATION if (a[0], a[2]) == (kind, case))
    )
    assert (
        "activation checkpointing: 2 modules selected by {Block} (blocks.0, blocks.1) run their forward under"
        " torch.utils.checkpoint.checkpoint(..., use_reentrant=False)" in reason
    )
    if case == "function":
        assert "your jitted function sees the checkpointed forwards when it traces the module" in reason
    if case == "jitted_ran":
        assert "clear its 1 cached trace(s)" in reason
        assert "the traces it already made had no checkpointing (they are the ones cleared)" in reason


def test_checkpointing_trades_saved_tensors_for_recomputation_and_says_so():
    """Against the same model without checkpointing: less saved, ops recomputed, the same collectives (ZERO2)."""
    r0 = _run()[0]
    base = r0["baseline"]
    ck = r0[("checkpointing", "fsdp-zero2", "jitted")]["bundle"]
    assert base.backward.recomputed_ops == 0
    n = ck.backward.recomputed_ops
    assert n > 0 and ck.saved_for_backward["bytes"] < base.saved_for_backward["bytes"] / 2
    saved = f"saved tensors (trace) {_kib(base)} -> {_kib(ck)}"
    assert collective_changes(base, ck) == f"the same collectives; {saved}; +{n} recomputed ops"
    assert diff_traces(base.backward, ck.backward).summary.endswith(f"; +{n} recomputed ops")
    # ZERO3 on top: the parameters are gathered again in backward as well.
    z3 = r0[("checkpointing", "fsdp-zero3", "jitted_ran")]["bundle"]
    assert collective_changes(base, z3).startswith(
        "+3 all_gather (backward), +3 wait (backward); saved tensors (trace)"
    )
    assert z3.saved_for_backward["bytes"] < ck.saved_for_backward["bytes"]


def _kib(bundle) -> str:
    from thunderviz.trace.units import format_bytes

    return format_bytes(bundle.saved_for_backward["bytes"])


def test_a_policy_selecting_nothing_is_an_error_naming_the_classes():
    assert _run()[0]["policy_matching_nothing"] == (
        "You set `ThunderFSDPStrategy(activation_checkpointing_policy={Conv2d})`, but it selects no module of the"
        " Tower you set up, so nothing would be checkpointed. Its module classes are: Block, LayerNorm, Linear,"
        " ModuleList, Tower. Name one of them (a class, its name, or a callable `module -> bool`)."
    )


# -- gradient accumulation ------------------------------------------------------------------------------------------

N_PARAMS = 2 * 6 + 4  # two blocks of (norm, fc1, fc2) x (weight, bias), inp and head
# The unsharded gradients as reduce_scatter takes them: dim 0 padded to a multiple of the world size (15 -> 16, 3 -> 4).
PADDED_NUMEL = (8 * 5 + 8) + 2 * ((8 + 8) + (16 * 8 + 16) + (8 * 15 + 8)) + (4 * 8 + 4)
BUCKETS = {"BLOCK": 3, "LAYER": 8}  # BLOCK: two blocks and the root; LAYER: one per module owning parameters


@pytest.mark.parametrize(("kind", "bucketing", "case", "checkpointed", "bf16"), ACCUMULATION)
def test_accumulated_micro_batches_train_like_one_process_on_the_whole_batch(kind, bucketing, case, checkpointed, bf16):
    for r in _run():
        a = r[("accumulation", kind, bucketing, case, checkpointed, bf16)]
        _close(a["grads"], a["ref_grads"], "bf16-true" if bf16 else None)
        _close(a["params"], a["ref_params"], "bf16-true" if bf16 else None)  # after 2 windows of MICRO micro-batches
        assert a["grads_while_accumulating_are_none"] is True


@pytest.mark.parametrize(("kind", "bucketing", "case", "checkpointed", "bf16"), ACCUMULATION)
def test_an_accumulating_backward_reduces_nothing_and_the_last_one_reduces_each_bucket_once(
    kind, bucketing, case, checkpointed, bf16
):
    a = _run()[0][("accumulation", kind, bucketing, case, checkpointed, bf16)]
    n = BUCKETS[bucketing]
    acc, sync = _by_trace(a["accumulating"]), _by_trace(a["synchronizing"])
    assert acc["forward"] == sync["forward"] == {"all_gather": n}
    if kind == "fsdp-zero2":
        assert "backward" not in acc  # the ledger of an accumulating backward: no collective at all
    else:  # ZERO3 gathers the parameters again in backward (that is ZERO3), and still reduces nothing
        assert set(acc["backward"]) == {"all_gather"}
    assert sync["backward"]["reduce_scatter"] == n  # one per bucket, the accumulated micro-batches included
    kept = a["accumulating"].accumulated_gradients
    # Every sharded parameter's full gradient, in float32 (bf16 gradients are summed in the float32 reduce dtype).
    assert kept == {"buckets": n, "params": N_PARAMS, "bytes": 4 * PADDED_NUMEL}
    assert a["synchronizing"].accumulated_gradients["bytes"] == 0
    assert "kept for accumulation" in collective_changes(a["synchronizing"], a["accumulating"])
    assert MICRO > 1


def test_stepping_or_clipping_before_the_synchronizing_backward_is_refused():
    a = _run()[0][("accumulation", *ACCUMULATION[0])]
    pending = "are not yet reduced across ranks (inp.weight, inp.bias, blocks.0.norm.weight ...), so each rank would"
    for what, call in (("step", "`optimizer.step()`"), ("clip", "`fabric.clip_gradients`")):
        assert a["refusals"][what] == (
            f"{call} was called while gradients accumulated under `fabric.no_backward_sync` {pending} use its own"
            " partial sum. Run the last micro-batch's backward outside `no_backward_sync`"
            " (`fabric.no_backward_sync(model, enabled=not is_last_micro_batch)`), then clip and step."
        )


# -- mixed precision ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "precision", "reduce_dtype"), PRECISION)
def test_mixed_precision_trains_like_one_process_in_the_same_precision(kind, precision, reduce_dtype):
    for r in _run():
        p = r[("precision", kind, precision, reduce_dtype)]
        assert p["param_dtype"] == ("torch.bfloat16" if precision == "bf16-true" else "torch.float32")
        _close(p["grads"], p["ref_grads"], precision)
        _close(p["params"], p["ref_params"], precision)
        for got, ref in zip(p["losses"], p["ref_losses"], strict=True):
            assert abs(got - ref) <= UNITS * EPS[precision] * abs(ref)


@pytest.mark.parametrize(("kind", "precision", "reduce_dtype"), PRECISION)
def test_each_gradient_bucket_is_reduced_in_the_reduce_dtype(kind, precision, reduce_dtype):
    p = _run()[0][("precision", kind, precision, reduce_dtype)]
    grad_dtype = "bfloat16" if precision == "bf16-true" else "float32"
    expected = reduce_dtype or grad_dtype
    reductions = [e for e in ledger_from_bundle(p["bundle"]).collectives() if e.kind != "all_gather"]
    assert reductions and {e.dtype for e in reductions} == {expected}
    for e in reductions:  # the bytes a bucket sends are in the dtype it is reduced in
        assert e.bytes == (4 if expected == "float32" else 2) * _numel(e.shape)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
