"""When thunder cannot trace a model our strategies set up: which module, which Python line, which op, what to do.

thunder's interpreter reports a failure as the error of the op it could not run (``TypeError: _add_batch_dim():
incompatible function arguments``, ``NotImplementedError: unhandled value of type DynamicCache``) under a traceback
of the interpreted frames, which it synthesizes with the right file, line and code name (``get_or_make_python_frame``)
but without locals. So the module is found by its code: the innermost interpreted frame whose code is the ``forward``
of a module in the model names that module (the first of its class in the model when several share it, which is the
first one traced), the frame's line is the user's line, and the innermost frame outside thunder itself is the op.
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

from thunderviz.errors import UntraceableModelError
from thunderviz.parallel.front_doors import TRANSFORMERS_RANGE

__all__ = ["TraceFailure", "explain", "leave_half_traced_vmap", "locate"]

_THUNDER_DIR = os.sep + "thunder" + os.sep


@dataclass(frozen=True)
class TraceFailure:
    """Where a trace failed: the module (qualified name and class), its line, and the op thunder stopped at."""

    module: str  # qualified name in the model ("" for the model itself)
    module_class: str
    same_class: int  # how many modules of that class the model has
    file: str
    line: int
    source: str
    op: str  # the innermost function outside thunder ("_add_batch_dim")
    op_where: str  # "torch/_functorch/predispatch.py:37"


def _frames(tb: TracebackType | None) -> list[tuple[Any, int]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _forward_codes(roots: Iterable[torch.nn.Module]) -> dict[tuple[str, int, str], list[tuple[str, str]]]:
    """``(file, first line, name)`` of each module class's forward -> ``[(qualified name, class)]`` in model order."""
    codes: dict[tuple[str, int, str], list[tuple[str, str]]] = {}
    for root in roots:
        for name, mod in root.named_modules():
            forward = inspect.unwrap(type(mod).forward)
            code = getattr(forward, "__code__", None)
            if code is not None:
                codes.setdefault((code.co_filename, code.co_firstlineno, code.co_name), []).append(
                    (name, type(mod).__name__)
                )
    return codes


def _short(path: str) -> str:
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def locate(err: BaseException, roots: Iterable[torch.nn.Module]) -> TraceFailure | None:
    """The module, line and op of a trace failure (None when no interpreted frame belongs to a module of ``roots``)."""
    frames = _frames(err.__traceback__)
    codes = _forward_codes(roots)
    owner = None
    for i, (code, lineno) in enumerate(frames):
        found = codes.get((code.co_filename, code.co_firstlineno, code.co_name))
        if found:
            owner = (i, code, lineno, found)
    if owner is None:
        return None
    i, code, lineno, found = owner
    op_code, op_line = next(
        ((c, n) for c, n in reversed(frames[i:]) if _THUNDER_DIR not in c.co_filename), (code, lineno)
    )
    name, cls = found[0]
    op = op_code.co_name
    if op_code is code:  # thunder refused a call on the user's own line: its message names it, when it can
        named = re.search(
            r"registration for (\w+)|symbol (\w+)|value of type (\w+)|(boolean advanced indexing)", str(err)
        )
        op = next((g for g in named.groups() if g), "") if named else ""
        op = op or "a call on that line"
    return TraceFailure(
        module=name,
        module_class=cls,
        same_class=len(found),
        file=code.co_filename,
        line=lineno,
        source=linecache.getline(code.co_filename, lineno).strip(),
        op=op,
        op_where=f"{_short(op_code.co_filename)}:{op_line}",
    )


def leave_half_traced_vmap() -> int:
    """Leave the vmap levels a failed trace entered for real and never left; return how many.

    thunder runs ``torch.vmap``'s ``_vmap_increment_nesting`` opaquely and fails at the next step, so the process
    stays inside a vmap level: every later random op raises "vmap: called random operation while in randomness
    error mode", in code that has nothing to do with the model.
    """
    from torch._C import _functorch

    left = 0
    while _functorch.maybe_current_level() is not None and left < 64:
        _functorch._vmap_decrement_nesting()
        left += 1
    return left


def _advice(err: BaseException, failure: TraceFailure) -> str:
    text = f"{type(err).__name__}: {err}"
    if "DynamicCache" in text or "Cache" in failure.op:
        return (
            "call the model with use_cache=False: a training step has no use for transformers' generation cache,"
            " which thunder cannot hold (the strategy turns config.use_cache off; a use_cache=True passed to the"
            " call itself overrides that)"
        )
    hints = []
    transformers = sys.modules.get("transformers")
    if transformers is not None and "transformers" in failure.file + failure.op_where:
        low, high = TRANSFORMERS_RANGE
        hints.append(
            f"thunderviz traces transformers {low} to {high} with thunder 0.2.6 (installed:"
            f" {transformers.__version__});"
            " a model class outside Llama, Qwen2, Phi3 and GPT-2 may use code thunder cannot trace"
        )
    if "vmap" in failure.op_where or "_add_batch_dim" in failure.op:
        hints.append("thunder 0.2.6 cannot trace torch.vmap: write the batched computation with broadcasting")
    hints.append(
        "rewrite that line with operations thunder supports (thunder traces torch operations on tensors; it cannot"
        " trace Python that reads tensor values, converts tensors to NumPy or calls C extensions it does not know),"
        " or train this model without thunder (torch's FSDP2 `fully_shard` or Lightning's FSDPStrategy): jit=False"
        " does not help, your jitted function traces the same forward"
    )
    return "; ".join(hints)


def _is_program_error(err: BaseException) -> bool:
    """An error in the program itself, not a limit of thunder: a meta function's validation (``baseutils.check``:
    shapes that do not multiply, dtypes that do not mix) refused the call as torch would in eager mode. Advice to
    rewrite the line for thunder or to train without it would mislead there; the error, shown at the user's line,
    already says what is wrong. (thunder's refusals of what it cannot trace are NotImplementedError or come from
    elsewhere.)"""
    frames = _frames(err.__traceback__)
    if not frames or isinstance(err, NotImplementedError):
        return False
    code = frames[-1][0]
    return code.co_name == "check" and code.co_filename.endswith(os.path.join("thunder", "core", "baseutils.py"))


def explain(err: BaseException, roots: Iterable[torch.nn.Module]) -> UntraceableModelError | None:
    """``UntraceableModelError`` naming the module, line, op and fix of a failed trace (None when not found)."""
    if _is_program_error(err):
        return None
    roots = list(roots)
    failure = locate(err, roots)
    if failure is None:
        return None
    where = f"`{failure.module}`" if failure.module else "the model itself"
    several = (
        f" (the first of {failure.same_class} {failure.module_class} modules, the first traced)"
        if failure.same_class > 1
        else ""
    )
    message = (
        f"thunder could not trace {where} ({failure.module_class}){several}: it stopped at"
        f" {_short(failure.file)}:{failure.line} in {failure.module_class}.forward:\n"
        f"    {failure.source}\n"
        f"in `{failure.op}` ({failure.op_where}) with {type(err).__name__}: {str(err).strip().splitlines()[0][:300]}\n"
        f"What to do: {_advice(err, failure)}."
    )
    return UntraceableModelError(message, failure=failure)
