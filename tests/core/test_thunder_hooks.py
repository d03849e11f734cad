"""The one module that touches thunder internals: version gate, inactivity for untagged tensors, sharding maths."""

from __future__ import annotations

import pytest
import thunder
import torch
from torch import nn

from thunderviz.core import distribute
from thunderviz.core import thunder_hooks as hooks
from thunderviz.errors import UnsupportedThunderError


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
    assert all(hooks.sync_tag(p) is None for p in model.parameters())


@pytest.mark.parametrize(("rows", "world", "padding"), [(7, 2, 1), (8, 2, 0), (1, 2, 1), (5, 4, 3)])
def test_shards_cover_the_tensor_and_pad_the_last(rows, world, padding):
    t = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    shards = [distribute.shard_tensor(t, r, world) for r in range(world)]
    assert {p for _, p in shards} == {padding}
    assert len({s.shape for s, _ in shards}) == 1
    torch.testing.assert_close(torch.cat([s for s, _ in shards])[:rows], t)
    assert torch.count_nonzero(torch.cat([s for s, _ in shards])[rows:]) == 0
