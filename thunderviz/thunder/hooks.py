"""Everything that touches lightning-thunder internals, in one place, checked against the installed version.

Why this exists: thunder 0.2.6 only distributes a ``ThunderModule`` through ``fsdp(jit(m))``/``ddp(jit(m))``, which
returns a *second* module whose sharded parameters are invisible to Fabric's wrapper and which cannot be used at
all from a function the user jitted (case 2). The mechanism here works for every case instead:

1. the module's own parameters are sharded (FSDP) or broadcast (DDP) *in place*
(``thunderviz.thunder.comm.distribute``),
   so ``model.parameters()`` are the real shards an optimizer must update, and no full copy is kept next to them;
2. each such parameter is tagged (``tag_param`` here, because the tag is thunder's format: ``distparallel_type``,
   read by ``thunder.core.proxies.tensorproxy``, and its FSDP padding) with its process group and full shape;
3. while thunder traces, the moment a tagged tensor is turned into a proxy we replace it by
   ``thunder.distributed.prims.synchronize(proxy)``, exactly as thunder <= 0.2.0 did in ``JitCtx.proxify``:
   forward all_gather for shards, backward reduce_scatter / all_reduce from synchronize's VJP;
4. fusion executors never take a collective into a fusion region (``thunder.executors``);
5. a parameter that also carries a communication plan (``set_comm_config``, see ``parallel.buckets``) is recorded in
   the jitted object's ``CommTransform`` (``thunder.comm.comm_pass``), which buckets and schedules its collectives in
   the
   final traces; under ZERO3 its gathered value is tagged *recompute in backward*, so thunder's autodiff gathers it
   again from the shard in backward instead of saving the unsharded weight.

The hook is installed once per process and does nothing for tensors that carry no tag, so thunder behaves as
usual for everything our strategies did not set up.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as tdist

from thunderviz.thunder.capture.snapshot import dtype_name
from thunderviz.thunder.compat import SUPPORTED_THUNDER_VERSIONS, ensure_supported_thunder
from thunderviz.thunder.jit.executors import keep_collectives_out_of_fusions
from thunderviz.thunder.reuse import compile_reuse

__all__ = [
    "SUPPORTED_THUNDER_VERSIONS",
    "SyncKind",
    "accumulator",
    "backward_traces_of_last_run",
    "cached_trace_count",
    "call_count",
    "clear_all_trace_caches",
    "clear_trace_cache",
    "comm_buckets",
    "comm_config",
    "compile_key",
    "ensure_supported_thunder",
    "estimated_peak_bytes",
    "fsdp_enums",
    "full_shape",
    "has_run",
    "has_traces",
    "install_sync_hook",
    "is_jitted",
    "is_skipping_grad_sync",
    "is_thunder_module",
    "jit",
    "mark_module_ddp",
    "original_module",
    "param_group",
    "rebind_module_tensors",
    "replica_group",
    "saved_for_backward",
    "saved_tensors",
    "set_accumulator",
    "set_comm_config",
    "skip_grad_sync",
    "sync_tag",
    "tag_param",
    "thunder_distributed_kind",
    "thunder_module_type",
    "trace_accumulated",
    "trace_buckets",
]

# Attribute names we put on parameters. ``distparallel_type`` and ``_thunder_fsdp_padding_size`` are thunder's own
# (read by ``tensorproxy``); the group is ours.
_TYPE_ATTR = "distparallel_type"
_PADDING_ATTR = "_thunder_fsdp_padding_size"
_GROUP_ATTR = "_thunderviz_process_group"
_REPLICA_GROUP_ATTR = "_thunderviz_replica_group"
_FULL_SHAPE_ATTR = "_thunderviz_full_shape"
_COMM_ATTR = "_thunderviz_comm"
_ACCUMULATOR_ATTR = "_thunderviz_accumulator"

_install_lock = threading.Lock()
_installed = False


class SyncKind:
    """The two ways a parameter can be distributed; values are thunder's ``DistParallelType`` names."""

    FULLY_SHARDED = "FULLY_SHARDED"
    REPLICATED = "REPLICATED"


def _dist_type(kind: str) -> Any:
    from thunder.core.proxies import DistParallelType

    return getattr(DistParallelType, kind)


