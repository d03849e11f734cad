"""The step memory meter on CPU: it measures thunder's default executors, and refuses to report a number it cannot
measure (torch.compile's kernels run by thunder's torchcompile executor, which MemTracker cannot see into)."""

from __future__ import annotations

import thunder
import torch

from thunderviz.thunder.memory_meter import StepMemoryMeter


def _train(executors: list[str] | None) -> object:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    jitted = thunder.jit(model, executors=executors)
    opt = torch.optim.AdamW(model.parameters())
    meter = StepMemoryMeter([model]).start()
    for step in range(4):
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
