"""Compile reuse for case 2 under a real strategy: a function the user jitted, taking two models set up
by ``ThunderFSDPStrategy(jit=False)``, re-run as a notebook cell re-runs (a new Fabric, new models, the same jitted
function), reuses the interpreted trace and trains exactly as a fresh compile: the same forward and backward traces,
the same buckets, each parameter's plan rebound to its own model, bit-identical loss and gradients.

One process on a 1-rank gloo group (the shards are whole, the collectives, plans and buckets real): what a second
rank would add is covered for cases 1 and 3 by test_compile_reuse_2rank.py. The two models are of one class, so
their parameters have the same names: only rebinding by model (not by name) keeps their buckets apart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
import thunder
import torch
import torch.distributed as dist
from torch import nn

from thunderviz.thunder import compile_state
from thunderviz.thunder.comm.comm_pass import comm_transform_of
from thunderviz.thunder.reuse import compile_reuse


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 6)
        self.fc2 = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def train_step(a: nn.Module, b: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (b(a(x)) ** 2).mean()


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A 1-rank gloo group for Fabric in this process, gone afterwards (with the variables Fabric set)."""
    saved = dict(os.environ)
    created = not dist.is_initialized()
    try:
        yield
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


def _cell(step: Any, **options: Any) -> dict[str, Any]:
    """What a re-run cell does: a new Fabric, two new models set up, one training step through ``step``."""
    from lightning.fabric import Fabric

    from thunderviz import ThunderFSDPStrategy

    fabric = Fabric(accelerator="cpu", devices=1, strategy=ThunderFSDPStrategy(jit=False, **options))
    fabric.launch()
    torch.manual_seed(0)
    a, b = fabric.setup_module(Pair()), fabric.setup_module(Pair())
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    compile_reuse.take_events()
    loss = step(a, b, x)
    fabric.backward(loss)
    (event,) = compile_reuse.take_events()  # what the cell report's compile line says
    fw, bw = thunder.last_traces(step)[-1], thunder.last_backward_traces(step)[-1]
    records = comm_transform_of(thunder.compile_data(step)).current.values()
    return {
        "event": event,
        "loss": loss.detach(),
        "grads": {f"{m}.{n}": p.grad.clone() for m, mod in (("a", a), ("b", b)) for n, p in mod.named_parameters()},
        "forward": _text(fw, a, b),
        "backward": _text(bw, a, b),
        "buckets": [(k.kind, k.label, tuple(k.params)) for t in (fw, bw) for k in compile_state.trace_buckets(t)],
        "owners_are_the_models": {r.config.owner_id for r in records} == {id(a.module), id(b.module)},
    }


def _text(trace: Any, a: nn.Module, b: nn.Module) -> str:
    """A trace's program as thunder prints it, less how long each pass took, the models it names (a gradient
    accumulator's key holds its model's id) named ``<a>`` and ``<b>``."""
    text = re.sub(r"\(took \d+ milliseconds\)", "", str(trace))
    return text.replace(str(id(a.module)), "<a>").replace(str(id(b.module)), "<b>")


def test_a_rerun_cell_reuses_the_trace_and_trains_as_a_fresh_compile(one_rank):
    step = thunder.jit(train_step)
    _cell(step)
    rerun = _cell(step)
    fresh = _cell(step, compile_reuse=False)
    # (the first cell reuses too when an earlier test left the entry)
    assert rerun["event"].startswith("reused an earlier set-up's trace"), rerun["event"]
    assert fresh["event"].startswith("interpreted") and fresh["event"].endswith("(compile reuse is off)")
    assert rerun["owners_are_the_models"] and fresh["owners_are_the_models"]
    assert len(rerun["buckets"]) == len(fresh["buckets"]) > 0
    for part in ("forward", "backward", "buckets"):
        assert rerun[part] == fresh[part], part
    assert torch.equal(rerun["loss"], fresh["loss"])
    for name, g in fresh["grads"].items():
        assert torch.equal(rerun["grads"][name], g), name
