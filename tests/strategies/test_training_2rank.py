"""Fabric + thunder strategies on 2 real gloo ranks, against single-process eager PyTorch.

Scenarios run on the session's one pair of rank processes (``tests/helpers/rank_pool.py``: no interpreter start or
new process group per file), in one job shared by the file's tests; each scenario is then asserted as its own test.
The training runs are a covering design, not the product of kinds x cases x models (45 set-ups): every pair of a
kind, a case and a model runs (``SCENARIOS``); ``test_comm_2rank`` runs the cases again for every bucketing on a model
with all three models' traits. Gradient clipping and meta-device init run for ZERO2 and DDP (they act on the shards,
which ZERO3 shares with ZERO2), each kind with every clipping and meta init in every case (``EXTRA``).

About 95 s alone on 2 shared cores (190 s for the 71 set-ups it ran before), in the first test: one job runs all 28
set-ups (15 of the design, 13 of clipping and meta init).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.rank_pool import run_on_pool
from tests.strategies.common import SharedRun, run_many, two_models_results
from tests.strategies.scenarios import features, train

KINDS = {"fsdp-zero2": ("fsdp", "ZERO2"), "fsdp-zero3": ("fsdp", "ZERO3"), "ddp": ("ddp", "ZERO2")}
CASES = ["raw", "jitted", "jitted_ran", "function", "function_jit_before_setup"]
MODELS = ["mlp", "embed_norm", "tied"]
#: (kind, case, model): a covering design of the 45 combinations. Every case meets every kind and every model, and
#: every model every kind. Placed so that set-ups share thunder's interpretation through compile reuse (the cost of a
#: set-up): ZERO2 and ZERO3 interpret to the same trace, case 3 reuses case 1's, and a function jitted before setup
#: reuses the function case's once set up (its own cost is the unsharded compile before setup, as "jitted_ran"'s).
SCENARIOS = [
    # cases 1 and 3: a Latin square, the kind of case i and model j is kind (i + j) mod 3
    *((list(KINDS)[(i + j) % 3], case, model) for i, case in enumerate(CASES[:3]) for j, model in enumerate(MODELS)),
    # case 2: each model under one family (DDP, or ZERO2 and ZERO3), so both of its rows share a trace
    ("ddp", "function", "mlp"),
    ("fsdp-zero2", "function", "embed_norm"),
    ("fsdp-zero3", "function", "tied"),
    ("ddp", "function_jit_before_setup", "mlp"),
    ("fsdp-zero3", "function_jit_before_setup", "embed_norm"),
    ("fsdp-zero2", "function_jit_before_setup", "tied"),
]
#: (kind, case, model, clip, meta): clipping (2-norm, inf-norm, by value) and meta-device init, for ZERO2 and DDP.
#: Each kind clips with every norm and by value (in cases 1, 2 and 3 between them; the inf-norm, a max across ranks
#: instead of a sum, in case 1 for both) and builds on meta in every case and for every model. Each row reuses the
#: trace of a row above (clipping and init are outside the trace).
EXTRA = [
    ("fsdp-zero2", "raw", "mlp", None, True),
    ("fsdp-zero2", "raw", "tied", None, True),
    ("fsdp-zero2", "function", "embed_norm", None, True),
    ("fsdp-zero2", "raw", "mlp", "norm2", True),
    ("fsdp-zero2", "raw", "embed_norm", "inf", False),
    ("fsdp-zero2", "jitted", "embed_norm", "value", True),
    ("fsdp-zero2", "function", "tied", "value", False),
    ("ddp", "raw", "embed_norm", None, True),
    ("ddp", "jitted", "tied", None, True),
    ("ddp", "raw", "embed_norm", "inf", False),
    ("ddp", "raw", "mlp", "value", False),
    ("ddp", "jitted", "mlp", "norm2", False),
    ("ddp", "function", "mlp", "norm2", True),
]


def _scenario_args(kind: str, case: str, model: str, clip: str | None = None, meta: bool = False) -> tuple:
    strategy, sharding = KINDS[kind]
    if case == "function_jit_before_setup":
        return (strategy, "function", model, sharding, True, clip, meta)
    return (strategy, case, model, sharding, False, clip, meta)


#: Every training run, one job: the first test pays for it.
_shared = SharedRun(run_many, train, [_scenario_args(*s) for s in SCENARIOS + EXTRA], timeout=1500)
pytestmark = pytest.mark.timeout(1600)  # pytest's default 600 s would cut that first test short on a loaded machine


def _results(scenario: tuple) -> list[dict]:
    """One run's results by rank."""
    index = (SCENARIOS + EXTRA).index(scenario)
    return [per_rank[index] for per_rank in _shared()]


