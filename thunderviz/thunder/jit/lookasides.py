"""Registering thunder jit lookasides: what thunder's interpreter runs in place of a function it meets while tracing.

thunder keeps them in one process-wide map keyed by the function object (``jit_ext._general_jit_lookaside_map``). A
lookaside that wants the original behaviour for some calls interprets a copy of the original (``function_copy``):
interpreting the original itself would find the lookaside again.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["function_copy", "register_lookaside", "registered", "temporary_lookaside"]

_lock = threading.Lock()


def _lookasides() -> dict[Any, Callable[..., Any]]:
    from thunder.core import jit_ext

    return jit_ext._general_jit_lookaside_map


def register_lookaside(target: Callable[..., Any], lookaside: Callable[..., Any]) -> None:
    """From now on in this process, thunder traces calls of ``target`` as ``lookaside`` (its arguments wrapped, as
    thunder hands them to every lookaside). A second registration for the same target keeps the first."""
    with _lock:
        _lookasides().setdefault(target, lookaside)


def registered(target: Callable[..., Any]) -> bool:
    return target in _lookasides()


@contextlib.contextmanager
def temporary_lookaside(target: Callable[..., Any], lookaside: Callable[..., Any]) -> Iterator[None]:
    """``lookaside`` for ``target`` while the block runs; whatever was registered before comes back after."""
    with _lock:
        lookasides = _lookasides()
        before = lookasides.get(target)
        lookasides[target] = lookaside
    try:
        yield
    finally:
        with _lock:
            if before is None:
                lookasides.pop(target, None)
            else:
                lookasides[target] = before


def function_copy(fn: types.FunctionType) -> types.FunctionType:
    """A new function object with ``fn``'s code, globals, defaults and closure: thunder interprets it like ``fn``
    without finding a lookaside registered for ``fn``."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy
