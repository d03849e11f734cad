"""The one unwrapping of what a user holds (``thunder.modules``) and the one collective table
(``thunder.comm.collectives``),
on real objects: Fabric's wrapper from a single-device ``fabric.setup_module``, a real ThunderModule."""

from __future__ import annotations

import thunder
from torch import nn

from thunderviz.thunder.comm.collectives import collective_kinds, executed_collective_ids
from thunderviz.thunder.modules import unwrap_fabric, user_module
from thunderviz.trace.model import COLLECTIVE_KINDS


def _fabric_setup(module: nn.Module) -> nn.Module:
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    return fabric.setup_module(module)


def test_the_users_module_is_found_under_every_wrapper():
    model = nn.Linear(3, 2)
    jitted = thunder.jit(model)
    assert user_module(model) is model
    assert user_module(jitted) is model
    wrapped_plain, wrapped_jitted = _fabric_setup(model), _fabric_setup(jitted)
    assert type(wrapped_jitted).__name__ == "_FabricModule"
    assert unwrap_fabric(wrapped_jitted) is jitted
    assert user_module(wrapped_jitted) is model
    assert user_module(wrapped_plain) is model


def test_only_fabrics_wrapper_is_unwrapped():
    class LooksLikeFabric(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._forward_module = nn.Linear(2, 2)

    odd = LooksLikeFabric()
    assert unwrap_fabric(odd) is odd and user_module(odd) is odd


def test_one_table_from_symbol_to_collective_kind():
    import thunder.distributed.prims as dist_prims
    from thunder.executors import torchex

    ids = executed_collective_ids()
    assert ids == {k: getattr(torchex, f"{k}_prim_impl").id for k in COLLECTIVE_KINDS}
    kinds = collective_kinds()
    for kind in COLLECTIVE_KINDS:
        assert kinds[ids[kind]] == kind  # what execution traces hold
        assert kinds[getattr(dist_prims, kind).id] == kind  # what earlier stages hold
    assert len(kinds) == 2 * len(COLLECTIVE_KINDS)
