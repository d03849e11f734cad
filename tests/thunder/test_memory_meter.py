"""The step memory meter on CPU: it measures thunder's default executors, and refuses to report a number it cannot
measure (torch.compile's kernels run by thunder's torchcompile executor, which MemTracker cannot see into)."""

from __future__ import annotations

import thunder
import torch

from thunderviz.thunder.memory.meter import StepMemoryMeter
from thunderviz.trace.memory import ACCOUNT, StepMemory


def _train(executors: list[str] | None, steps: int = 4, *, jit: bool = True, **meter: object) -> StepMemory:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    jitted = thunder.jit(model, executors=executors) if jit else model
    opt = torch.optim.AdamW(model.parameters())
    meter = StepMemoryMeter([model], **meter).start()
    for step in range(steps):
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(step))
        jitted(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return meter.stop()


def test_default_executors_are_measured_and_torchcompile_is_refused():
    measured = _train(None)
    assert measured.source == "memtracker" and measured.peak_bytes is not None and measured.peak_bytes > 0
    refused = _train(["torchcompile"])
    assert refused.peak_bytes is None
    assert "MemTracker cannot see inside them" in refused.note and "torchcompile executor" in refused.note


def test_steps_left_to_a_timeline_are_not_measured_and_the_note_says_why():
    """A cell recording a timeline leaves its steps to the profiler: the meter measures only after ``skip`` steps,
    in the account's five parts, and says why when the loop ended first (an eager model: the meter counts steps,
    whoever runs them)."""
    measured = _train(None, steps=5, jit=False, skip=3)
    assert measured.steps == (4, 5) and set(measured.account) == set(ACCOUNT)
    assert sum(measured.account.values()) == measured.peak_bytes
    none = _train(None, steps=5, jit=False, skip=5, skipped="the timeline records steps 1-5")
    assert none.peak_bytes is None and none.note == (
        "no step was measured: a step ends when an optimizer's step() returns, and the timeline records steps 1-5;"
        " run at least 6 optimizer steps"
    )