def tag_param(
    param: torch.Tensor,
    kind: str,
    *,
    group: tdist.ProcessGroup,
    padding: int,
    full_shape: tuple[int, ...],
    replica_group: tdist.ProcessGroup | None = None,
) -> None:
    """Mark a parameter our strategies distributed, in the attributes thunder and our sync hook read.

    ``replica_group`` (hybrid sharding): the ranks that hold this same shard; its reduced gradient is all-reduced
    over them. thunder knows nothing of it: the communication pass adds that all_reduce.
    """
    setattr(param, _TYPE_ATTR, _dist_type(kind))
    setattr(param, _PADDING_ATTR, padding if padding else None)
    setattr(param, _GROUP_ATTR, group)
    setattr(param, _FULL_SHAPE_ATTR, tuple(full_shape))
    setattr(param, _REPLICA_GROUP_ATTR, replica_group)


def sync_tag(param: torch.Tensor) -> str | None:
    """The SyncKind a parameter was tagged with by ``tag_param``, or None."""
    if getattr(param, _GROUP_ATTR, None) is None:
        return None
    return getattr(param, _TYPE_ATTR).name


def param_group(param: torch.Tensor) -> tdist.ProcessGroup | None:
    """The process group a tagged parameter is distributed over (None when untagged)."""
    return getattr(param, _GROUP_ATTR, None)


def replica_group(param: torch.Tensor) -> tdist.ProcessGroup | None:
    """Hybrid sharding: the group over which a sharded parameter is replicated (None otherwise)."""
    return getattr(param, _REPLICA_GROUP_ATTR, None)


def full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The unsharded shape of a tagged parameter (its own shape when untagged)."""
    return tuple(getattr(param, _FULL_SHAPE_ATTR, tuple(param.shape)))


def set_comm_config(param: torch.Tensor, config: Any) -> None:
    """Attach a parameter's communication plan (a ``parallel.buckets.CommConfig``); traces made later follow it."""
    if sync_tag(param) is None:
        raise ValueError("set_comm_config: the parameter is not distributed by thunderviz (no sync tag)")
    setattr(param, _COMM_ATTR, config)


def comm_config(param: torch.Tensor) -> Any:
    """The ``CommConfig`` attached by ``set_comm_config``, or None."""
    return getattr(param, _COMM_ATTR, None)


def set_accumulator(param: torch.Tensor, key: str, name: str) -> Any:
    """Give a sharded parameter the ``GradAccumulator`` its no_backward_sync gradients go to (kept if it has one)."""
    from thunderviz.thunder.comm import accumulation

    found = getattr(param, _ACCUMULATOR_ATTR, None)
    if found is None:
        found = accumulation.GradAccumulator(name, key)
        setattr(param, _ACCUMULATOR_ATTR, found)
    return accumulation.register(found, key)


def accumulator(param: torch.Tensor) -> Any:
    """The parameter's ``GradAccumulator`` (``thunder.comm.accumulation``), or None."""
    return getattr(param, _ACCUMULATOR_ATTR, None)


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


def mark_module_ddp(module: torch.nn.Module, jitted: Any, group: tdist.ProcessGroup, bucket_size_in_mb: float) -> None:
    """Set the attributes thunder reads to treat a jitted module as DDP, exactly as ``thunder.distributed.ddp`` does.

    They make thunder key the module's cache on ``no_sync`` and bucket the gradient all-reduces.
    """
    import thunder

    module.use_ddp = True
    module.process_group_for_ddp = group
    module.bucket_size_in_mb = bucket_size_in_mb
    if jitted is not None:
        thunder.compile_data(jitted).process_group_for_ddp = group


@contextmanager
def skip_grad_sync() -> Iterator[None]:
    """Within this block, replicated (DDP) gradients are not all-reduced (thunder's ``no_sync`` switch)."""
    from thunder.distributed import reset_skip_data_parallel_grad_sync, set_skip_data_parallel_grad_sync

    token = set_skip_data_parallel_grad_sync(True)
    try:
        yield
    finally:
        reset_skip_data_parallel_grad_sync(token)


