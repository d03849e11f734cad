"""What a jitted object's last prologue read from the modules it was called with.

Thunder keeps no link from a module to the functions that traced it, but each prologue records, in its
``unpack_parameter`` / ``unpack_buffer`` bound symbols, which tensors it read from which module argument (qualified
name, shape, dtype). Exact, unlike matching proxy names, it serves both finding the function that traced a module
(``find_target``) and naming a trace's parameters (``param_names``).

Thunder is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from thunderviz.thunder.capture.snapshot import dtype_name
from thunderviz.thunder.modules import FABRIC_PREFIX

__all__ = ["ModuleRead", "prologue_reads"]


@dataclass
class ModuleRead:
    """The tensors a trace's prologue read from one module argument: qualified name -> (proxy, shape, dtype)."""

    arg: str
    tensors: dict[str, tuple[str, tuple[int, ...], str]] = field(default_factory=dict)


def prologue_reads(jitted: Any) -> list[ModuleRead]:
    """What the last prologue of ``jitted`` unpacked from modules (an empty list before its first call)."""
    import thunder
    from thunder.core.prims import PrimIDs

    try:
        prologues = thunder.compile_stats(jitted).last_prologue_traces
    except Exception:
        return []
    if not prologues:
        return []
    arg_of: dict[str, str] = {}  # proxy name -> where it came from (function argument)
    reads: dict[str, ModuleRead] = {}
    params = _signature_names(jitted)
    for b in prologues[-1].bound_symbols:
        sid = b.sym.id
        if sid == PrimIDs.UNPACK_GETITEM and len(b.args) == 2 and b.output is not None:
            container, key = b.args
            cname = getattr(container, "name", "")
            if cname == "args" and isinstance(key, int):
                arg_of[b.output.name] = params[key] if key < len(params) else f"arg{key}"
            elif cname == "kwargs":
                arg_of[b.output.name] = str(key)
        elif sid == PrimIDs.UNPACK_THUNDER_MODULE and b.output is not None:
            src = getattr(b.args[0], "name", "") if b.args else ""
            reads[b.output.name] = ModuleRead(arg=arg_of.get(src, "self"))
        elif sid in (PrimIDs.UNPACK_PARAMETER, PrimIDs.UNPACK_BUFFER) and len(b.args) == 2:
            owner = reads.get(getattr(b.args[0], "name", ""))
            out = b.output
            if owner is not None and out is not None and hasattr(out, "shape"):
                qual = str(b.args[1]).removeprefix(FABRIC_PREFIX)
                owner.tensors[qual] = (out.name, tuple(int(d) for d in out.shape), dtype_name(out.dtype))
    return [r for r in reads.values() if r.tensors]


def _signature_names(jitted: Any) -> list[str]:
    import thunder

    try:
        fn = thunder.compile_data(jitted).fn
        return [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except Exception:
        return []
