"""Fusion regions cut at bucket boundaries, not at every parameter: our comm pass re-fuses what it rescheduled.

Why: thunder 0.2.6 runs its fusion executors before any transform sees the execution trace, and its default
("consecutive") fusion cuts a region at every op it cannot fuse. When it runs, each distributed parameter still has
its own collective (forward ``all_gather``, backward ``reduce_scatter`` / ``all_reduce`` + ``wait``), so a GPT's
backward became one ``torchcompile`` region per parameter (29 for a 2-block TinyGPT, about 100 for 8 blocks; a plain
``thunder.jit`` makes one). Our comm pass then moves those collectives into buckets, leaving dozens of regions
side by side with nothing between them: each is a separate ``torch.compile`` call with its own guards, and on an H200
the GPT d=1024 x 8 step spent 39 ms of host time for 24 ms of kernels (1.9x eager's step; bench/gpu_step_breakdown.py).

So ``CommTransform`` opens the regions of the fusion executors below (their ops are kept as each region's
subsymbols), reschedules the collectives on the plain ops, and hands the result back to the same executors' fusion
passes: regions now end only where a bucket's collective or our pack/unpack sits. ``torch.compile`` builds a region
on its first call, so the regions discarded here were never compiled.

Thunder's rematerialization (run inside each fusion pass) moves cheap ops from a producer region into its consumer
region and recomputes them there under the same names, while the producer keeps its own copy: opening both regions
would define those names twice (on the H200, with the sdpa executor cutting regions at attention, the re-fusion
failed with "Trying to add the name t1014 to a trace"). A recomputed op is the same bound symbol with the same
outputs, so the opened list keeps its first definition; the fusion pass then rematerializes again where it pays.

Only thunder's ``torchcompile`` executor (the full one; ``torchcompile_xentropy`` regions are one loss op each) is
re-fused: nvFuser's fusion pass was not run here (no nvFuser on these machines), and its regions are left as built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from thunderviz.thunder.jit import lazy_regions

__all__ = ["open_regions", "refuse"]


def _reopenable(bsym: Any) -> Any | None:
    """The executor of a fusion region we may open and fuse again, or None."""
    from thunder.executors.torch_compile import TorchCompileExecutor

    ex = getattr(bsym.sym, "executor", None)
    if bsym.sym.is_fusion and isinstance(ex, TorchCompileExecutor) and ex.required_ops is None and bsym.subsymbols:
        return ex
    return None


def open_regions(bsyms: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(the bound symbols with each re-fusable region replaced by its ops, the executors whose regions were opened)."""
    out: list[Any] = []
    executors: list[Any] = []
    defined: set[str] = set()
    for b in bsyms:
        ex = _reopenable(b)
        ops = [b] if ex is None else b.subsymbols
        for op in ops:
            names = {p.name for p in op.flat_proxy_outs}
            if ex is not None and names and names <= defined:
                continue  # a rematerialized copy of an op an earlier region already computes
            if names & defined:
                # redefining some names but not all is no recomputation we understand: keep the regions as built
                return list(bsyms), []
            defined |= names
            out.append(op)
        if ex is not None and ex not in executors:
            executors.append(ex)
    return out, executors


def refuse(trace: Any, bsyms: list[Any], executors: Sequence[Any]) -> tuple[Any, list[Any]]:
    """Run ``executors``' fusion passes over ``bsyms`` (in ``trace``); returns the fused trace and its bound symbols.

    What no region took is bound to thunder's always-on executors, exactly as ``transform_for_execution`` ends.
    """
    if not executors:
        return trace, bsyms
    from thunder.executors.passes import _transform_for_operator_executor_execution
    from thunder.extend import get_always_executors

    bsyms = _created_where_used(bsyms)
    trace.bound_symbols = bsyms
    fused = trace
    with lazy_regions.ours():  # regions built when first called (thunder.jit.lazy_regions)
        for ex in executors:
            fused = ex.fusion_pass(fused)
    fused = _transform_for_operator_executor_execution(fused, get_always_executors())
    return fused, list(fused.bound_symbols)


#: Ops that make a tensor from nothing but constants, the same every time (no random numbers: moving one of those
#: would change which numbers it draws).
_CREATIONS = frozenset({"arange", "iota", "full", "zeros", "ones"})


def _created_where_used(bsyms: list[Any]) -> list[Any]:
    """Each tensor made from constants alone moved to just before its first use, so it joins that use's region.

    Why: a GPT's ``arange`` of positions sits at the top of the forward trace, where our pass issues the first
    buckets' collectives; the fusion pass then made it a region of its own (one more region call every step, for
    eight numbers). It reads nothing, so computing it where it is used changes no value and no collective's place.
    """
    first_use: dict[str, int] = {}
    for i, b in enumerate(bsyms):
        for p in b.flat_proxy_args:
            first_use.setdefault(p.name, i)
    moved: dict[int, list[Any]] = {}
    kept: list[tuple[int, Any]] = []
    for i, b in enumerate(bsyms):
        outs = b.flat_proxy_outs
        if b.sym.name in _CREATIONS and not b.flat_proxy_args and outs:
            uses = [first_use[p.name] for p in outs if p.name in first_use]
            if uses and min(uses) > i:
                moved.setdefault(min(uses), []).append(b)
                continue
        kept.append((i, b))
    if not moved:
        return bsyms
    out: list[Any] = []
    for i, b in kept:
        out.extend(moved.pop(i, ()))
        out.append(b)
    return out
