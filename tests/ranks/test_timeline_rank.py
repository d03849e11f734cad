"""``--timeline`` in the ranks layer without a pool: the rank side around a cell, and merging ranks for the report."""

from __future__ import annotations

import pytest
import torch

from thunderviz.cell.protocol import CellConfig, StrategySpec
from thunderviz.rank.timeline import (
    NO_STEP_PROBLEM,
    finish_cell_recording,
    merge_rank_timelines,
    profiler_active,
    start_cell_recording,
    stop_cell_recording,
)
from thunderviz.reports.run_report import RunReport
from thunderviz.timeline.model import NoTimelineError, RankTimeline, Region


def _train(steps: int) -> None:
    net = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(steps):
        net(torch.randn(2, 3)).sum().backward()
        opt.step()


def test_a_cell_that_raises_is_stopped_unwrapped_and_keeps_what_ran():
    import torch.distributed as dist

    before = dist.all_reduce
    rec, problems = start_cell_recording(2)
    assert problems == [] and profiler_active()
    assert dist.all_reduce is not before  # wrapped while the cell runs
    _train(2)
    assert stop_cell_recording(rec, failed=True) == []
    assert dist.all_reduce is before and not rec.recording and not profiler_active()
    out = finish_cell_recording(rec, failed=True)
    assert out["timeline_problems"] == []
    assert [s.step for s in out["timeline"].steps] == [2] and "raised" in out["timeline"].notes[-1]


def test_nothing_running_and_a_profiler_already_on_are_said():
    assert finish_cell_recording(None, failed=False) == {
        "timeline_problems": ["--timeline: no recording was running on this rank"]
    }
    with torch.profiler.profile():
        rec, problems = start_cell_recording(2)
    assert rec is None and "another torch.profiler is already recording" in problems[0]
    assert not profiler_active()


def test_an_unfinished_previous_recording_is_stopped_before_the_next():
    first, _ = start_cell_recording(2)
    second, problems = start_cell_recording(2, previous=first)
    assert problems == [] and not first.recording and second.recording
    stop_cell_recording(second, failed=False)
    assert not profiler_active()


def test_steps_must_be_a_positive_whole_number_in_the_config():
    from thunderviz.cell.failures import RankUsageError

    for bad in (0, -1, True, 1.5):
        with pytest.raises(RankUsageError, match="whole number >= 1"):
            CellConfig(strategy=None, timeline=True, steps=bad)
    assert CellConfig(strategy=None) == CellConfig(strategy=None, collect=True, timeline=False, steps=5)


def _rank(r: int, steps: bool = True) -> RankTimeline:
    return RankTimeline(rank=r, world_size=2, steps=[Region("step", 0.0, 10.0, 2)] if steps else [], aligned=True)


def test_a_rank_that_sent_nothing_is_named_and_the_others_still_shown():
    tl, problems = merge_rank_timelines({0: {"timeline": _rank(0)}}, world_size=2, failed={1: "died"})
    assert tl.rank_ids == [0] and any("no timeline from rank(s) [1]" in p for p in tl.problems)
    assert problems == ["rank 1 died while the timeline was recorded; it sent no timeline"]
    tl, problems = merge_rank_timelines({}, world_size=2)
    assert tl is None and "no rank returned a timeline" in problems[0]


def test_a_cell_without_a_step_says_what_a_step_is():
    tl, problems = merge_rank_timelines(
        {0: {"timeline": _rank(0, False)}, 1: {"timeline": _rank(1, False)}}, world_size=2
    )
    assert tl is not None and tl.steps == []
    assert problems == [NO_STEP_PROBLEM] and "optimizer's step()" in problems[0]


def test_the_report_holds_the_timeline_or_says_why_not():
    args = {"outputs": {}, "world_size": 2, "backend": "gloo", "strategy": StrategySpec("thunder_ddp"), "seconds": 1.0}
    plain = RunReport.from_ranks({0: {"rank": 0}, 1: {"rank": 1}}, **args)
    with pytest.raises(NoTimelineError, match="ran without --timeline; run it as %%thunder_fsdp --timeline"):
        plain.timeline  # noqa: B018
    assert "Timeline" not in plain.to_html()
    empty = RunReport.from_ranks({0: {"rank": 0, "timeline_problems": ["--timeline: boom"]}}, timeline=True, **args)
    with pytest.raises(NoTimelineError, match="no timeline was recorded: rank 0: --timeline: boom"):
        empty.timeline  # noqa: B018
    assert "No rank returned a timeline" in empty.to_html()
    full = RunReport.from_ranks(
        {0: {"rank": 0, "timeline": _rank(0)}, 1: {"rank": 1, "timeline": _rank(1)}}, timeline=True, **args
    )
    assert full.timeline.rank_ids == [0, 1] and full.timeline.name == "thunder_ddp"
    assert "<svg" in full.to_html()
