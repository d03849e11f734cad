"""What thunder holds for a jitted object, read (and reset) in one place: whether and how often it ran, its cached
traces and compile key, the traces of its last run and what they save and communicate, and ``thunder.jit`` itself.

The strategies, the decision table, capture and the rank's cell hooks ask these questions; only this module (with
the sync hook, ``thunder.hooks``) reads thunder's ``compile_stats`` / ``compile_data`` internals for them, so a
thunder release that moves one changes one place. thunder is imported inside each function, when it is asked.
"""

from __future__ import annotations

from typing import Any

import torch

from thunderviz.thunder.capture.snapshot import dtype_name

__all__ = [
    "backward_traces_of_last_run",
    "cached_trace_count",
    "call_count",
    "clear_all_trace_caches",
    "clear_trace_cache",
    "comm_buckets",
    "compile_key",
    "estimated_peak_bytes",
    "fsdp_enums",
    "has_run",
    "has_traces",
    "is_jitted",
    "is_thunder_module",
    "jit",
    "original_module",
    "rebind_module_tensors",
    "saved_for_backward",
    "saved_tensors",
    "thunder_distributed_kind",
    "thunder_module_type",
    "trace_accumulated",
    "trace_buckets",
]


def backward_traces_of_last_run(jitted: Any) -> list[Any]:
    """The backward traces of the cache entry the last call ran.

    ``thunder.last_backward_traces`` is only updated when an entry is *built*; on a cache hit thunder updates
    ``last_traces`` alone. With two entries (a synchronizing and a no_backward_sync micro-batch), the two would then
    describe different entries; the entry whose forward is ``last_traces`` has the matching backward.
    """
    import thunder

    cs = thunder.compile_stats(jitted)
    if cs is None or cs.last_traces is None:
        return []
    for entry in cs.interpreter_cache:
        if getattr(entry, "computation_traces", None) is cs.last_traces:
            return list(entry.backward_traces or [])
    return list(cs.last_backward_traces or [])


def comm_buckets(jitted: Any) -> dict[str, list[Any]]:
    """How the last trace built for ``jitted`` packed its collectives: ``{"forward": [Bucket], "backward": [...]}``.

    Empty when no parameter of the traced call carried a communication plan.
    """
    import thunder

    from thunderviz.thunder.comm.comm_pass import comm_transform_of

    cd = thunder.compile_data(jitted)
    t = comm_transform_of(cd) if cd is not None else None
    return dict(t.buckets) if t is not None else {}


def saved_tensors(forward_trace: Any) -> list[Any]:
    """The tensor proxies a forward execution trace keeps for backward (empty for a trace without backward).

    thunder's split forward returns ``(outputs, (saved_tensors, saved_other))``; this is what stays alive between
    forward and backward on top of the parameters, so ZERO3 keeping shards instead of unsharded weights shows here.
    """
    from thunder.core.proxies import TensorProxy

    ret = forward_trace.bound_symbols[-1] if forward_trace.bound_symbols else None
    if ret is None or len(ret.args) < 2 or not isinstance(ret.args[1], (tuple, list)) or not ret.args[1]:
        return []
    return [t for t in ret.args[1][0] if isinstance(t, TensorProxy)]


def saved_for_backward(forward_trace: Any) -> list[tuple[str, tuple[int, ...], str, int]]:
    """``saved_tensors`` as plain data: ``(name, shape, dtype, bytes)`` each (dtype like ``float32``)."""
    return [
        (t.name, tuple(int(d) for d in t.shape), dtype_name(t.dtype), int(t.numel * t.dtype.bytes))
        for t in saved_tensors(forward_trace)
    ]


def trace_buckets(trace: Any) -> list[Any]:
    """The buckets (``parallel.buckets.Bucket``) the communication pass laid out in this very execution trace."""
    return list(getattr(trace, "_thunderviz_buckets", None) or [])


def trace_accumulated(trace: Any) -> list[Any]:
    """The gradient buckets this backward trace adds to no_backward_sync accumulators instead of reducing them."""
    return list(getattr(trace, "_thunderviz_accumulated", None) or [])


def estimated_peak_bytes(trace: Any) -> int:
    """thunder's own estimate of a trace's peak memory (``thunder.examine.memory_calculation``), in bytes."""
    from thunder.examine.memory_calculation import get_alloc_memory

    return int(get_alloc_memory(trace)[0])


def is_jitted(obj: Any) -> bool:
    """True for anything ``thunder.jit`` returned: a ThunderModule or a jitted function."""
    import thunder

    try:
        return thunder.compile_data(obj) is not None
    except Exception:
        return False


