"""Compile reuse under the strategies, on 2 gloo ranks: a re-run and a ZERO2 BLOCK -> ZERO3 LAYER switch reuse the
interpreted trace, and train exactly as a fresh compile does: the same ops in the same order, forward and backward,
the same buckets, bit-identical losses and parameters after two AdamW steps.

Case 1 (the strategy jits) and case 3 (the user jitted, the strategy distributes in place); case 2 (a function the
user jitted) is tests/strategies/test_compile_reuse_case2.py, on one rank. The staleness cases (a changed class,
helper, attribute, parameter, input, submodule, forward, executor) are tests/thunder/test_compile_reuse.py, one
process; here what only ranks have: process groups, shards, plans.

About 50-110 s on 2 shared cores (150-165 s with six fresh compiles), in the module fixture: the fresh compiles that the
reused ones are compared with are the point of the test, and each is a full thunder interpretation; the first set-up of
each strategy is one of them (four, not six: turning reuse off by the strategy's option is checked on case 3 here, and
on case 1 by tests/ranks/test_engine.py).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch

from tests.helpers.rank_pool import run_on_pool

# (label, strategy kind, sharding, reuse on): off by the process switch, or (None) by the strategy's option. The first
# set-up of each strategy compiles (the model is unique to this sequence, see ``reuse_sequence``), so it is the fresh
# compile its re-run is compared with; ZERO3 after ZERO2 and case 3 after case 1 reuse a trace of another set-up, so
# they get a fresh compile of their own.
SEQUENCE = [
    ("zero2", "fsdp", "ZERO2", True),
    # ZERO3 LAYER after ZERO2 BLOCK: both the sharding and the bucketing switch (one interpreted trace; the replayed
    # plan sets ZERO3's regathering, the communication pass lays out LAYER's buckets)
    ("zero3 reused", "fsdp", "ZERO3", True),
    ("zero3 fresh", "fsdp", "ZERO3", False),
    ("zero2 reused", "fsdp", "ZERO2", True),
    ("ddp", "ddp", None, True),
    ("ddp reused", "ddp", None, True),
    # case 3: the user jitted the module, the strategy distributes it in place
    ("case 3 reused", "fsdp", "ZERO3", True),
    ("case 3 fresh", "fsdp", "ZERO3", None),
]
#: (reused, fresh): the pairs that must train alike
PAIRS = [
    ("zero3 reused", "zero3 fresh"),
    ("zero2 reused", "zero2"),
    ("ddp reused", "ddp"),
    ("case 3 reused", "case 3 fresh"),
]


def reuse_sequence(rank: int, world: int) -> list[dict[str, Any]]:
    import thunder

    from tests.strategies import common
    from thunderviz.demos.models import TinyGPT, make_batch
    from thunderviz.thunder import compile_state
    from thunderviz.thunder.reuse import compile_reuse

    out = []
    sequence_id = time.time_ns()  # unique to this call (each rank keeps its own traces)
    saved = os.environ.get(compile_reuse.ENV_VARIABLE)
    try:
        for label, kind, sharding, reuse in SEQUENCE:
            os.environ[compile_reuse.ENV_VARIABLE] = "0" if reuse is False else "1"
            options = {"sharding_strategy": sharding} if sharding else {}
            if label.startswith("zero3"):
                options["bucketing_strategy"] = "LAYER"
            fabric = common.fabric(kind, **options, **({"compile_reuse": False} if reuse is None else {}))
            torch.manual_seed(0)
            built = TinyGPT(n_layer=2, d_model=32, n_head=2, block_size=16, vocab_size=64)
            # A plain attribute is part of the reuse key: no trace an earlier job of the shared rank pair left
            # (another file's TinyGPT) is reused here, so each strategy's first set-up is a fresh compile.
            built.sequence_id = sequence_id
            model = fabric.setup(thunder.jit(built) if label.startswith("case 3") else built)
            opt = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-2))
            before = compile_reuse.stats()
            losses = []
            for step in range(2):
                x, y = make_batch(batch=2, block_size=16, vocab_size=64, seed=step * world + rank)
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                fabric.backward(loss)
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            after = compile_reuse.stats()
            traced = model._forward_module
            fw, bw = thunder.last_traces(traced)[-1], thunder.last_backward_traces(traced)[-1]
            out.append(
                {
                    "label": label,
                    "did": "reused" if after.hits > before.hits else "compiled",
                    "losses": losses,
                    "params": common.full_params(model),
                    "forward": [b.sym.name for b in fw.bound_symbols],
                    "backward": [b.sym.name for b in bw.bound_symbols],
                    "buckets": [
                        (b.kind, b.label, tuple(b.params)) for t in (fw, bw) for b in compile_state.trace_buckets(t)
                    ],
                }
            )
    finally:
        if saved is None:
            os.environ.pop(compile_reuse.ENV_VARIABLE, None)
        else:
            os.environ[compile_reuse.ENV_VARIABLE] = saved
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, dict[str, Any]]]:
    return [{r["label"]: r for r in per_rank} for per_rank in run_on_pool(reuse_sequence, timeout=600)]


@pytest.mark.parametrize(("reused", "fresh"), PAIRS)
def test_a_reused_trace_trains_exactly_as_a_fresh_compile(runs, reused, fresh):
    for by_label in runs:
        a, b = by_label[reused], by_label[fresh]
        assert a["did"] == "reused" and b["did"] == "compiled"
        assert a["forward"] == b["forward"] and a["backward"] == b["backward"]
        assert a["buckets"] == b["buckets"] and a["buckets"]
        assert all(torch.equal(x, y) for x, y in zip(a["losses"], b["losses"], strict=True)), (a["losses"], b["losses"])
        for name, value in b["params"].items():
            assert torch.equal(a["params"][name], value), name


def test_zero3_from_a_zero2_trace_regathers_in_backward(runs):
    """The switch is the case where the replayed plan changes the trace: ZERO3's backward gathers again, ZERO2's
    does not, from one interpreted trace."""
    for by_label in runs:
        assert "all_gather" in by_label["zero3 reused"]["backward"] or any(
            "all_gather" in op for op in by_label["zero3 reused"]["backward"]
        )
        assert not any("all_gather" in op for op in by_label["zero2 reused"]["backward"])
