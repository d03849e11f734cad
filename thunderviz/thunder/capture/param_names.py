"""Naming a trace's parameters: trace argument name -> qualified parameter or buffer name (``blocks.0.fc1.weight``).

Thunder names a module's tensors as identifiers (``t_blocks_0_fc1_weight``), which loses the dots; the prologue's own
records (``prologue``) keep the exact names, so they are used whenever the jitted object has them.
"""

from __future__ import annotations

import re
from typing import Any

from thunderviz.thunder.capture.snapshot import flat_proxies
from thunderviz.thunder.jit.prologue import prologue_reads

__all__ = ["param_names"]


def param_names(jitted: Any, trace: Any) -> dict[str, str]:
    """Trace argument name -> qualified parameter/buffer name.

    From the prologue's own records when it has them (exact; a function that takes several modules gets each
    name prefixed by its argument, ``teacher.fc1.weight``), else by thunder's naming of module tensors.
    """
    reads = prologue_reads(jitted)
    if reads:
        several = len(reads) > 1
        return {
            proxy: f"{r.arg}.{qual}" if several else qual for r in reads for qual, (proxy, _s, _d) in r.tensors.items()
        }
    return _param_names_by_sanitized_name(jitted, trace)


def _param_names_by_sanitized_name(obj: Any, trace: Any) -> dict[str, str]:
    named = getattr(obj, "named_parameters", None)
    if named is None:
        return {}
    by_sanitized: dict[str, str] = {}
    try:
        items = list(obj.named_parameters()) + list(obj.named_buffers())
    except Exception:
        return {}
    for qual, _t in items:
        by_sanitized.setdefault(_sanitize(qual), qual)
    out = {}
    for p in flat_proxies(getattr(trace, "args", ()) or ()):
        for candidate in (p.name, p.name.removeprefix("t_"), p.name.removeprefix("t")):
            qual = by_sanitized.get(_sanitize(candidate))
            if qual is not None:
                out[p.name] = qual
                break
    return out


def _sanitize(name: str) -> str:
    """Compare names the way thunder turns them into identifiers: every non-alphanumeric becomes ``_``."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").lower()
