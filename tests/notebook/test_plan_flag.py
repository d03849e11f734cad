"""``%%thunder_fsdp --plan NAME``: the report carries the plan's prediction for the cell's strategy and world size,
or says which candidate the plan lacks."""

from __future__ import annotations

from tests.helpers.plans import synthetic_plan
from thunderviz.cell.protocol import StrategySpec
from thunderviz.notebook.magics import _attach_prediction
from thunderviz.reports.run_report import RunReport
from thunderviz.trace.memory import StepMemory


def _report(world: int, spec: StrategySpec) -> RunReport:
    r = RunReport(world_size=world, backend="gloo", strategy=spec, seconds=1.0)
    r.step_memory = {rank: StepMemory(7100, "memtracker", steps=(2, 3)) for rank in range(world)}
    return r


def test_the_prediction_for_this_strategy_and_world_size_is_attached() -> None:
    plan = synthetic_plan({"ddp": 9000, "fsdp-zero3-block": 7000})
    report = _report(2, StrategySpec("thunder_fsdp_zero3"))
    _attach_prediction(report, plan, "plan", report.strategy)
    assert report.prediction_name == "fsdp-zero3-block x2" and report.prediction.peak_bytes == 7000
    cmp = report.memory_comparison()
    assert sorted(cmp) == [0, 1] and cmp[0].off() == []  # 7000 predicted, 7100 measured: within 10%
    html = report.to_html(standalone=False)
    assert "against the plan's fsdp-zero3-block x2" in html
    # The whole plan comes along, and the report draws every candidate, not only its own prediction
    assert report.plan is plan and "<text x='0' y='35'>ddp x2 \u2713</text>" in html


def test_a_candidate_the_plan_lacks_is_a_problem_not_a_failure() -> None:
    plan = synthetic_plan({"ddp": 9000})
    report = _report(4, StrategySpec("thunder_fsdp"))
    _attach_prediction(report, plan, "plan", report.strategy)
    assert report.prediction is None and report.memory_comparison() == {}
    assert report.problems == [
        "--plan plan: the plan has no fsdp-zero2-block on 4 ranks (it has ddp x2); plan it with"
        " thunderviz.plan(..., world_sizes=(4,))"
    ]
