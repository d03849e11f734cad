"""Which ``nn.Module`` is behind what ``fabric.setup`` or ``thunder.jit`` returned: the one way to unwrap.

The layers a user's module can sit in: Fabric's ``_FabricModule`` (``_forward_module``) around a ThunderModule
(``compile_state.original_module``: thunder keeps the user's module as ``_model``) or around the plain module itself
(case 2, ``jit=False``). Strategies distribute the user's module's own parameters in place, so that module is the one
whose parameters, names and state dict count.

Neither lightning nor thunder is imported here: an object can only be Fabric's wrapper once lightning is loaded, and
thunder is asked only about objects that may be jitted.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["FABRIC_PREFIX", "model_size", "unwrap_fabric", "user_module"]

_FABRIC_WRAPPER_MODULES = ("lightning.fabric.wrappers", "lightning_fabric.wrappers")

#: The attribute under which Fabric's wrapper holds the module it forwards to; parameter names read through the
#: wrapper start with it.
FABRIC_PREFIX = "_forward_module."


def unwrap_fabric(obj: Any) -> Any:
    """The module inside Fabric's ``_FabricModule``, or ``obj`` itself when it is not one."""
    for modname in _FABRIC_WRAPPER_MODULES:
        cls = getattr(sys.modules.get(modname), "_FabricModule", None)
        if cls is not None and isinstance(obj, cls):
            return obj._forward_module
    return obj


def user_module(obj: Any) -> Any:
    """The user's own module under Fabric's wrapper and/or a ThunderModule (``obj`` itself when wrapped in neither)."""
    from thunderviz.thunder import compile_state

    inner = unwrap_fabric(obj)
    return compile_state.original_module(inner) if compile_state.is_thunder_module(inner) else inner


def model_size(obj: Any) -> tuple[str, int] | None:
    """``(class name, parameter elements as built)`` of the user's module behind ``obj``, sharded parameters counted
    whole (their full shape); None when ``obj`` is not a module (a jitted function)."""
    import math

    from torch import nn

    from thunderviz.thunder import param_tags

    module = user_module(obj)
    if not isinstance(module, nn.Module):
        return None
    return type(module).__name__, sum(math.prod(param_tags.full_shape(p)) for p in module.parameters())
