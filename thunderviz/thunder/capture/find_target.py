"""Which jitted object holds the traces of what the user passed to ``capture``: ``find_target``.

- a ``ThunderModule`` or a jitted function (``thunder.jit``), as is;
- Fabric's ``_FabricModule`` around a ``ThunderModule`` (cases 1 and 3): the ThunderModule inside;
- Fabric's ``_FabricModule`` around a plain module set up with ``jit=False`` (case 2), or that plain module: the
  module itself has no traces, the function the user jitted and called with it does. The function whose last
  prologue read this module's parameters (``prologue``) is the target, provided exactly one function did and no
  other live module has parameters that fit the same record; otherwise ``TraceCaptureError`` names the function(s)
  to pass instead.

Thunder and torch are imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import gc
import types
from dataclasses import dataclass
from typing import Any

from thunderviz.errors import TraceCaptureError
from thunderviz.thunder.capture.snapshot import dtype_name
from thunderviz.thunder.jit.prologue import ModuleRead, prologue_reads
from thunderviz.thunder.modules import unwrap_fabric

__all__ = ["Target", "find_target"]


@dataclass(frozen=True)
class Target:
    """The jitted object whose traces to read, the name reports give it, and how messages refer to it."""

    jitted: Any
    default_name: str
    what: str


def find_target(obj: Any) -> Target:
    """The jitted object behind ``obj`` (see the module docstring).

    Raises:
        TraceCaptureError: nothing jitted can be found behind ``obj``, or several candidates can.
    """
    from torch import nn

    from thunderviz.thunder.compile_state import is_jitted

    inner = unwrap_fabric(obj)
    wrapped = inner is not obj
    if is_jitted(inner):
        kind = type(inner).__name__
        what = f"the {kind} inside Fabric's wrapper" if wrapped else f"the jitted {kind}"
        return Target(inner, _default_name(inner), what)
    if is_jitted(obj):
        return Target(obj, _default_name(obj), f"the jitted {type(obj).__name__}")
    if isinstance(inner, nn.Module):
        fn = _function_that_traced(inner, type(obj).__name__)
        return Target(fn, type(inner).__name__, f"the jitted function {_fn_name(fn)}")
    raise TraceCaptureError(
        f"capture(obj) needs what thunder.jit or fabric.setup returned; got {type(obj).__name__}. "
        "Jit it first (jm = thunder.jit(model)), run it once, then call capture(jm)."
    )


def _fits(module: Any, read: ModuleRead) -> frozenset[int] | None:
    """The ids of ``module``'s tensors that fit ``read`` (same names, shapes, dtypes), or None when any does not."""
    ids = []
    for qual, (_proxy, shape, dtype) in read.tensors.items():
        t = None
        for getter in ("get_parameter", "get_buffer"):
            try:
                t = getattr(module, getter)(qual)
                break
            except Exception:
                continue
        if t is None or tuple(t.shape) != shape or dtype_name(t.dtype) != dtype:
            return None
        ids.append(id(t))
    return frozenset(ids)


def _live_jitted_functions() -> list[Any]:
    """Every function ``thunder.jit`` returned that is still alive in this process (not ThunderModules)."""
    import thunder

    out = []
    for o in gc.get_objects():
        if type(o) is types.FunctionType and getattr(o, "_lc_cs", None) is not None:
            cd = thunder.compile_data(o)
            if cd is not None and not cd.is_module:
                out.append(o)
    return out


def _function_that_traced(module: Any, given: str) -> Any:
    """Case 2: the one jitted function whose last trace read ``module``'s parameters (see the module docstring)."""
    gc.collect()  # objects left in reference cycles (an earlier cell's model and function) are not candidates
    hits: list[tuple[Any, ModuleRead, frozenset[int]]] = []
    for fn in _live_jitted_functions():
        for read in prologue_reads(fn):
            ids = _fits(module, read)
            if ids:
                hits.append((fn, read, ids))
                break
    if not hits:
        raise TraceCaptureError(
            f"capture({given}): this {type(module).__name__} is not jitted (thunder.jit), and no jitted function in "
            "this process has traced it. Pass what thunder.jit or fabric.setup returned after one call; for a module "
            "set up with jit=False (case 2), call your jitted function once (loss = step(model, x)) and pass that "
            "function: capture(step)."
        )
    names = ", ".join(_fn_name(fn) for fn, _r, _i in hits)
    if len(hits) > 1:
        raise TraceCaptureError(
            f"capture({given}): {len(hits)} jitted functions traced this {type(module).__name__} ({names}), each with "
            f"its own traces; pass the one you mean, e.g. capture({_fn_name(hits[0][0])})."
        )
    fn, read, ids = hits[0]
    twins = _other_modules_that_fit(read, ids)
    if twins:
        raise TraceCaptureError(
            f"capture({given}): the jitted function {names} last traced a module with this "
            f"{type(module).__name__}'s parameter names and shapes, but {len(twins)} other live module(s) have them "
            f"too, so which one it traced cannot be told; pass the function: capture({names})."
        )
    return fn


def _other_modules_that_fit(read: ModuleRead, own: frozenset[int]) -> set[frozenset[int]]:
    """Live modules other than the one whose tensors are ``own`` that would have fit ``read`` just as well.

    Wrappers (Fabric's, a ThunderModule) expose the same tensor objects as the module they wrap, so they count once.
    """
    from torch import nn

    found: set[frozenset[int]] = set()
    for o in gc.get_objects():
        if not issubclass(type(o), nn.Module):  # type(), not isinstance: some objects warn on __class__
            continue
        try:
            ids = _fits(o, read)
        except Exception:
            continue
        if ids and ids != own:
            found.add(ids)
    return found


def _fn_name(fn: Any) -> str:
    inner = getattr(fn, "__wrapped__", fn)
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(fn).__name__


def _default_name(obj: Any) -> str:
    from thunderviz.thunder.compile_state import is_thunder_module, original_module

    if is_thunder_module(obj):
        return type(original_module(obj)).__name__
    fn = getattr(obj, "__wrapped__", obj)
    return getattr(fn, "__name__", type(obj).__name__)
