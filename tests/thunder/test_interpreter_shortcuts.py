"""thunderviz's shortcuts through thunder's interpreter and passes (``thunder.jit.shortcuts``: global names, module
calls, decoded bytecode, exception frames, provenance records, dataclass flattening) give what thunder's own paths
give: the same prologue and traces, forward and backward, and the same values, for modules without hooks (the
shortcut), with a forward hook or a forward replaced on the instance (hooks: thunder's path), a module whose output is
a dataclass, a replaced global tensor read again at the next call, thunder's own error for a name defined nowhere with
the same traceback, and the same flattening of nested dataclasses met for the first time. One process, thunder's
default executors."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import re
import traceback

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


def calls_undefined(x: torch.Tensor) -> torch.Tensor:
    for _ in range(2):  # a loop that ends: StopIteration through thunder's iterator frames first
        x = x + 1
    return undefined_name(x)


@dataclasses.dataclass
class Output:
    """A model output as Hugging Face returns one: a dataclass holding tensors (and a None)."""

    loss: torch.Tensor
    logits: torch.Tensor
    extra: torch.Tensor | None = None


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
    out = _first(jitted(x))
    out.sum().backward()
    with torch.no_grad():
        eager = _first(net(x))
    return _texts(jitted), out.detach(), eager, net.blocks[0].fc.weight.grad


def dataclass_output(net: Net) -> None:
    inner = net.forward
    net.forward = lambda x: Output(inner(x).sum(), inner(x))


def _first(out: object) -> torch.Tensor:
    return out.logits if isinstance(out, Output) else out


@pytest.mark.parametrize("change", [plain, hooked, replaced_forward, dataclass_output])
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


def _places(e: BaseException) -> list[tuple[str, int, str]]:
    return [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(e.__traceback__)]


def test_an_error_has_the_traceback_thunder_gives_it() -> None:
    """The exception frames are kept per place and made without spinning: the same places, line by line, and the
    same frame for the same place at the next error."""
    shortcuts.install()
    raised = []
    for paths in (shortcuts.suspended(), contextlib.nullcontext(), contextlib.nullcontext()):
        with paths, pytest.raises(Exception, match="NOT_DEFINED_ANYWHERE") as info:
            thunder.jit(calls_undefined)(torch.ones(2))
        raised.append(info.value)
    theirs, ours, again = raised
    assert _places(ours) == _places(theirs)
    names = [p[2] for p in _places(ours)]
    assert names.index("calls_undefined") < names.index("undefined_name")

    def made(e: BaseException) -> list[object]:
        user = ("calls_undefined", "undefined_name")
        return [f for f, _ in traceback.walk_tb(e.__traceback__) if f.f_code.co_name in user]

    assert len(made(ours)) == 2 and made(again) == made(ours)  # the very frames: kept per place
    assert all(f.f_back is None or f.f_back.f_back is None for f in made(ours))  # nothing of the stack behind them


def _nested(tensors: list[torch.Tensor]) -> tuple[object, type, type]:
    """A tree with a dataclass inside a dataclass, of types no flattening has seen yet."""

    @dataclasses.dataclass
    class Inner:
        a: torch.Tensor
        n: int

    @dataclasses.dataclass
    class Outer:
        inner: Inner
        b: torch.Tensor | None

    tree = {"x": [Outer(Inner(tensors[0], 3), tensors[1]), None], "y": (tensors[2], Outer)}
    return tree, Inner, Outer


def test_nested_dataclasses_flatten_as_thunder_flattens_them() -> None:
    """Met for the first time, the outer dataclass is registered and flattened, the inner one stays a leaf (as
    thunder does it), and the second flattening opens both; a class as a leaf is never registered."""
    from thunder.core import pytree

    shortcuts.install()
    tensors = [torch.ones(1), torch.zeros(1), torch.full((1,), 2.0)]
    results = []
    for paths in (shortcuts.suspended(), contextlib.nullcontext()):
        tree, inner, outer = _nested(tensors)
        with paths:
            first = pytree.tree_flatten_with_dataclass(tree)
            second = pytree.tree_flatten_with_dataclass(tree)
        results.append((first, second, inner, outer, tree))
    for theirs, ours in zip(results[0][:2], results[1][:2], strict=True):
        assert [type(v).__name__ for v in ours[0]] == [type(v).__name__ for v in theirs[0]]
        assert [v for v in ours[0] if isinstance(v, torch.Tensor)] == [
            v for v in theirs[0] if isinstance(v, torch.Tensor)
        ]
        assert str(ours[1]) == str(theirs[1])
    for first, second, *_, tree in results:
        assert pytree.tree_unflatten(*first) == tree and pytree.tree_unflatten(*second) == tree
    first, second, inner, outer, _ = results[1]
    assert {inner, outer} <= pytree._registered_dataclasses
    assert len(second[0]) > len(first[0])  # the inner instances were leaves the first time


def test_provenance_records_check_and_fold_as_thunders() -> None:
    from thunder.core import interpreter

    shortcuts.install()
    record, inst = interpreter.ProvenanceRecord, interpreter.PseudoInst.CONSTANT
    leaves = [record(inst, []) for _ in range(3)]
    for leaf, flag in zip(leaves, (0b1011, 0b0110, 0b1110), strict=True):
        leaf.ext_flag = flag  # set after the record is made, as thunder's extensions do
    made = []
    for paths in (shortcuts.suspended(), contextlib.nullcontext()):
        with paths:
            made.append([record(inst, leaves[:n]) for n in range(4)])
            with pytest.raises(AssertionError):
                record(inst, [leaves[0], "not a record"])
            with pytest.raises(AssertionError, match="is not Instruction or PseudoInst"):
                record("LOAD_FAST", [])
    theirs, ours = made
    assert [(r.ext_flag, r.inputs) for r in ours] == [(r.ext_flag, r.inputs) for r in theirs]
    assert [r.ext_flag for r in ours] == [0, 0b1011, 0b0010, 0b0010]
    assert all(r.inputs is not leaves for r in ours)


def test_the_call_site_is_the_frame_inspect_stack_gives() -> None:
    """The interpreter's ``inspect.stack()`` makes each frame's record when read (thunder reads the call site at
    once): the same records."""
    ours, theirs = shortcuts._INSPECT.stack(), inspect.stack()
    assert len(ours) == len(theirs) > 3
    assert ours[1:] == theirs[1:]  # the callers, which have not moved since
    here, there = shortcuts._INSPECT.stack()[0], inspect.stack()[0]
    assert here[:4] == there[:4]  # this frame, read at once: the same line (two calls on it: other columns)


def _meta(a: int, b: int = 2, *rest: int, c: str = "c", **named: int) -> None:
    pass


def test_a_symbol_binds_its_arguments_as_thunder_binds_them() -> None:
    """Kept per meta function, while it lives; a meta that cannot be weakly referenced is bound afresh each time."""
    from thunder.core.symbol import Symbol

    shortcuts.install()
    calls = [((1,), {}), ((1, 5, 6, 7), {"c": "x", "d": 4}), ((), {"a": 3, "b": 4})]
    for meta in (_meta, len):
        symbol = Symbol(name="s", meta=meta)
        for args, kwargs in calls if meta is _meta else [(([1, 2],), {})]:
            with shortcuts.suspended():
                theirs = symbol.normalize(*args, **kwargs)
            assert symbol.normalize(*args, **kwargs) == theirs == symbol.normalize(*args, **kwargs)
    with pytest.raises(TypeError, match="missing a required argument"):
        Symbol(name="s", meta=_meta).normalize(b=1)


class _MakesAModuleInForward(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        head = torch.nn.Identity()  # as litgpt's GPT makes its clamp head each call
        return head(self.linear(x))


class _NotWalked(dict):
    """Dynamo's weak-key dict of modules, which thunder's dict tracking must not walk (a GC can shrink it mid-walk)."""

    def items(self):
        raise AssertionError("thunder walked Dynamo's dict of every module made so far")


def test_dynamos_tag_of_a_module_made_in_forward_runs_as_python() -> None:
    from torch._dynamo.mutation_guard import GenerationTracker, install_generation_tagging_init

    shortcuts.install()
    install_generation_tagging_init()  # what any torch.compile in the process does
    model = _MakesAModuleInForward()
    jitted = thunder.jit(model)
    x = torch.randn(2, 4)
    tracked = GenerationTracker.generation_values
    original = tracked.values
    tracked.values = _NotWalked(original)
    try:
        torch.testing.assert_close(jitted(x), model(x))
    finally:
        original.update(tracked.values)
        tracked.values = original
