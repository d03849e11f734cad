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


def test_within_tolerance_and_which_part_is_off() -> None:
    """Like with like: predicted and measured in the same parts of the account (the total and each part holding 5% of
    the peak or more); MemTracker's own groups are not what is compared."""
    predicted = _estimate(parameters=1000, gradients=0, optimizer_state=2000, saved_activations=7000)
    parts = {
        "parameters": 1000,
        "gradients": 0,
        "optimizer state": 2000,
        "saved for backward": 6950,
        "temporaries": 100,
    }
    close = StepMemory(10_050, "memtracker", {"parameters": 1000}, parts=parts)
    cmp = compare(predicted, close)
    assert cmp.off() == [] and cmp.summary().startswith(
        "within 10% (total and parameters, optimizer state, saved for backward): predicted"
    )
    # the same total, split otherwise: the parts say where
    parts = {
        "parameters": 1000,
        "gradients": 0,
        "optimizer state": 1000,
        "saved for backward": 6000,
        "temporaries": 2000,
    }
    off = StepMemory(10_000, "memtracker", {"parameters": 1000}, parts=parts)
    names = [g.group for g in compare(predicted, off).off()]
    assert names == ["optimizer state", "saved for backward", "temporaries"]
    assert "optimizer state: predicted" in compare(predicted, off).summary()


def test_a_prediction_puts_what_a_measurement_cannot_tell_apart_in_one_part() -> None:
    """Communication buffers and gathered parameters are temporaries in the account on both sides (MemTracker cannot
    tell them apart), and what autograd saved is saved for backward whatever it was."""
    e = _estimate(parameters=10, gathered_parameters=20, communication_buffers=30, inputs=5, saved_activations=40)
    assert e.account == {
        "parameters": 10,
        "gradients": 0,
        "optimizer state": 0,
        "saved for backward": 40,
        "temporaries": 55,
    }


def test_total_only_from_cuda_and_nothing_measured() -> None:
    predicted = _estimate(parameters=100)
    cuda = compare(predicted, StepMemory(130, "cuda"))
    assert cuda.groups == () and [g.group for g in cuda.off()] == ["total"]
    assert compare(predicted, StepMemory(None, "memtracker", note="no step")) is None


def test_parts_under_five_percent_of_the_peak_are_not_flagged() -> None:
    predicted = _estimate(parameters=10_000, gradients=400)
    measured = StepMemory(10_000, "memtracker", {"parameters": 10_000}, parts={"parameters": 10_000})
    assert compare(predicted, measured).off() == []  # 400 B of gradients: 4% of the peak
    predicted = _estimate(parameters=10_000, gradients=600)
    assert [g.group for g in compare(predicted, measured).off()] == ["gradients"]
