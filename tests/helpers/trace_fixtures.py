"""Small models jitted in this process, once per pytest session, for the single-process trace tests."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

EVIL = "<script>alert(1)</script>"


@dataclass
class Jitted:
    jitted: Any
    bundle: Any


@functools.lru_cache(maxsize=1)
def gpt() -> Jitted:
    """A 2-block GPT (d=32) through thunder.jit, one forward and backward."""
    import thunder

    from thunderviz.demos.models import TinyGPT, make_batch
    from thunderviz.thunder.capture.traces import capture

    torch.manual_seed(0)
    jm = thunder.jit(TinyGPT(vocab_size=64, block_size=16, d_model=32, n_layer=2, n_head=2))
    x, y = make_batch(batch=2, block_size=16, vocab_size=64)
    torch.nn.functional.cross_entropy(jm(x).flatten(0, 1), y.flatten()).backward()
    return Jitted(jm, capture(jm, "tiny-gpt"))


class EvilSource(nn.Module):
    """Markup in user code: on the source line thunder records for the ops of ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x)) * 2  # <script>alert(1)</script> "quoted" \N back\slash


@functools.lru_cache(maxsize=1)
def evil() -> Jitted:
    """Markup in the bundle name and in a source line. (thunder 0.2.6 cannot jit a module *named* like markup:
    its prologue puts the raw name into a Python identifier; ``hostile_bundle`` covers that case.)"""
    import thunder

    from thunderviz.thunder.capture.traces import capture

    jm = thunder.jit(EvilSource())
    jm(torch.randn(4, 8)).sum().backward()
    return Jitted(jm, capture(jm, EVIL))


def _mlp_loss(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(x @ w1)
    return (h @ w2).square().mean()


@functools.lru_cache(maxsize=1)
def function() -> Jitted:
    """A plain function (no module, so no parameter names) through thunder.jit."""
    import thunder

    from thunderviz.thunder.capture.traces import capture

    jf = thunder.jit(_mlp_loss)
    w1 = torch.randn(8, 16, requires_grad=True)
    w2 = torch.randn(16, 4, requires_grad=True)
    jf(torch.randn(4, 8), w1, w2).backward()
    return Jitted(jf, capture(jf))


def hostile_bundle(tmp_path: Any) -> Any:
    """A real capture saved to a file, then the file edited so its module is named like markup.

    thunder 0.2.6 itself cannot jit a module with such a name (its prologue puts the raw name into a Python
    identifier and fails with SyntaxError), but a trace file is input from elsewhere and may say anything.
    """
    import json

    from thunderviz.trace.attribution import assign_modules
    from thunderviz.trace.file import load, save

    b = evil().bundle
    path = save(b, tmp_path / "evil.json")
    doc = json.loads(path.read_text())
    for snap in [doc["bundles"][0]["forward"], doc["bundles"][0]["backward"]]:
        snap["param_names"] = {k: v.replace("proj", EVIL) for k, v in snap["param_names"].items()}
    path.write_text(json.dumps(doc))
    (loaded,) = load(path)
    assign_modules(loaded.forward, loaded.backward)
    return loaded