def install_sync_hook() -> None:
    """Patch ``JitCtx.proxify`` once so tagged tensors are synchronized where thunder first sees them.

    Every distribution calls this, so it also keeps collectives out of fusion executors each time: one registered
    since the last call (a user's own TorchCompileExecutor) would take them in as thunder's torchcompile did.
    """
    global _installed
    keep_collectives_out_of_fusions()
    compile_reuse.install()
    with _install_lock:
        if _installed:
            return
        ensure_supported_thunder()
        from thunder.core import jit_ext

        original = jit_ext.JitCtx.proxify

        @functools.wraps(original)
        def proxify(self: Any, value: Any) -> Any:
            already_proxied = value.original_value is not value.nothing
            p = original(self, value)
            if already_proxied:
                return p
            tensor = value.original_value
            group = getattr(tensor, _GROUP_ATTR, None)
            if group is None:
                return p
            # A tied parameter reached through a second attribute path is the same tensor: reuse its gathered
            # value so it is communicated once, as thunder's own FSDP does for shared parameters.
            seen = self.__dict__.setdefault("_thunderviz_synced", {})
            if id(tensor) in seen:
                value.value = seen[id(tensor)]
                return seen[id(tensor)]
            seen[id(tensor)] = synced = _synchronized(value, p, group)
            return synced

        proxify.__thunderviz_original__ = original  # type: ignore[attr-defined]
        jit_ext.JitCtx.proxify = proxify
        _guard_sort_waits()
        _installed = True


def _guard_sort_waits() -> None:
    """Leave the collectives of planned parameters in program order for the communication pass.

    thunder sorts the joint forward-backward trace before splitting it (``thunder.distributed.utils.maybe_sort_waits``,
    looked up by name on every new cache entry): all collectives first, each wait only when nothing else can run.
    That scrambles program order — which block's parameters are needed first — and the communication pass
    (``thunder.comm.comm_pass``) schedules these collectives itself, one bucket ahead of use. Traces without planned
    parameters are sorted as before.
    """
    import importlib

    dist_utils = importlib.import_module("thunder.distributed.utils")  # `thunder.distributed.utils` is shadowed

    original = dist_utils.maybe_sort_waits

    @functools.wraps(original)
    def maybe_sort_waits(trace: Any) -> tuple[bool, Any]:
        from thunder.core.compile_data import get_compile_data

        from thunderviz.thunder.comm.comm_pass import comm_transform_of

        cd = get_compile_data()
        t = comm_transform_of(cd) if cd is not None else None
        if t is not None and t.current:
            # Report it as transformed, exactly when thunder would have sorted it: the caller then keeps this
            # executor-claimed trace, which thunder's own DDP bucketing (meant for `thunder.distributed.ddp`'s
            # module attributes) passes over, as it does after sorting.
            return dist_utils.has_wait_prims(trace), trace
        return original(trace)

    maybe_sort_waits.__thunderviz_original__ = original  # type: ignore[attr-defined]
    dist_utils.maybe_sort_waits = maybe_sort_waits


def _synchronized(value: Any, p: Any, group: tdist.ProcessGroup) -> Any:
    """Replace the just-made proxy of a tagged parameter by its synchronized (gathered / replicated) value."""
    from thunder.core.proxies import TensorProxy
    from thunder.distributed import prims as dist_prims

    if not isinstance(p, TensorProxy):
        return p
    config = comm_config(value.original_value)
    made = [dist_prims.synchronize(p, group, p.distparallel_type)]
    padding = p.thunder_fsdp_padding_size
    if isinstance(padding, int) and padding > 0:
        made.append(made[-1][: made[-1].shape[0] - padding])
    gathered = tuple(made)
    full = getattr(value.original_value, _FULL_SHAPE_ATTR, None)
    if full is not None and tuple(made[-1].shape) != tuple(full):
        # A 0-dim parameter was sharded as shape (1,). Its reshape is not recomputed: thunder 0.2.6's recompute pass
        # then feeds the reshape a wrong input in backward, and keeping 4 bytes for backward costs nothing.
        made.append(made[-1].reshape(full))
    synced = made[-1]
    if config is not None:
        _note_for_comm_pass(p, config, group, gathered, tuple(made), replica_group(value.original_value))
    # The prologue must still unpack and check the local shard (``p``); the computation sees ``synced``.
    value.value = synced
    _key_cache_on_no_sync(group)
    return synced


def _reuse_facts(t: torch.Tensor) -> tuple[Any, ...]:
    """What compile reuse's key must know of a tensor beyond its metadata: what we attached to it."""
    group = getattr(t, _GROUP_ATTR, None)
    replicas = getattr(t, _REPLICA_GROUP_ATTR, None)
    return (
        None if group is None else compile_reuse.group_key(group),
        None if replicas is None else compile_reuse.group_key(replicas),
        compile_reuse.plan_key(comm_config(t)),
        repr(getattr(t, _FULL_SHAPE_ATTR, None)),
    )


compile_reuse.describe_tensors_with(_reuse_facts)


