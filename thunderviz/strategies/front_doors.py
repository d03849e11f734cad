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

from thunderviz.thunder.reuse.key import SET_UP_ONLY

__all__ = ["fabric_compile_kwargs", "guard_front_door", "hide_from_dynamo", "keep_compile_kwargs_captured"]

_CAPTURE_MARK = "__thunderviz_compile_capture__"


def keep_compile_kwargs_captured() -> None:
    """Make ``torch.compile(module, ...)`` record its keywords on the compiled module whatever thunder does.

    Fabric needs them (``_compile_kwargs``) to unwrap a compiled module and compile it again; Lightning records them by
    wrapping ``torch.compile`` when it is imported, but thunder's ``ThunderCompiler()`` and ``thunderfx`` replace
    ``torch.compile`` by ``inspect.unwrap(torch.compile)``, so ``torch.compile(model, backend=ThunderCompiler())``
    reached ``fabric.setup`` as Fabric's raw "Failed to determine the arguments" RuntimeError. This wrapper records
    the same keywords and, having no ``__wrapped__``, is not unwrapped.
    """
    import inspect

    current = torch.compile
    if getattr(current, _CAPTURE_MARK, False):
        return
    original = inspect.unwrap(current)

    def compile(*args: Any, **kwargs: Any) -> Any:
        if not args or not isinstance(args[0], torch.nn.Module):
            return original(*args, **kwargs)
        compiled = original(args[0], **kwargs)
        compiled._compile_kwargs = dict(kwargs)
        return compiled

    compile.__doc__ = original.__doc__
    compile.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    setattr(compile, _CAPTURE_MARK, True)
    torch.compile = compile  # type: ignore[assignment]


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
    if getattr(original, SET_UP_ONLY, False):
        return

    def convert_module(module: Any) -> Any:
        check(module)
        return original(module)

    setattr(convert_module, SET_UP_ONLY, True)
    precision.convert_module = convert_module


def hide_from_dynamo(jitted: torch.nn.Module) -> None:
    """Let ``torch.compile(jitted)`` pass through: Dynamo skips the jitted module's forward, thunder runs it whole."""
    jitted.forward = torch._dynamo.disable(jitted.forward)  # type: ignore[method-assign]
