"""Compile reuse: a marked module with the same code, state and inputs reuses thunder's initial trace, and
every change the issue lists compiles afresh.

Each "cell" runs in one namespace, as a notebook's cells share ``__main__``: a class or helper redefined there is
what a user re-running an edited cell produces. Every case checks the numbers against eager on the *current* model
(a stale trace would compute the old model) and the reuse counters; one process, thunder's default executors.
"""

from __future__ import annotations

import re
import types

import pytest
import thunder
import torch

from thunderviz.thunder.reuse import compile_reuse

CELL = """
import torch

def act(x):
    return torch.tanh(x)

class Net(torch.nn.Module):
    def __init__(self, d=8, eps=1e-5, bias=True):
        super().__init__()
        self.fc = torch.nn.Linear(d, d, bias=bias)
        self.norm = torch.nn.LayerNorm(d, eps=eps)
        self.scale = 2

    def forward(self, x):
        return self.norm(act(self.fc(x))) * self.scale
"""


@pytest.fixture
def ns() -> dict:
    compile_reuse.install()
    namespace: dict = {"__name__": "__main__"}
    exec(CELL, namespace)
    return namespace


def _did(model: torch.nn.Module, x: torch.Tensor, **jit_options) -> str:
    """What reuse did for this model's first call ("reused", "compiled", "neither"); checks the output against eager."""
    compile_reuse.mark(model)
    before = compile_reuse.stats()
    out = thunder.jit(model, **jit_options)(x)
    after = compile_reuse.stats()
    torch.testing.assert_close(out, model(x))
    return "reused" if after.hits > before.hits else "compiled" if after.misses > before.misses else "neither"


def _why() -> str:
    """What the last compile said about why it could not reuse (``interpreted in 1.2 s: ...``)."""
    return compile_reuse.stats().last


