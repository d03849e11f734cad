"""The one module that touches thunder internals: version gate, inactivity for untagged tensors, sharding maths."""

from __future__ import annotations

import pytest
import thunder
import torch
from torch import nn

from thunderviz.errors import UnsupportedThunderError
from thunderviz.thunder import compile_state, hooks, param_tags


def test_untested_thunder_version_fails_with_the_fix(monkeypatch):
    monkeypatch.setattr(thunder, "__version__", "0.3.0")
    with pytest.raises(UnsupportedThunderError) as err:
        hooks.ensure_supported_thunder()
    assert str(err.value) == (
        "thunderviz's thunder hooks were tested with lightning-thunder 0.2.6, but 0.3.0 is installed. Install a"
        " tested version (`pip install lightning-thunder==0.2.6 torch==2.9.1`) or use thunder's own"
        " `thunder.distributed.fsdp(thunder.jit(model))`."
    )


def test_strategy_refuses_untested_thunder(monkeypatch):
    from thunderviz import ThunderFSDPStrategy

    monkeypatch.setattr(thunder, "__version__", "0.1.0")
    with pytest.raises(UnsupportedThunderError):
        ThunderFSDPStrategy()


def test_hook_leaves_untagged_modules_alone():
    """With the hook installed, a module no strategy set up traces exactly as before: no synchronize, no comms."""
    hooks.install_sync_hook()
    hooks.install_sync_hook()  # idempotent
    from thunder.core import jit_ext

    assert hasattr(jit_ext.JitCtx.proxify, "__thunderviz_original__")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    reference = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    reference.load_state_dict(model.state_dict())
    jitted = thunder.jit(model)
    x = torch.randn(5, 4)
    out = jitted(x)
    out.sum().backward()
    torch.testing.assert_close(out, reference(x))
    names = {b.sym.name for b in thunder.last_traces(jitted)[0].bound_symbols}
    assert "synchronize" not in names
    assert not any("all_gather" in n or "reduce" in n for n in names)
    assert all(param_tags.sync_tag(p) is None for p in model.parameters())


def test_accessors_for_the_strategies():
    jitted = thunder.jit(nn.Linear(3, 2))
    assert compile_state.cached_trace_count(jitted) == 0
    jitted(torch.randn(1, 3))
    assert compile_state.cached_trace_count(jitted) == 1
    assert hooks.is_skipping_grad_sync() is False
    with hooks.skip_grad_sync():
        assert hooks.is_skipping_grad_sync() is True
    assert hooks.is_skipping_grad_sync() is False


def test_original_module_is_the_users_module():
    model = nn.Linear(3, 2)
    assert compile_state.original_module(thunder.jit(model)) is model


def test_rebind_points_a_thunder_module_at_materialized_tensors():
    with torch.device("meta"):
        model = nn.Linear(3, 2)
        model.register_buffer("scale", torch.ones(2))
    jitted = thunder.jit(model)
    old_weight, old_scale = model.weight, model.scale
    new_weight, new_scale = nn.Parameter(torch.zeros(2, 3)), torch.ones(2)
    model.weight, model.scale = new_weight, new_scale
    assert dict(jitted.named_parameters())["weight"] is old_weight  # ThunderModule's own table is stale
    assert compile_state.rebind_module_tensors(jitted, {id(old_weight): new_weight, id(old_scale): new_scale}) == 2
    assert dict(jitted.named_parameters())["weight"] is new_weight
    assert dict(jitted.named_buffers())["scale"] is new_scale