def _assert_matches_reference(r: dict) -> None:
    ref = r["ref"]
    torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref["losses"]))
    assert r["grads"].keys() == ref["grads"].keys()
    for name in ref["grads"]:
        torch.testing.assert_close(r["grads"][name], ref["grads"][name], msg=f"grad of {name}")
    for name in ref["params"]:
        torch.testing.assert_close(r["params"][name], ref["params"][name], msg=f"{name} after 3 steps")


@pytest.mark.parametrize(("kind", "case", "model"), SCENARIOS)
def test_matches_single_process_eager(kind, case, model):
    per_rank = _results((kind, case, model))
    for rank_result in per_rank:
        _assert_matches_reference(rank_result)

    r0 = per_rank[0]
    strategy, _ = KINDS[kind]
    n_unique = len(r0["local_shapes"])
    if strategy == "fsdp":
        # The default BLOCK bucketing: these models have no list of blocks, so all n_unique parameters (a tied
        # weight counted once) share the root bucket: one all_gather forward, one reduce_scatter backward, and
        # under ZERO3 one all_gather again in backward. Buckets themselves are tested in test_comm_2rank.
        assert n_unique >= 2
        assert r0["forward_collectives"] == {"all_gather": 1, "wait": 1}
        again = 1 if kind == "fsdp-zero3" else 0
        assert r0["backward_collectives"] == {
            "reduce_scatter": 1,
            "wait": 1 + again,
            **({"all_gather": 1} if again else {}),
        }
        assert all(shape[0] * 2 >= 1 for shape in r0["local_shapes"].values())
    else:
        assert "all_gather" not in r0["forward_collectives"]
        assert r0["backward_collectives"] == {
            "all_reduce": 1,
            "wait": 1,
        }  # one bucket: these gradients fit in the first (1 MB)
    decision = r0["decisions"][-1]
    expected_case = {
        "raw": "case 1: raw module",
        "jitted": "case 3: module already jitted by the user",
        "jitted_ran": "case 3: module already jitted by the user",
        "function": "case 2: module used inside a jitted function",
        "function_jit_before_setup": "case 2: module used inside a jitted function",
    }[case]
    assert decision["case"] == expected_case
    if case == "jitted_ran":
        assert "clear its 1 cached trace(s)" in decision["reason"]
    if kind == "fsdp-zero3":
        assert "ZERO3: backward gathers each bucket again from its shards" in decision["reason"]


def test_fsdp_shards_really_are_local():
    """Each rank holds half of every parameter (padded), not a full copy."""
    r0 = _results(("fsdp-zero2", "raw", "mlp"))[0]
    assert r0["local_shapes"] == {"fc1.weight": (4, 6), "fc1.bias": (4,), "fc2.weight": (1, 7), "fc2.bias": (1,)}


_features: dict[str, list[dict]] = {}


