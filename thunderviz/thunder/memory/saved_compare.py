"""Thunder's saved-for-backward against eager PyTorch's for one module and batch: where thunder saves more.

Both sides run on the meta device in this process, on the same batch shapes (nothing is allocated):

- eager: the module's forward under ``torch.autograd.graph.saved_tensors_hooks``; the pack hook sees every tensor
  autograd keeps and records it once per storage, with the first line of the caller's code on the stack (frames in
  torch, thunder and thunderviz are skipped);
- thunder: ``thunder.jit`` of a copy of the module (the CPU executors' choices, ``thunder.memory.meta_world``), one
  forward, and the forward trace's saved tensors with the source line of the op that made each (``trace.saved``).

Parameters are left out on both sides: they are alive whatever autograd keeps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from thunderviz.thunder.memory.meta_model import meta_inputs, meta_twin
from thunderviz.thunder.memory.meta_world import target_device
from thunderviz.trace.saved import INPUTS, LineComparison, SavedComparison, saved_tensors

__all__ = ["compare_saved"]

_TORCH = os.path.dirname(torch.__file__) + os.sep
_MODULES = os.path.join(_TORCH, "nn", "modules") + os.sep
_CALL_MACHINERY = os.path.join(_MODULES, "module.py")
_LIBRARY = os.path.dirname(os.__file__) + os.sep


def _thunder_dir() -> str:
    import thunder

    return os.path.dirname(thunder.__file__) + os.sep


def _is_users(path: str) -> bool:
    """A frame of the code being compared: not torch's internals (its ``nn.modules`` forwards count, as thunder
    records them), not the standard library."""
    if path.startswith(("<", _LIBRARY)) or path == _CALL_MACHINERY:
        return False
    return not path.startswith(_TORCH) or path.startswith(_MODULES)


def _caller_line() -> tuple[str, str]:
    """``(file.py:12, source text)`` of the innermost frame of the code being compared: the line that called the
    torch operation, which is the line thunder records for the same operation."""
    import linecache

    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if _is_users(path):
            line = frame.f_lineno
            return f"{os.path.basename(path)}:{line}", linecache.getline(path, line).strip()
        frame = frame.f_back
    return "", ""


def _eager_saved(module: nn.Module, inputs: tuple) -> dict[int, tuple[str, str, str, int]]:
    """Storage id -> (line, code, description, bytes) for every tensor eager autograd saves in one forward."""
    params = {id(p.untyped_storage()) for p in module.parameters()}
    saved: dict[int, tuple[str, str, str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = id(t.untyped_storage())
        if key not in params and key not in saved:
            line, code = _caller_line()
            desc = f"{str(t.dtype).removeprefix('torch.')}[{','.join(map(str, t.shape))}]"
            saved[key] = (line, code, desc, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*inputs)
    del out
    return saved


def compare_saved(
    module: nn.Module, example_input: Any, *, loss_fn: Callable[[Any], Any] | None = None
) -> SavedComparison:
    """What thunder and eager PyTorch keep for backward in ``module``'s forward on ``example_input``, line by line.

    Args:
        module: the module (its weights are not used: it is copied to the meta device).
        example_input: what ``module(...)`` takes (a tensor or a tuple of arguments).
        loss_fn: unused by the comparison (saved tensors come from forward); accepted so a plan's arguments fit.
    """
    import thunder

    from thunderviz.thunder.capture.traces import capture

    inputs = meta_inputs(example_input, None)
    eager = _eager_saved(meta_twin(module), inputs)
    twin = meta_twin(module)
    with target_device("cpu"):
        jitted = thunder.jit(twin)
        out = jitted(*inputs)
    del out
    bundle = capture(jitted, type(module).__name__, rank=0, stages=False)
    forward = bundle.forward
    params = set(forward.param_names)
    thunder_saved = [t for t in saved_tensors(forward) if not (t.group == INPUTS and t.name in params)]
    inside = _thunder_dir()
    lines: dict[str, dict[str, Any]] = {}
    for t in thunder_saved:
        key = "(inside thunder)" if t.file.startswith(inside) else (t.line or "(no source line)")
        row = lines.setdefault(key, {"code": "" if key.startswith("(") else t.code, "t": 0, "e": 0, "tn": [], "en": []})
        row["t"] += t.bytes
        row["tn"].append(t.short())
    for line, code, desc, nbytes in eager.values():
        row = lines.setdefault(line or "(no source line)", {"code": code, "t": 0, "e": 0, "tn": [], "en": []})
        row["code"] = row["code"] or code
        row["e"] += nbytes
        row["en"].append(desc)
    rows = tuple(
        LineComparison(k, v["code"], v["t"], v["e"], tuple(v["tn"]), tuple(v["en"]))
        for k, v in sorted(lines.items(), key=lambda kv: -(kv[1]["t"] - kv[1]["e"]))
    )
    return SavedComparison(
        module=type(module).__name__,
        thunder_bytes=sum(t.bytes for t in thunder_saved),
        eager_bytes=sum(v[3] for v in eager.values()),
        lines=rows,
    )