def _x(d: int = 8, batch: int = 2, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(batch, d, generator=torch.Generator().manual_seed(1), dtype=dtype)


def test_an_unchanged_model_reuses_and_computes_the_same(ns):
    torch.manual_seed(0)
    first = ns["Net"]()
    _did(first, _x())  # builds the entry (or reuses one an earlier test left: same code, same key)
    torch.manual_seed(0)
    a, b = ns["Net"](), ns["Net"]()
    b.load_state_dict(a.state_dict())
    ja, jb = thunder.jit(a), thunder.jit(b)
    for m in (a, b):
        compile_reuse.mark(m)
    before = compile_reuse.stats()
    out_a, out_b = ja(_x()), jb(_x())
    assert compile_reuse.stats().hits == before.hits + 2
    assert torch.equal(out_a, out_b)
    ops = [[bs.sym.name for bs in thunder.last_traces(j)[-1].bound_symbols] for j in (ja, jb)]
    assert ops[0] == ops[1]
    # what the reused trace computes is the new module's parameters, not the first module's
    torch.testing.assert_close(out_a, a(_x()))
    with torch.no_grad():
        b.fc.weight.add_(1.0)
    assert not torch.allclose(jb(_x()), out_b)


def test_a_class_redefined_with_another_forward_compiles(ns):
    _did(ns["Net"](), _x())
    exec(CELL.replace("* self.scale", "* self.scale + 1"), ns)
    assert _did(ns["Net"](), _x()) == "compiled"
    assert _why().endswith(": the code of Net.forward changed")


def test_a_redefined_global_helper_compiles(ns):
    _did(ns["Net"](), _x())
    exec("def act(x):\n    return torch.relu(x)\n", ns)
    assert _did(ns["Net"](), _x()) == "compiled"
    assert _why().endswith(": Net.forward reads act, which changed")


def test_a_changed_attribute_compiles(ns):
    _did(ns["Net"](), _x())
    m = ns["Net"]()
    m.scale = 3
    assert _did(m, _x()) == "compiled"
    assert _why().endswith(": attribute scale changed (2 -> 3)")
    _did(ns["Net"](), _x())
    assert _did(ns["Net"](eps=1e-3), _x()) == "compiled"
    assert _why().endswith(": attribute norm.eps changed (1e-05 -> 0.001)")


def test_a_strategy_switch_is_said_in_the_users_words(ns):
    """What DDP sets on the module it replicates (``use_ddp``, its group and bucket size: ``hooks.mark_module_ddp``)
    is no attribute the user wrote: switching FSDP to DDP read "attribute bucket_size_in_mb was added"."""
    import torch.distributed as dist

    from thunderviz.thunder.hooks import mark_module_ddp

    ours = not dist.is_initialized()
    if ours:  # a world of one: the group DDP's marks name
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        _did(ns["Net"](), _x())
        replicated = ns["Net"]()
        mark_module_ddp(replicated, None, dist.group.WORLD, 25.0)
        assert _did(replicated, _x()) == "compiled"
        said = "the strategy changed: the model is now replicated by DDP (before: sharded by FSDP, or not distributed)"
        assert _why().endswith(f": {said}"), _why()
        smaller = ns["Net"]()
        mark_module_ddp(smaller, None, dist.group.WORLD, 0.0)
        assert _did(smaller, _x()) == "compiled"
        assert _why().endswith(": DDP's gradient bucket size changed (25.0 -> 0.0 MB)"), _why()
    finally:
        if ours:
            dist.destroy_process_group()


def test_a_partial_set_on_each_module_is_keyed_by_what_it_calls(ns):
    """litgpt's ``initialize_weights`` gives each Linear a ``reset_parameters`` partial of a function it defines on
    every call: keyed by its repr (the function's address), litgpt's resumed set-up could never reuse."""
    import functools

    def attach(model: torch.nn.Module, std: float) -> torch.nn.Module:
        def init(module: torch.nn.Module, std: float) -> None:  # a new function object on every call, as litgpt's
            torch.nn.init.normal_(module.weight, std=std)

        model.fc.reset_parameters = functools.partial(init, model.fc, std=std)
        return model

    _did(attach(ns["Net"](), 0.02), _x())
    assert _did(attach(ns["Net"](), 0.02), _x()) == "reused"
    assert _did(attach(ns["Net"](), 0.5), _x()) == "compiled"  # what the partial holds is keyed


def test_the_no_sync_mark_alone_is_not_called_a_strategy_switch():
    """``use_ddp`` without DDP's process group is the mark that keys an FSDP module's traces on no_backward_sync
    (set during its first compile); it read "the strategy changed: the model is now replicated by DDP"."""
    from thunderviz.thunder.reuse.why_not import _attribute_change

    mark = {"use_ddp": ("bool", "True")}
    said = _attribute_change("", mark, {})
    assert said == "no_backward_sync changed: a trace that accumulates gradients is kept apart from one that syncs them"
    replicated = {**mark, "process_group_for_ddp": ("group", 2), "bucket_size_in_mb": ("float", "25.0")}
    assert _attribute_change("", replicated, {}).startswith("the strategy changed: the model is now replicated by DDP")
    assert _attribute_change("", replicated, mark).startswith("the strategy changed: the model is now replicated")
    assert _attribute_change("", {}, replicated) == "the strategy changed: the model is no longer replicated by DDP"


def test_changed_parameters_compile(ns):
    _did(ns["Net"](), _x())
    assert _did(ns["Net"](d=16), _x(16)) == "compiled"  # shapes
    assert _why().endswith(": parameter fc.weight: its shape changed ((8, 8) -> (16, 16))")
    _did(ns["Net"](), _x())
    assert _did(ns["Net"]().double(), _x(dtype=torch.float64)) == "compiled"  # dtypes
    assert _why().endswith(": parameter fc.weight: its dtype changed (torch.float32 -> torch.float64)")
    _did(ns["Net"](), _x())
    m = ns["Net"]()
    m.fc.weight.requires_grad_(False)
    assert _did(m, _x()) == "compiled"  # requires_grad
    assert _why().endswith(": parameter fc.weight: its requires_grad changed (True -> False)")


def test_changed_inputs_compile(ns):
    _did(ns["Net"](), _x())
    assert _did(ns["Net"](), _x(batch=3)) == "compiled"
    assert _why().endswith(": input 0's shape changed ((2, 8) -> (3, 8))")


def test_a_swapped_submodule_compiles(ns):
    _did(ns["Net"](), _x())
    m = ns["Net"]()
    m.norm = torch.nn.Identity()
    assert _did(m, _x()) == "compiled"
    assert _why().endswith(": norm is now Identity (was LayerNorm)")


def test_forward_replaced_on_an_instance_compiles(ns):
    _did(ns["Net"](), _x())
    m = ns["Net"]()
    m.forward = types.MethodType(lambda self, x: self.fc(x) * 5, m)
    assert _did(m, _x()) == "compiled"
    assert _why().endswith(": forward was replaced on the root module")


def test_other_executors_or_options_compile(ns):
    _did(ns["Net"](), _x())
    assert _did(ns["Net"](), _x(), executors=["torch", "python"]) == "compiled"
    assert _why().endswith(": the executors changed")
    _did(ns["Net"](), _x())
    assert _did(ns["Net"](), _x(), disable_torch_autograd=True) == "compiled"
    assert _why().endswith(": torch autograd support changed")


def test_unmarked_modules_and_the_switch_never_reuse(ns, monkeypatch):
    _did(ns["Net"](), _x())
    before = compile_reuse.stats()
    plain = ns["Net"]()
    torch.testing.assert_close(thunder.jit(plain)(_x()), plain(_x()))
    assert compile_reuse.stats() == before  # not ours: thunder as usual, not even counted
    monkeypatch.setenv(compile_reuse.ENV_VARIABLE, "0")
    assert _did(ns["Net"](), _x()) == "neither"


def test_a_global_module_the_forward_reads_is_part_of_the_key(ns):
    exec(
        "shared = torch.nn.Linear(8, 8)\n"
        "class Uses(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return shared(x).sin()\n",
        ns,
    )
    _did(ns["Uses"](), _x())
    assert _did(ns["Uses"](), _x()) == "reused"
    exec("shared = torch.nn.Linear(8, 8, bias=False)\n", ns)
    assert _did(ns["Uses"](), _x()) == "compiled"


# -- case 2: a function the user jitted, handed or naming a module our strategies set up ---------------------------

STEP_CELL = """
def step(model, x):
    return act(model(x)).sum()

def closing_over(model):
    def step_closed(x):
        return act(model(x)).sum()
    return step_closed

def step_global(x):
    return act(model_g(x)).sum()

class Mlp(torch.nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, hidden)
        self.fc2 = torch.nn.Linear(hidden, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
"""


@pytest.fixture
def fns(ns) -> dict:
    exec(STEP_CELL, ns)
    return ns


def _set_up(model: torch.nn.Module) -> torch.nn.Module:
    """Mark a model as our strategies mark what they set up with ``jit=False``."""
    compile_reuse.mark(model)
    return model


def _called(fn, *args) -> tuple[str, torch.Tensor, thunder.core.trace.TraceCtx]:
    """What reuse did for a jitted ``fn``'s first call with modules marked as a strategy marks them (case 2), after
    checking its result against eager on the *current* function and modules; the result and the execution trace."""
    for a in args:
        if isinstance(a, torch.nn.Module):
            compile_reuse.mark(a)
    before = compile_reuse.stats()
    jitted = thunder.jit(fn)
    out = jitted(*args)
    after = compile_reuse.stats()
    torch.testing.assert_close(out, fn(*args))
    did = "reused" if after.hits > before.hits else "compiled" if after.misses > before.misses else "neither"
    return did, out, thunder.last_traces(jitted)[-1]


def _ops(trace) -> list[str]:
    return [str(b.sym.name) for b in trace.bound_symbols]


def _text(trace) -> str:
    """A trace's program as thunder prints it, less how long each pass took."""
    return re.sub(r"\(took \d+ milliseconds\)", "", str(trace))


def test_a_rerun_jitted_function_reuses_with_identical_numbers_and_traces(fns, monkeypatch):
    torch.manual_seed(0)
    _called(fns["step"], fns["Net"](), _x())  # builds the entry (or reuses one an earlier test left)
    torch.manual_seed(1)
    m = fns["Net"]()
    did, out, trace = _called(fns["step"], m, _x())
    assert did == "reused"
    monkeypatch.setenv(compile_reuse.ENV_VARIABLE, "0")
    fresh_did, fresh_out, fresh_trace = _called(fns["step"], m, _x())
    assert fresh_did == "neither"
    assert torch.equal(out, fresh_out)
    assert _ops(trace) == _ops(fresh_trace)
    assert _text(trace) == _text(fresh_trace)


def test_a_redefined_function_body_compiles(fns):
    _called(fns["step"], fns["Net"](), _x())
    exec("def step(model, x):\n    return act(model(x)).mean()\n", fns)
    assert _called(fns["step"], fns["Net"](), _x())[0] == "compiled"
    assert _why().endswith(": the code of step changed")


def test_a_helper_the_function_calls_redefined_compiles(fns):
    _called(fns["step"], fns["Net"](), _x())
    exec("def act(x):\n    return torch.sigmoid(x)\n", fns)
    assert _called(fns["step"], fns["Net"](), _x())[0] == "compiled"
    assert _why().endswith(": step reads act, which changed")


def test_a_module_argument_with_another_shape_compiles(fns):
    _called(fns["step"], fns["Mlp"](), _x())
    assert _called(fns["step"], fns["Mlp"](hidden=32), _x())[0] == "compiled"
    assert _why().endswith(": argument 0: parameter fc1.weight: its shape changed ((16, 8) -> (32, 8))")


def test_a_closure_over_an_equal_model_reuses_and_reads_the_new_one(fns):
    """A re-run cell that redefines the function around a new, equal model: same code, new closure cell."""
    _called(fns["closing_over"](_set_up(fns["Mlp"]())), _x())
    m = _set_up(fns["Mlp"]())
    with torch.no_grad():
        m.fc2.bias.add_(5.0)  # a trace bound to the old model would give other numbers (_called checks them)
    assert _called(fns["closing_over"](m), _x())[0] == "reused"


def test_a_closure_model_with_another_parameter_shape_compiles(fns):
    _called(fns["closing_over"](_set_up(fns["Mlp"]())), _x())
    m = _set_up(fns["Mlp"](hidden=4))
    assert _called(fns["closing_over"](m), _x())[0] == "compiled"
    why = ": step_closed closes over model: parameter fc1.weight: its shape changed ((16, 8) -> (4, 8))"
    assert _why().endswith(why)


def test_a_global_model_rebound_by_a_rerun_cell(fns):
    for hidden, expected in ((16, None), (16, "reused"), (24, "compiled")):
        fns["model_g"] = _set_up(fns["Mlp"](hidden))
        did = _called(fns["step_global"], _x())[0]
        assert expected is None or did == expected
    assert _why().endswith(": step_global reads model_g: parameter fc1.weight: its shape changed ((16, 8) -> (24, 8))")


def test_a_submodule_swapped_or_a_forward_replaced_in_an_argument_compiles(fns):
    _called(fns["step"], fns["Net"](), _x())
    m = fns["Net"]()
    m.norm = torch.nn.Identity()
    assert _called(fns["step"], m, _x())[0] == "compiled"
    assert _why().endswith(": argument 0: norm is now Identity (was LayerNorm)")
    _called(fns["step"], fns["Net"](), _x())
    m = fns["Net"]()
    m.forward = types.MethodType(lambda self, x: self.fc(x) * 5, m)
    assert _called(fns["step"], m, _x())[0] == "compiled"
    assert _why().endswith(": argument 0: forward was replaced on the root module")


def test_a_function_without_marked_modules_is_left_to_thunder(fns):
    before = compile_reuse.stats()
    m = fns["Net"]()
    torch.testing.assert_close(thunder.jit(fns["step"])(m, _x()), fns["step"](m, _x()))
    assert compile_reuse.stats() == before
