"""Where Fabric meets an object before the strategy's ``setup_module`` does, and what Fabric does after it returns.

Two facts about ``Fabric.setup`` (lightning 2.6) that the decision table must know:

- it calls the precision plugin's ``convert_module`` and then reads ``named_parameters()`` of the object *before* the
  strategy sees it: ``thunderfx``'s object (no module) fails there with an AttributeError, and a module thunder's
  FSDP plugin sharded (meta parameters in its original module) fails in ``module_to_device``. So the strategy's
  precision checks the front door first (``guard_front_door``) and a refused object gets the decision's error;
- it unwraps a ``torch.compile``d module (``_unwrap_compiled``), hands the strategy the plain module, and compiles
  what the strategy returns again with the same keywords. Those keywords live only in ``Fabric.setup``'s (or
  ``setup_module``'s) frame, so ``fabric_compile_kwargs`` reads them there; the decision then refuses, or jits the
  module itself and hides its forward from Dynamo (``hide_from_dynamo``) so that the second compile passes through.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["fabric_compile_kwargs", "guard_front_door", "hide_from_dynamo"]

_GUARD_MARK = "__thunderviz_front_door__"


def fabric_compile_kwargs() -> dict[str, Any] | None:
    """The ``torch.compile`` keywords of the module the calling ``Fabric.setup``/``setup_module`` unwrapped (None when
    it was not compiled, or when no Fabric call is on the stack)."""
    from lightning.fabric import Fabric

    codes = {Fabric.setup.__code__, Fabric.setup_module.__code__}
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in codes:
            found = frame.f_locals.get("compile_kwargs")
            return dict(found) if isinstance(found, dict) else None
        frame = frame.f_back
    return None


def guard_front_door(precision: Any, check: Callable[[Any], None]) -> None:
    """Make ``precision.convert_module`` call ``check(obj)`` first: the first thing ``Fabric.setup`` does with it."""
    original = precision.convert_module
    if getattr(original, _GUARD_MARK, False):
        return

    def convert_module(module: Any) -> Any:
        check(module)
        return original(module)

    setattr(convert_module, _GUARD_MARK, True)
    precision.convert_module = convert_module


def hide_from_dynamo(jitted: torch.nn.Module) -> None:
    """Let ``torch.compile(jitted)`` pass through: Dynamo skips the jitted module's forward, thunder runs it whole."""
    jitted.forward = torch._dynamo.disable(jitted.forward)  # type: ignore[method-assign]
