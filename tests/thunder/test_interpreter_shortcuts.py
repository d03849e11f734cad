"""thunderviz's shortcuts through thunder's interpreter (``thunder.jit.shortcuts``: global names, module calls) give
what thunder's own paths give: the same prologue and traces, forward and backward, and the same values, for modules
without hooks (the shortcut), with a forward hook or a forward replaced on the instance (hooks: thunder's path), a
replaced global tensor read again at the next call, and thunder's own error for a name defined nowhere. One process,
thunder's default executors."""

from __future__ import annotations

import contextlib
import math
import re

import pytest
import thunder
import torch

from thunderviz.thunder.jit import shortcuts

SCALE = torch.tensor([0.5, 2.0, 1.5, 1.0])  # a global tensor: the prologue must read it, not bake it in


def helper(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * SCALE


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return helper(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [block(x) for block in self.blocks]  # builtins (len, isinstance, sum) and globals
        assert isinstance(x, torch.Tensor) and len(parts) == 2
        return sum(parts) / math.sqrt(len(parts))


def undefined_name(x: torch.Tensor) -> torch.Tensor:
    return x * NOT_DEFINED_ANYWHERE  # noqa: F821


def plain(net: Net) -> None:
    pass


def hooked(net: Net) -> None:
    net.blocks[0].register_forward_hook(lambda module, args, out: out * 3)


def replaced_forward(net: Net) -> None:
    block = net.blocks[1]
    inner = block.forward
    block.forward = lambda x: inner(x) + 1


def _texts(jitted) -> list[str]:
    traces = [
        thunder.last_prologue_traces(jitted)[-1],
        thunder.last_traces(jitted)[0],
        thunder.last_traces(jitted)[-1],
        thunder.last_backward_traces(jitted)[-1],
    ]
    return [re.sub(r"# Constructed by.*|at 0x[0-9a-f]+", "", str(t)) for t in traces]


def _run(change, x: torch.Tensor) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    net = Net()
    change(net)
    jitted = thunder.jit(net)
    out = jitted(x)
    out.sum().backward()
    with torch.no_grad():
        eager = net(x)
    return _texts(jitted), out.detach(), eager, net.blocks[0].fc.weight.grad


@pytest.mark.parametrize("change", [plain, hooked, replaced_forward])
def test_same_traces_and_values_as_thunders_own_paths(change):
    shortcuts.install()
    assert shortcuts.installed()
    x = torch.randn(3, 4)
    with shortcuts.suspended():
        theirs = _run(change, x)
    ours = _run(change, x)
    assert ours[0] == theirs[0]
    torch.testing.assert_close(ours[1], ours[2])  # what eager computes, the hook or the new forward included
    for a, b in zip(ours[1:], theirs[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_replaced_global_tensor_is_read_at_the_next_call(monkeypatch):
    shortcuts.install()
    jitted = thunder.jit(helper)
    x = torch.ones(4)
    torch.testing.assert_close(jitted(x), torch.tanh(x) * SCALE)
    monkeypatch.setitem(globals(), "SCALE", torch.tensor([3.0, 3.0, 3.0, 3.0]))
    torch.testing.assert_close(jitted(x), torch.tanh(x) * 3.0)


@pytest.mark.parametrize("suspended", [True, False])
def test_a_name_defined_nowhere_fails_as_thunder_fails(suspended):
    shortcuts.install()
    paths = shortcuts.suspended() if suspended else contextlib.nullcontext()
    with paths, pytest.raises(Exception, match="NOT_DEFINED_ANYWHERE"):
        thunder.jit(undefined_name)(torch.ones(2))