def _plan_of(args: tuple[Any, ...], module: Any) -> tuple[Any, ...]:
    """``_note_for_comm_pass``'s arguments for ``module``, the module being jitted when a trace is reused: each
    parameter's plan names its own module (accumulators are found by ``config.key``), and ZERO2 / ZERO3 differ only
    in the plan (the interpreted trace is the same; the tags set here from the plan differ)."""
    import dataclasses

    p, config, group, gathered, made, replicas = args
    plans = {c.param_name: c for c in (comm_config(t) for t in module.parameters()) if c is not None}
    mine = plans.get(config.param_name)
    neutral = {"owner_id": 0, "reshard_after_forward": False}
    if mine is None or dataclasses.replace(mine, **neutral) != dataclasses.replace(config, **neutral):
        raise compile_reuse.NotReusable(f"{config.param_name} has no matching plan in the module set up now")
    return (p, mine, group, gathered, made, replicas)


@compile_reuse.recorded(rebind=_plan_of)
def _note_for_comm_pass(
    p: Any, config: Any, group: tdist.ProcessGroup, gathered: Any, made: Any, replicas: tdist.ProcessGroup | None
) -> None:
    """Record the parameter for the communication pass and set what its plan asks of the trace.

    ZERO3 (``reshard_after_forward``): the gathered value (and its unpadded slice, ``gathered``) is tagged
    *recompute in backward* — thunder's own activation-checkpointing tag (``ProxyTag.RECOMPUTE_IN_BACKWARD``, read
    by ``thunder.transforms.autodiff``) — so the backward gets its own all_gather of the shard and forward saves the
    shard (an input anyway) instead of the unsharded weight. ZERO2: the tag is taken off (a reused trace may carry
    it from a ZERO3 run), and everything ``made`` from the gathered value must stay saved for backward, even when the
    parameter is first read inside a checkpointed region.
    """
    from thunder.core.compile_data import get_compile_data
    from thunder.core.proxies import ProxyTag

    from thunderviz.thunder.comm.comm_pass import ParamRecord, ensure_comm_transform

    recompute = bool(config.reshard_after_forward)
    for proxy in gathered:
        if recompute:
            proxy.tags.add(ProxyTag.RECOMPUTE_IN_BACKWARD)
        else:
            proxy.tags.discard(ProxyTag.RECOMPUTE_IN_BACKWARD)
    cd = get_compile_data()
    if cd is None:
        return
    t = ensure_comm_transform(cd)
    replica_world = tdist.get_world_size(replicas) if replicas is not None else 1
    t.note_param(p.name, ParamRecord(config, group, tdist.get_world_size(group), replicas, replica_world))
    t.note_kept(() if recompute else made)


@compile_reuse.recorded
def _key_cache_on_no_sync(group: tdist.ProcessGroup) -> None:
    """Make the jitted object key its cache on ``no_sync``, as thunder does for its own DDP modules.

    thunder records ``no_grad_sync`` in the cache key only for callables with ``use_ddp``; a function the user jitted
    (case 2), and any FSDP module, has none, so a trace made outside ``no_backward_sync`` would be reused inside it
    (or the reverse): DDP would all_reduce where it should accumulate, FSDP reduce_scatter every micro-batch. With
    ``use_ddp`` on a module, thunder's own DDP gradient bucketing asks for ``process_group_for_ddp``; it then passes
    over our traces (their waits are claimed by the torch executor already, see ``_guard_sort_waits``).
    """
    import thunder
    from thunder.core.compile_data import get_compile_data
    from thunder.distributed import get_skip_data_parallel_grad_sync

    cd = get_compile_data()
    if cd is None:
        return
    if not getattr(cd.fn, "use_ddp", False):
        # A bound method refuses the attribute: it is keyed for this trace only, retraced when the mode differs.
        with contextlib.suppress(AttributeError):
            cd.fn.use_ddp = True
    if cd.is_module and getattr(cd, "process_group_for_ddp", None) is None:
        cd.process_group_for_ddp = group
    thunder._get_cache_info()["no_grad_sync"] = bool(get_skip_data_parallel_grad_sync())


# -- Accessors for the strategies and the decision table (thunder internals are read only here) ----------------


def cached_trace_count(obj: Any) -> int:
    """How many traces a jitted object has cached (0 when it never ran or is not jitted)."""
    import thunder

    cs = thunder.compile_stats(obj)
    return len(cs.interpreter_cache) if cs is not None else 0


def is_skipping_grad_sync() -> bool:
    """True inside ``skip_grad_sync()`` (thunder's ``no_sync`` switch), where replicated grads are not reduced."""
    from thunder.distributed import get_skip_data_parallel_grad_sync

    return bool(get_skip_data_parallel_grad_sync())


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