def is_thunder_module(obj: Any) -> bool:
    from thunder.core.module import ThunderModule

    return isinstance(obj, ThunderModule)


def has_run(obj: Any) -> bool:
    """True once a jitted object has been traced (called at least once)."""
    import thunder

    cs = thunder.compile_stats(obj)
    if cs is None:
        return False
    return cs.last_traces is not None or len(cs.interpreter_cache) > 0


def thunder_distributed_kind(obj: Any) -> str | None:
    """'fsdp' or 'ddp' when thunder's own ``fsdp()``/``ddp()`` already transformed this ThunderModule, else None."""
    import thunder

    cd = thunder.compile_data(obj)
    if cd is None:
        return None
    if getattr(cd, "use_fsdp", False):
        return "fsdp"
    if getattr(cd, "use_ddp", False):
        return "ddp"
    return None


def clear_trace_cache(obj: Any) -> int:
    """Drop a jitted object's cached traces so the next call retraces with the synchronize collectives.

    Needed because a cache entry made before sharding can still pass the prologue's checks (DDP keeps shapes; an
    FSDP parameter with first dim 1 keeps its shape once padded), and would then run without any collectives.
    """
    import thunder

    cs = thunder.compile_stats(obj)
    if cs is None:
        return 0
    n = len(cs.interpreter_cache)
    cs.interpreter_cache.clear()
    return n


def clear_all_trace_caches() -> int:
    """Drop the cached traces of every live jitted object, found through the garbage collector; return how many.

    Case 2 cannot know which jitted function will receive the model, and a function jitted and called before
    ``fabric.setup`` holds a stale entry; clearing every such cache is cheap (one retrace) and always correct.
    """
    import gc

    from thunder.common import CompileStats

    stale = [o for o in gc.get_objects() if type(o) is CompileStats and len(o.interpreter_cache) > 0]
    for stats in stale:
        stats.interpreter_cache.clear()
    return len(stale)


def cached_trace_count(obj: Any) -> int:
    """How many traces a jitted object has cached (0 when it never ran or is not jitted)."""
    import thunder

    cs = thunder.compile_stats(obj)
    return len(cs.interpreter_cache) if cs is not None else 0


def rebind_module_tensors(jitted: Any, replaced: dict[int, torch.Tensor]) -> int:
    """Point a ThunderModule's parameter and buffer tables at new tensor objects; return how many were re-pointed.

    ``ThunderModule`` copies ``named_parameters()``/``named_buffers()`` of the user's module into its own tables when
    it is created, so after a meta-device model gets real ``Parameter`` objects (``{id(old): new}``), the tables
    would still hand thunder the old meta tensors.
    """
    count = 0
    for table in (jitted._overrides_parameters, jitted._overrides_buffers):
        for name, tensor in list(table.items()):
            if id(tensor) in replaced:
                table[name] = replaced[id(tensor)]
                count += 1
    return count


def original_module(jitted: Any) -> torch.nn.Module:
    """The user's ``nn.Module`` inside a ThunderModule (whose parameters our strategies distribute in place)."""
    return jitted._model


def jit(fn: Any, **options: Any) -> Any:
    """``thunder.jit`` itself: the strategies call thunder only through this package."""
    import thunder

    return thunder.jit(fn, **options)


def compile_key(obj: Any) -> int:
    """One key per compiled object: Fabric's wrapper and the ThunderModule inside it share compile data, so they are
    one object to capture, count and report; anything not jitted is keyed by itself."""
    import thunder

    try:
        data = thunder.compile_data(obj)
    except Exception:
        data = None
    return id(data) if data is not None else id(obj)


def call_count(obj: Any) -> int:
    """How often a jitted object has been called (0 for anything else), so a cell can tell what it ran."""
    import thunder

    try:
        stats = thunder.compile_stats(obj)
    except Exception:
        return 0
    return int(getattr(stats, "calls", 0) or 0) if stats is not None else 0


def has_traces(obj: Any) -> bool:
    """True once thunder kept execution traces for ``obj`` (``thunder.last_traces`` would answer)."""
    import thunder

    try:
        stats = thunder.compile_stats(obj)
    except Exception:
        return False
    return stats is not None and stats.last_traces is not None


def thunder_module_type() -> type:
    """``thunder.core.module.ThunderModule``, for code that must patch or test against the class itself."""
    from thunder.core.module import ThunderModule

    return ThunderModule


def fsdp_enums() -> tuple[type, type]:
    """thunder's ``(FSDPType, FSDPBucketingStrategy)``: the strategies hand options back as thunder's own enums."""
    from thunder.distributed import FSDPBucketingStrategy, FSDPType

    return FSDPType, FSDPBucketingStrategy