@pytest.fixture(scope="module")
def feature_results(tmp_path_factory):
    def get(kind: str) -> list[dict]:
        if kind not in _features:
            _features[kind] = run_on_pool(features, kind, str(tmp_path_factory.mktemp(kind)), timeout=900)
        return _features[kind]

    return get


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_fabric_collectives(feature_results, kind):
    for r in feature_results(kind):
        assert r["collectives"] == {"sum": 3.0, "mean": 1.5, "broadcast": {"from": 0}, "gathered": [0, 1]}


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_checkpoint_roundtrip_with_joint_setup(feature_results, kind, state_dict_type):
    for r in feature_results(kind):
        c = r[f"checkpoint_{state_dict_type}"]
        assert c["remainder"] == {"step": 2}
        for name in c["saved"]:
            torch.testing.assert_close(c["loaded"][name], c["saved"][name], msg=f"{name} loaded")
            # Same next step after loading means the optimizer's momentum came back too.
            torch.testing.assert_close(c["after"][name], c["expected"][name], msg=f"{name} after resuming")
    r0 = feature_results(kind)[0][f"checkpoint_{state_dict_type}"]
    if state_dict_type == "full":
        assert r0["file_shapes"] == {"fc1.weight": (7, 6), "fc1.bias": (7,), "fc2.weight": (1, 7), "fc2.bias": (1,)}


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
@pytest.mark.parametrize("case", ["raw", "function"])
def test_frozen_parameters_and_no_backward_sync(feature_results, kind, case):
    for r in feature_results(kind):
        f = r[f"frozen_{case}"]
        assert f["grad_is_none"] == {"body.weight": False, "body.bias": False, "head.weight": True, "head.bias": True}
        assert f["got"].keys() == f["expected"].keys() == {"body.weight", "body.bias"}
        for name in f["expected"]:
            torch.testing.assert_close(f["got"][name], f["expected"][name], msg=name)
        for name in f["head_before"]:
            torch.testing.assert_close(f["head_after"][name], f["head_before"][name], msg=f"frozen {name} moved")
        if kind == "ddp":  # the first backward ran under no_backward_sync
            assert f["accumulating_buckets"] == {"forward": 0, "backward": 0}  # no all_reduce at all inside the block
            assert [b["kind"] for b in f["synced_buckets"]["backward"]] == ["all_reduce"]


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_function_taking_two_set_up_models(kind):
    r0 = two_models_results()[kind][0]
    for name in r0["expected"]:
        torch.testing.assert_close(r0["got"][name], r0["expected"][name], msg=name)
    # One bucket per set-up model (BLOCK's root bucket for FSDP, one bucket for DDP): never one across both.
    if kind == "fsdp":
        assert r0["forward_collectives"] == {"all_gather": 2, "wait": 2}
        assert r0["backward_collectives"] == {"reduce_scatter": 2, "wait": 2}
    else:
        assert r0["backward_collectives"] == {"all_reduce": 2, "wait": 2}


@pytest.mark.parametrize(("kind", "case", "model", "clip", "meta"), EXTRA)
def test_clipping_and_meta_init_match_one_process(kind, case, model, clip, meta):
    """``fabric.clip_gradients`` clips by the global norm (returned, equal on every rank) as torch does on one
    process; a model built under ``init_module(empty_init=True)`` stays on meta until setup and trains like the same
    ``reset_parameters()`` calls made on one process with rank 0's seed."""
    for r in _results((kind, case, model, clip, meta)):
        assert r["on_meta_before_setup"] is meta
        _assert_matches_reference(r)
        if clip is None or clip == "value":
            assert r["norms"] == [None] * len(r["norms"])
        else:
            torch.testing.assert_close(torch.tensor(r["norms"]), torch.tensor(r["ref"]["norms"]), msg="global norm")
            assert all(n > 0.05 for n in r["norms"]), "clipping never engaged"


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_optimizer_built_on_meta_parameters_follows_them_through_joint_setup(feature_results, kind):
    for r in feature_results(kind):
        m = r["meta_joint_setup"]
        assert m["optimizer_params_are_model_params"] is True
        for name, value in m["expected"].items():
            torch.testing.assert_close(m["got"][name], value, msg=name)


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_jit_keywords_for_an_already_jitted_module_are_refused_and_logged(feature_results, kind):
    name = "ThunderFSDPStrategy" if kind == "fsdp" else "ThunderDDPStrategy"
    message = (
        f"You passed thunder.jit arguments (disable_torch_autograd=...) to {name}, but the MLP you set up is already"
        " jitted, so the strategy never calls `thunder.jit` and they would be silently ignored. Pass them to your own"
        " `thunder.jit(model, ...)` call, or hand `fabric.setup` the plain module."
    )
    for r in feature_results(kind):
        assert r["refused_jit_kwargs"]["message"] == message
        assert r["refused_jit_kwargs"]["decision"] == {
            "target": "MLP",
            "case": "not possible",
            "action": "error",
            "reason": message,
            "clear_cache": False,
            "strategy": "FSDP ZERO2 BLOCK" if kind == "fsdp" else "DDP 25 MB buckets",
            # the one-line headline of a refusal: its first sentence
            "headline": "error: " + message.split(". ")[0],
        }
