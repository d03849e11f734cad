"""``ThunderAutoStrategy`` on one CPU rank with a given plan: it becomes the candidate that fits with the least
communication, logs why, and when nothing fits says the smallest per-rank memory that would work.

The scenarios run in one fresh rank process (``run_ranks``): a launched Fabric leaves a process group and
environment variables behind, which must not leak into this test session.
"""

from __future__ import annotations

import functools
from typing import Any

from thunderviz.pool.spawn import run_ranks

PEAKS = {"ddp": 9000, "fsdp-zero2-block": 7000, "fsdp-zero2-layer": 6900, "fsdp-zero3-block": 5000}
#: (bytes, collectives) per step, litgpt-gpt2's at world 2: ZERO2-LAYER sends fewer bytes in more collectives
COMM = {
    "ddp": (531_456, 1),
    "fsdp-zero2-block": (531_456, 6),
    "fsdp-zero2-layer": (531_456, 30),
    "fsdp-zero3-block": (761_472, 9),
}


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _scenarios(rank: int, world: int) -> dict[str, Any]:
    import torch
    from lightning.fabric import Fabric

    from tests.helpers.plans import synthetic_plan
    from thunderviz import ThunderAutoStrategy, ThunderDDPStrategy, ThunderFSDPStrategy

    def fabric(strategy: Any) -> Fabric:
        f = Fabric(accelerator="cpu", devices=1, strategy=strategy)
        f.launch()
        return f

    chosen = ThunderAutoStrategy("6KiB", plan=synthetic_plan(PEAKS, world_size=1))
    f = fabric(chosen)
    model = f.setup(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)))
    f.backward(model(torch.randn(3, 4)).sum())  # the chosen strategy trains
    too_small = ThunderAutoStrategy(4000, plan=synthetic_plan(PEAKS, world_size=1))
    by_time = ThunderAutoStrategy(6950, plan=synthetic_plan(PEAKS, world_size=1, comm=COMM))
    fabric(by_time).setup(torch.nn.Linear(4, 4))
    out = {
        "is_fsdp": isinstance(chosen, ThunderFSDPStrategy),
        "is_ddp": isinstance(chosen, ThunderDDPStrategy),
        "summary": chosen.options.summary(),
        "chosen": chosen.chosen.name,
        "reason": chosen.decisions[-1].reason,
        "too_small": _error(lambda: fabric(too_small).setup(torch.nn.Linear(4, 4))),
        "too_small_action": str(too_small.decisions[-1].action),
        "no_budget": _error(lambda: fabric(ThunderAutoStrategy()).setup(torch.nn.Linear(4, 4))),
        "no_batch": _error(lambda: fabric(ThunderAutoStrategy("1GiB")).setup(torch.nn.Linear(4, 4))),
        "bad_budget": _error(lambda: ThunderAutoStrategy("lots")),
        "by_time": by_time.chosen.name,
        "by_time_reason": by_time.decisions[-1].reason,
    }
    return out


@functools.cache
def _results() -> dict[str, Any]:
    return run_ranks(_scenarios, nproc=1, timeout=600)[0]


def test_becomes_the_chosen_strategy_and_says_why() -> None:
    r = _results()
    assert r["is_fsdp"] and not r["is_ddp"] and r["summary"] == "FSDP ZERO3 BLOCK" and r["chosen"] == "fsdp-zero3-block"
    assert r["reason"].startswith("thunder_auto chose fsdp-zero3-block on 1 ranks")
    assert "ddp predicted 8.8 KiB, does not fit" in r["reason"] and "a plain nn.Module" in r["reason"]


def test_nothing_fits_names_the_smallest_budget_that_would() -> None:
    r = _results()
    assert r["too_small"].startswith("PlanError: ThunderAutoStrategy(memory_per_rank=3.9 KiB): no strategy fits")
    assert "smallest predicted per-rank peak is fsdp-zero3-block's, 4.9 KiB (5000 bytes)" in r["too_small"]
    assert r["too_small_action"] == "error"


def test_needs_a_budget_on_cpu_and_a_batch_or_plan() -> None:
    r = _results()
    assert "needs the memory each rank may use" in r["no_budget"]
    assert "needs one rank's example batch" in r["no_batch"]
    assert r["bad_budget"].startswith("PlanError: ThunderAutoStrategy: memory_per_rank='lots'")


def test_chooses_by_predicted_time_not_bytes() -> None:
    """ZERO2-LAYER and ZERO3-BLOCK both fit: ZERO3-BLOCK sends more bytes, but in 9 collectives against 30, which on
    the CPU link (gloo) takes less time; the reason says what the one left out would have cost."""
    r = _results()
    assert r["by_time"] == "fsdp-zero3-block"
    assert "fsdp-zero2-layer fits but communicates ~9.8 ms" in r["by_time_reason"]
    assert "(~3.8 ms on the cpu link)" in r["by_time_reason"]


def test_predicting_stops_only_where_no_later_candidate_can_be_faster() -> None:
    from tests.helpers.plans import synthetic_plan
    from thunderviz.strategies.auto import settled

    plan = synthetic_plan(dict.fromkeys(("ddp", "fsdp-zero2-block", "fsdp-zero2-layer", "fsdp-zero3-block"), 1))
    assert [settled(c) for c in plan.candidates] == [True, True, False, True]


def test_plans_with_the_optimizer_handed_to_setup_adamw_included() -> None:
    """Without ``optimizer=``, the rehearsal builds the class handed to ``fabric.setup`` with its settings. torch's
    ``AdamW`` keeps a setting in ``defaults`` that its ``__init__`` refuses (``decoupled_weight_decay``): the plan
    must still get an AdamW with the user's settings, not a TypeError at ``fabric.setup``."""
    import torch

    from thunderviz import ThunderAutoStrategy

    param = torch.nn.Parameter(torch.zeros(2))
    for opt in (
        torch.optim.AdamW([param], lr=3e-4, betas=(0.8, 0.95), weight_decay=0.05),
        torch.optim.SGD([param], lr=0.1, momentum=0.9),
    ):
        made = ThunderAutoStrategy("1GiB")._optimizer_for_plan([opt])([torch.nn.Parameter(torch.zeros(2))])
        assert type(made) is type(opt) and made.defaults == opt.defaults
