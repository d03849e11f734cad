"""The sync hook: how a parameter our strategies distributed becomes its collectives in thunder's traces.

Why this exists: thunder 0.2.6 only distributes a ``ThunderModule`` through ``fsdp(jit(m))``/``ddp(jit(m))``, which
returns a *second* module whose sharded parameters are invisible to Fabric's wrapper and which cannot be used at
all from a function the user jitted (case 2). The mechanism here works for every case instead:

1. the module's own parameters are sharded (FSDP) or broadcast (DDP) *in place*
   (``thunderviz.thunder.comm.distribute``), so ``model.parameters()`` are the real shards an optimizer must update,
   and no full copy is kept next to them;
2. each such parameter is tagged (``thunder.param_tags.tag_param``: the tag is thunder's format,
   ``distparallel_type``, read by ``thunder.core.proxies.tensorproxy``, and its FSDP padding) with its process group
   and full shape;
3. while thunder traces, the moment a tagged tensor is turned into a proxy we replace it by
   ``thunder.distributed.prims.synchronize(proxy)``, exactly as thunder <= 0.2.0 did in ``JitCtx.proxify``:
   forward all_gather for shards, backward reduce_scatter / all_reduce from synchronize's VJP;
4. fusion executors never take a collective into a fusion region (``thunder.executors``);
5. a parameter that also carries a communication plan (``param_tags.set_comm_config``, see ``parallel.buckets``) is
   recorded in the jitted object's ``CommTransform`` (``thunder.comm.comm_pass``), which buckets and schedules its
   collectives in the final traces; under ZERO3 its gathered value is tagged *recompute in backward*, so thunder's
   autodiff gathers it again from the shard in backward instead of saving the unsharded weight.

The hook is installed once per process and does nothing for tensors that carry no tag, so thunder behaves as
usual for everything our strategies did not set up. Here too: thunder's ``no_sync`` switch (``skip_grad_sync``) and
the DDP attributes it keys its cache on. What thunder holds for a jitted object is read in ``thunder.compile_state``.
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

from thunderviz.thunder.compat import SUPPORTED_THUNDER_VERSIONS, ensure_supported_thunder
from thunderviz.thunder.jit import lazy_regions, shortcuts
from thunderviz.thunder.jit.executors import keep_collectives_out_of_fusions
from thunderviz.thunder.param_tags import comm_config, param_group, recorded_full_shape, replica_group
from thunderviz.thunder.reuse import compile_reuse

# SUPPORTED_THUNDER_VERSIONS and ensure_supported_thunder stay importable from here, as before: the sync hook is what
# the version gate guards.
__all__ = [
    "SUPPORTED_THUNDER_VERSIONS",
    "ensure_supported_thunder",
    "install_sync_hook",
    "is_skipping_grad_sync",
    "mark_module_ddp",
    "skip_grad_sync",
]

_install_lock = threading.Lock()
_installed = False


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


def is_skipping_grad_sync() -> bool:
    """True inside ``skip_grad_sync()`` (thunder's ``no_sync`` switch), where replicated grads are not reduced."""
    from thunder.distributed import get_skip_data_parallel_grad_sync

    return bool(get_skip_data_parallel_grad_sync())


def install_sync_hook() -> None:
    """Patch ``JitCtx.proxify`` once so tagged tensors are synchronized where thunder first sees them.

    Every distribution calls this, so it also keeps collectives out of fusion executors each time: one registered
    since the last call (a user's own TorchCompileExecutor) would take them in as thunder's torchcompile did.
    """
    global _installed
    keep_collectives_out_of_fusions()
    compile_reuse.install()
    shortcuts.install()
    lazy_regions.install()
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
            group = param_group(tensor)
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
    full = recorded_full_shape(value.original_value)
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
    group = param_group(t)
    replicas = replica_group(t)
    return (
        None if group is None else compile_reuse.group_key(group),
        None if replicas is None else compile_reuse.group_key(replicas),
        compile_reuse.plan_key(comm_config(t)),
        repr(recorded_full_shape(t)),
    )


compile_reuse.describe_tensors_with(_reuse_facts)


def _plan_of(args: tuple[Any, ...], module: Any) -> tuple[Any, ...]:
    """``_note_for_comm_pass``'s arguments for ``module``, the module being jitted when a trace is reused: each
    parameter's plan names its own module (accumulators are found by ``config.key``), and ZERO2 / ZERO3 and FSDP's
    bucketings differ only in the plan (the interpreted trace is the same; the tags set here and the buckets the
    communication pass packs from the plan differ: ``compile_reuse.PLAN_NEUTRAL``)."""
    import dataclasses

    p, config, group, gathered, made, replicas = args
    plans = {c.param_name: c for c in (comm_config(t) for t in module.parameters()) if c is not None}
    mine = plans.get(config.param_name)
    neutral = compile_reuse.PLAN_NEUTRAL
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
