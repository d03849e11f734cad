"""``--timeline`` plumbing without a pool: the --steps check, the rank-side start/finish pair, merging ranks."""

from __future__ import annotations

import argparse

import pytest
import torch

from thunderviz.core.timeline import RankTimeline, Region
from thunderviz.notebook.timeline_cell import steps_arg, timeline_from_collected
from thunderviz.ranks.timeline_rank import finish_cell_recording, start_cell_recording


@pytest.mark.parametrize("text", ["0", "-3", "two", "1.5"])
def test_steps_must_be_a_positive_whole_number(text):
    with pytest.raises(argparse.ArgumentTypeError, match=rf"--steps {text}: need a whole number >= 1"):
        steps_arg(text)
    assert steps_arg("4") == 4


def test_rank_side_start_and_finish_around_a_cell_that_raises():
    import torch.distributed as dist

    before = dist.all_reduce
    rec = start_cell_recording(2)
    assert dist.all_reduce is not before  # wrapped while the cell runs
    net = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        net(torch.randn(2, 3)).sum().backward()
        opt.step()
    out = finish_cell_recording(rec, failed=True)
    assert dist.all_reduce is before and not rec.recording
    assert [s.step for s in out["timeline"].steps] == [2] and "raised" in out["timeline"].notes[-1]
    assert finish_cell_recording(None, failed=False) == {
        "timeline_problems": ["--timeline: no recording was running on this rank"]
    }


def _rank(r: int, steps: bool = True) -> RankTimeline:
    return RankTimeline(rank=r, world_size=2, steps=[Region("step", 0.0, 10.0, 2)] if steps else [], aligned=True)


def test_a_rank_that_sent_nothing_is_named_and_the_others_still_shown():
    tl, problems = timeline_from_collected({0: {"timeline": _rank(0)}}, world_size=2)
    assert tl.rank_ids == [0] and any("no timeline from rank(s) [1]" in p for p in tl.problems)
    assert problems == []
    tl, problems = timeline_from_collected({}, world_size=2)
    assert tl is None and "no rank returned a timeline" in problems[0]


def test_a_cell_without_a_step_says_what_a_step_is():
    tl, problems = timeline_from_collected(
        {0: {"timeline": _rank(0, False)}, 1: {"timeline": _rank(1, False)}}, world_size=2
    )
    assert tl is not None and tl.steps == []
    assert "ran no training step" in problems[0] and "optimizer's step()" in problems[0]
