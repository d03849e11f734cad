"""Predicted against measured step memory: the groups both sides know, and which ones are off by more than 10%."""

from __future__ import annotations

import pytest

from thunderviz.trace.memory import CATEGORIES, MEASURED_GROUPS, MemoryEstimate, StepMemory, compare, group_of


def _estimate(**split: int) -> MemoryEstimate:
    breakdown = dict.fromkeys(CATEGORIES, 0) | {k.replace("_", " "): v for k, v in split.items()}
    groups = dict.fromkeys(MEASURED_GROUPS, 0)
    for category, n in breakdown.items():
        groups[group_of(category)] += n
    return MemoryEstimate(sum(breakdown.values()), breakdown, groups, "backward")


def test_breakdown_must_sum_to_the_peak() -> None:
    with pytest.raises(ValueError, match="sums to 3 bytes, not the peak 4"):
        MemoryEstimate(4, {"parameters": 3}, {}, "forward")


def test_round_trip_as_plain_data() -> None:
    e = _estimate(parameters=10, saved_activations=90)
    assert MemoryEstimate.from_dict(e.to_dict()) == e
    m = StepMemory(100, "memtracker", {"parameters": 10}, (2, 3))
    assert StepMemory.from_dict(m.to_dict()) == m


def test_within_tolerance_and_which_group_is_off() -> None:
    predicted = _estimate(parameters=1000, gradients=0, optimizer_state=2000, saved_activations=7000)
    close = StepMemory(
        10_050,
        "memtracker",
        {"parameters": 1000, "optimizer": 2000, "gradients": 0, "activations and temporaries": 7050},
    )
    cmp = compare(predicted, close)
    assert cmp.off() == [] and cmp.summary().startswith("within 10%")
    off = StepMemory(
        10_000,
        "memtracker",
        {"parameters": 1000, "optimizer": 1000, "gradients": 0, "activations and temporaries": 8000},
    )
    names = [g.group for g in compare(predicted, off).off()]
    assert names == ["optimizer", "activations and temporaries"]
    assert "optimizer: predicted" in compare(predicted, off).summary()


def test_total_only_from_cuda_and_nothing_measured() -> None:
    predicted = _estimate(parameters=100)
    cuda = compare(predicted, StepMemory(130, "cuda"))
    assert cuda.groups == () and [g.group for g in cuda.off()] == ["total"]
    assert compare(predicted, StepMemory(None, "memtracker", note="no step")) is None


def test_tiny_groups_are_not_flagged() -> None:
    predicted = _estimate(parameters=10_000, gradients=10)
    measured = StepMemory(
        10_000, "memtracker", {"parameters": 10_000, "gradients": 0, "optimizer": 0, "activations and temporaries": 0}
    )
    assert compare(predicted, measured).off() == []
