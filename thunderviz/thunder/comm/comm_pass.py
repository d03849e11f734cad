"""Rewriting thunder's execution traces so parameter collectives go in buckets, early, and are waited for late.

Why a pass on the *execution* traces: thunder 0.2.6 turns each distributed parameter into one collective (forward
``all_gather``, backward ``reduce_scatter`` / ``all_reduce`` from ``synchronize``'s VJP), and its own bucketing
passes (``FSDPCommBucketing``, ``apply_bucketing_to_grad_allreduce``) never run on our path: the first reads
attributes of ``thunder.distributed.fsdp``'s module, the second looks for ``dist_prims.WAIT`` in a trace whose waits
were already claimed by the torch executor. The final forward and backward traces are where every executor
(torch, nvFuser, torch.compile) has made its choices, so moving collectives there cannot disturb a fusion, and
thunder offers exactly this hook: ``Transform.transform_trace_post_optimization``, called on the forward and then
the backward trace of every new cache entry.

What the pass does (``CommTransform``):

- forward (and, for ZERO3, backward) ``all_gather``: the parameters of one bucket (``parallel.buckets``) are packed into
  one flat buffer of local shards, gathered once, and unpacked into the same unsharded tensors the rest of the
  trace already uses. Buckets are issued in order of first use, one bucket ahead: bucket k+1's all_gather is issued
  just before bucket k is waited for, so its transfer overlaps bucket k's compute, and at most two unsharded
  buckets exist beyond those still in use.
- backward ``reduce_scatter`` (FSDP) / ``all_reduce`` (DDP): the gradients of one bucket are packed — and divided by
  the world size once, instead of once per gradient — as soon as the last of them exists, reduced in one collective,
  and waited for: a ``reduce_scatter`` when the next bucket is issued (or at the return), an ``all_reduce`` just
  before the backward returns. The results are views of the reduced buffer. Why a reduce_scatter is not left until
  the return: its input, the bucket's unsharded gradients, lives until its wait, so waiting at the return kept every
  bucket's unsharded gradients to the end of backward (planned for Llama-2-70B under ZERO3 on 64 ranks: 124 GiB of
  them at the peak); one in flight while the next bucket's gradients are computed is what FSDP2 keeps too. DDP's
  buckets are the gradients themselves (``.grad`` become views of them), so waiting earlier would free nothing.
- hybrid sharding (a parameter with a replica group, ``ParamRecord.replica_group``): the gathers and
  reduce_scatters run in the shard group as above, the pack divides by the whole world (shard x replicas), and each
  reduced shard is all-reduced in place across the replica group, issued when the next gradient bucket is issued
  (so the reduce_scatter overlaps the compute before it) and waited for with the others before the return; it is
  a bucket of its own (``mesh_group="replica"``).
- ZERO3 is not this pass's work: ``thunder_hooks`` tags the gathered parameter as *recomputed in backward* before
  autodiff, so thunder's own rematerialization puts a second ``all_gather`` of the shard in the backward trace and
  saves the shard, not the unsharded weight, for backward; this pass then buckets and schedules those gathers too.

Parameters are recognised by the shard's proxy name, recorded while tracing (``note_param``); collectives of
anything else are left alone, and so is a trace with no configured parameter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as tdist
from thunder.core.proxies import Proxy
from thunder.core.trace import TraceTag, from_trace
from thunder.core.transform_common import Transform

from thunderviz.parallel.buckets import CommConfig, group_in_order, size_capped
from thunderviz.thunder.capture.snapshot import dtype_name
from thunderviz.thunder.comm.collectives import executed_collective_ids
from thunderviz.thunder.comm.fusion_regions import open_regions, refuse
from thunderviz.thunder.compat import ensure_supported_thunder
from thunderviz.trace.buckets import Bucket

ensure_supported_thunder()  # everything below reads thunder 0.2.6's trace format

__all__ = [
    "CommTransform",
    "ParamRecord",
    "comm_transform_of",
    "ensure_comm_transform",
]


@dataclass(frozen=True)
class ParamRecord:
    """What the pass needs about one distributed parameter, recorded when thunder first proxies it."""

    config: CommConfig
    group: tdist.ProcessGroup
    world: int
    #: hybrid sharding: the ranks holding this same shard (one per shard group), over which the reduce_scatter's
    #: result is all-reduced; None when the parameter is sharded over every rank
    replica_group: tdist.ProcessGroup | None = None
    replicas: int = 1


# -- the operators the pass inserts (torch code, run by the trace) ---------------------------------------------------


def _pack_gather_impl(shards: list[torch.Tensor], label: str, names: tuple[str, ...]) -> torch.Tensor:
    return torch.cat([s.reshape(-1) for s in shards])


def _unpack_gather_impl(
    buffer: torch.Tensor, sent: torch.Tensor, full_shapes: tuple[tuple[int, ...], ...], world: int, label: str
) -> list[torch.Tensor]:
    # The gathered buffer is [rank 0's shards | rank 1's shards | ...]; parameter i is column block i of the
    # (world, n) view, which one split_with_sizes_copy writes into each parameter's own storage (as FSDP2 does).
    _free(sent)
    rows = buffer.view(world, -1)
    sizes = [math.prod(s) // world for s in full_shapes]
    outs = [torch.empty((world, n), dtype=buffer.dtype, device=buffer.device) for n in sizes]
    torch.split_with_sizes_copy(rows, sizes, dim=1, out=outs)
    _free(buffer)
    return [o.view(s) for o, s in zip(outs, full_shapes, strict=True)]


def _free(buffer: torch.Tensor) -> None:
    """Free a bucket's communication buffer now, whoever else still holds it (FSDP's own way: storage resized to 0).

    Why not leave it to reference counting: gloo's worker thread keeps its work object, and with it the
    ``all_gather``'s input and output, until after ``wait()`` has returned (measured on 4 ranks: in about 20% of 3000
    waits neither had died when the last Python reference went). The buffers then died whenever that thread next
    ran, on oversubscribed cores after the next allocations, and a rank's measured peak moved up by a bucket or a
    shard in 4 of 600 rank measurements of two bench runs. The unpack is the first point after the wait, and the
    buffers are the pass's own (the pack's result and the collective's), so nothing else reads them. The rehearsal
    counts the same frees: ``StorageTracker`` follows storage resizes as ``MemTracker`` does.
    """
    buffer.untyped_storage().resize_(0)


def _with_accumulated(grads: list[torch.Tensor], keys: tuple[str, ...], world: int, divide: bool) -> list[torch.Tensor]:
    """The synchronizing backward's gradients plus what no_backward_sync micro-batches accumulated for them.

    ``divide``: the pack divides by the world size afterwards (it gets undivided gradients); otherwise the gradients
    arrive divided already and so must the accumulated sums.
    """
    from thunderviz.thunder.comm import accumulation

    out = []
    for g, key in zip(grads, keys, strict=True):
        undivided, divided = accumulation.lookup(key).take()
        if undivided is not None or divided is not None:
            total = g.to(undivided.dtype if undivided is not None else divided.dtype)
            if undivided is not None:
                total = total + (undivided if divide else undivided / world)
            if divided is not None:
                total = total + (divided * world if divide else divided)
            g = total
        out.append(g)
    return out


def _cast(buffer: torch.Tensor, dtype_name: str | None) -> torch.Tensor:
    return buffer if dtype_name is None else buffer.to(getattr(torch, dtype_name))


def _pack_scatter_impl(
    grads: list[torch.Tensor],
    world: int,
    divide: bool,
    label: str,
    names: tuple[str, ...],
    reduce_dtype: str | None = None,
    accumulated: tuple[str, ...] = (),
    replicas: int = 1,
) -> torch.Tensor:
    """``replicas`` (hybrid sharding): the result is also all-reduced over that many replicas, so the division is by
    ``world * replicas`` (only by ``replicas`` when the gradients arrive divided by ``world`` already)."""
    if accumulated:
        grads = _with_accumulated(grads, accumulated, world, divide)
    divisor = world * replicas if divide else replicas
    # Rank r must receive [grad 0's rows for r | grad 1's rows for r | ...]: interleave the dim-0 chunks.
    if len(grads) == 1:
        flat = _cast(grads[0].reshape(-1), reduce_dtype)
        return flat / divisor if divisor != 1 else flat
    buffer = _cast(torch.cat([g.reshape(world, -1) for g in grads], dim=1).view(-1), reduce_dtype)
    return buffer.div_(divisor) if divisor != 1 else buffer


def _pack_flat_impl(
    grads: list[torch.Tensor],
    world: int,
    divide: bool,
    label: str,
    names: tuple[str, ...],
    reduce_dtype: str | None = None,
    accumulated: tuple[str, ...] = (),
    replicas: int = 1,
) -> torch.Tensor:
    if len(grads) == 1:
        flat = grads[0].reshape(-1)
        if divide:
            return _cast(flat, reduce_dtype) / world
        # all_reduce works in place: never on the caller's tensor (a cast to another dtype is a copy already)
        return (
            flat.clone()
            if reduce_dtype is None or flat.dtype == getattr(torch, reduce_dtype)
            else _cast(flat, reduce_dtype)
        )
    buffer = _cast(torch.cat([g.reshape(-1) for g in grads]), reduce_dtype)
    return buffer.div_(world) if divide else buffer


def _unpack_views_impl(
    buffer: torch.Tensor, shapes: tuple[tuple[int, ...], ...], label: str, out_dtype: str | None = None
) -> list[torch.Tensor]:
    sizes = [math.prod(s) for s in shapes]
    pieces = torch.split(_cast(buffer, out_dtype), sizes)
    return [piece.view(s) for piece, s in zip(pieces, shapes, strict=True)]


def _accumulate_impl(
    grads: list[torch.Tensor], keys: tuple[str, ...], divided: bool, dtypes: tuple[str, ...], label: str
) -> torch.Tensor:
    from thunderviz.thunder.comm import accumulation

    for g, key, dtype in zip(grads, keys, dtypes, strict=True):
        accumulation.lookup(key).add(g, divided=divided, dtype=getattr(torch, dtype))
    return grads[0]


def _flat_meta(tensors: Sequence[Any], numel: int) -> Any:
    from thunder.core.proxies import TensorProxy

    first = tensors[0]
    return TensorProxy(shape=(numel,), device=first.device, dtype=first.dtype, requires_grad=False)


def _pack_gather_meta(shards: list[Any], label: str, names: tuple[str, ...]) -> Any:
    return _flat_meta(shards, sum(s.numel for s in shards))


def _pack_reduce_meta(
    grads: list[Any],
    world: int,
    divide: bool,
    label: str,
    names: tuple[str, ...],
    reduce_dtype: str | None = None,
    accumulated: tuple[str, ...] = (),
    replicas: int = 1,
) -> Any:
    from thunder.core.proxies import TensorProxy

    flat = _flat_meta(grads, sum(g.numel for g in grads))
    if reduce_dtype is None:
        return flat
    return TensorProxy(like=flat, dtype=_thunder_dtype(reduce_dtype))


def _thunder_dtype(name: str) -> Any:
    from thunder.core import dtypes

    return dtypes.to_dtype(getattr(torch, name))


def _accumulate_meta(grads: list[Any], keys: tuple, divided: bool, dtypes: tuple, label: str) -> Any:
    from thunder.core.proxies import TensorProxy

    return TensorProxy(like=grads[0])


def _unpack_gather_meta(buffer: Any, sent: Any, full_shapes: tuple, world: int, label: str) -> list[Any]:
    from thunder.core.proxies import TensorProxy

    return [TensorProxy(like=buffer, shape=tuple(s)) for s in full_shapes]


def _unpack_views_meta(buffer: Any, shapes: tuple, label: str, out_dtype: str | None = None) -> list[Any]:
    from thunder.core.proxies import TensorProxy

    dtype = buffer.dtype if out_dtype is None else _thunder_dtype(out_dtype)
    return [TensorProxy(like=buffer, shape=tuple(s), dtype=dtype) for s in shapes]


class _Ops:
    """The executor and symbols, created on first use (importing thunder costs seconds)."""

    _instance: _Ops | None = None

    def __init__(self) -> None:
        from thunder.core import prims
        from thunder.examine.memory_calculation import register_memory_calculate_function, track_alias_op_memory
        from thunder.extend import OperatorExecutor, register_executor

        ex = OperatorExecutor("thunderviz_comm", version="1")
        register_executor(ex)
        self.pack_gather = ex.register_operator(
            "thunderviz_pack_for_all_gather", meta=_pack_gather_meta, fn=_pack_gather_impl
        )
        self.unpack_gather = ex.register_operator(
            "thunderviz_unpack_all_gather", meta=_unpack_gather_meta, fn=_unpack_gather_impl
        )
        self.pack_scatter = ex.register_operator(
            "thunderviz_pack_for_reduce_scatter", meta=_pack_reduce_meta, fn=_pack_scatter_impl
        )
        self.pack_flat = ex.register_operator(
            "thunderviz_pack_for_all_reduce", meta=_pack_reduce_meta, fn=_pack_flat_impl
        )
        self.unpack_views = ex.register_operator(
            "thunderviz_unpack_views", meta=_unpack_views_meta, fn=_unpack_views_impl
        )
        # Its result is used by nothing (the effect is the accumulators): tagged so a fusion pass's dead-code
        # elimination (fusion_regions.refuse) keeps it.
        self.accumulate = ex.register_operator(
            "thunderviz_accumulate_unsharded_grads",
            meta=_accumulate_meta,
            fn=_accumulate_impl,
            tags=[prims.OpTags.DONT_DCE],
        )
        # The reduced gradients are views of the bucket: thunder's memory estimate must not count them twice.
        register_memory_calculate_function(self.unpack_views.id)(track_alias_op_memory)

    @classmethod
    def get(cls) -> _Ops:
        if cls._instance is None:
            cls._instance = _Ops()
        return cls._instance


# -- reading traces ------------------------------------------------------------------------------------------------


def _strip_dels(bsyms: Sequence[Any]) -> list[Any]:
    """The trace without ``del`` / collection clearing: they are recomputed after the rewrite."""
    from thunder.core import prims
    from thunder.executors.pythonex import clear_mutable_collection

    skip = {prims.PrimIDs.DEL, clear_mutable_collection.id}
    return [b for b in bsyms if b.sym.id not in skip]


class _Index:
    """Where each proxy (by name) is produced and consumed, as positions in a list of bound symbols."""

    def __init__(self, bsyms: Sequence[Any]) -> None:
        from thunder.core import prims

        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, b in enumerate(bsyms):
            if b.sym.id not in (prims.PrimIDs.UNPACK_TRIVIAL, prims.PrimIDs.COMMENT):
                for p in b.flat_proxy_args:
                    self.consumers.setdefault(p.name, []).append(i)
            for p in b.flat_proxy_outs:
                self.producer.setdefault(p.name, i)

    def only_consumer(self, name: str) -> int | None:
        uses = self.consumers.get(name, [])
        return uses[0] if len(uses) == 1 else None


def _first_compute_index(bsyms: Sequence[Any]) -> int:
    from thunder.core import prims

    unpacks = {
        prims.PrimIDs.UNPACK_TRIVIAL,
        prims.PrimIDs.UNPACK_SEQUENCE,
        prims.PrimIDs.UNPACK_KEY,
        prims.PrimIDs.UNPACK_EMPTY_DICT,
        prims.PrimIDs.COMMENT,
    }
    i = 0
    while i < len(bsyms) and bsyms[i].sym.id in unpacks:
        i += 1
    return i


def _record_new(trace: Any, fn: Any, *args: Any) -> tuple[Any, list[Any]]:
    """Call a symbol inside ``trace`` (fresh output names) and return its result and the bound symbols it made."""
    from thunder.core.trace import tracectx

    trace.push_scope([])
    try:
        with tracectx(trace):
            out = fn(*args)
    finally:
        made = trace.pop_scope()
    return out, made


# -- the pass: what every bucket shares --------------------------------------------------------------------------


@dataclass
class _Member:
    record: ParamRecord
    kind: str  # "all_gather", "reduce_scatter" or "all_reduce"
    collective: Any  # the original collective bound symbol
    wait: Any  # its wait
    send: Any  # proxy the collective sends (shard, or pre-averaged gradient)
    result: Any  # proxy the wait produced (unsharded parameter, or reduced gradient)
    ready: int = 0  # index where ``send`` (or the undivided gradient) exists
    undivided: Any = None  # the gradient before the per-gradient division we fold into the bucket
    removed: list[int] = field(default_factory=list)


@dataclass
class _BucketCode:
    """One bucket's new bound symbols: those that pack and issue its collective, and those that wait and unpack."""

    bucket: Bucket
    issue: list[Any]
    wait: list[Any]
    #: laid in when the next bucket is issued (or at the return), so the reduce_scatter overlaps backward compute:
    #: a reduce_scatter's wait and unpack; under hybrid sharding, the wait for the shard group's reduce_scatter and
    #: the issue of the replica all_reduce of its result
    relay: list[Any] = field(default_factory=list)
    #: the replica all_reduce's own bucket (it is a collective of its own in the ledger and the views)
    relayed: Bucket | None = None


def _gather_key(m: _Member) -> tuple:
    c = m.record.config
    return (id(m.record.group), str(m.send.dtype), str(m.send.device), c.owner_id, c.label)


def _label(members: Sequence[_Member], fallback: str) -> str:
    labels = {m.record.config.label for m in members}
    return labels.pop() if len(labels) == 1 else fallback


def _removed(members: Sequence[_Member]) -> set[int]:
    """Positions of the bound symbols the buckets replace (collectives, waits, folded divisions)."""
    return {i for m in members for i in m.removed}


def _torchex(name: str) -> Any:
    from thunder.executors import torchex

    return getattr(torchex, name)


# -- the pass: all_gather buckets, issued one bucket ahead of first use ---------------------------------------------


def rewrite_gathers(
    trace: Any, bsyms: list[Any], records: dict[str, ParamRecord], trace_name: str
) -> tuple[list[Any], list[Bucket]]:
    """Bucket the ``all_gather``s of recorded shards and issue each bucket one bucket ahead of its first use."""
    members = _find_gathers(bsyms, records)
    if not members:
        return bsyms, []
    members, bsyms, idx = _dedupe_gathers(members, bsyms)
    groups = [g for _, g in group_in_order((_gather_key(m), m) for m in members)]
    groups.sort(key=lambda g: _first_use(g, idx))
    issue_at, wait_at = _prefetch_schedule(groups, idx, _first_compute_index(bsyms))
    codes = [_gather_code(trace, k, g, trace_name) for k, g in enumerate(groups)]
    return _emit_gathers(bsyms, _removed(members), codes, issue_at, wait_at), [c.bucket for c in codes]


def _find_gathers(bsyms: list[Any], records: dict[str, ParamRecord]) -> list[_Member]:
    """The dim-0 ``all_gather``s of recorded shards whose only consumer is their wait."""
    ids = executed_collective_ids()
    idx = _Index(bsyms)
    members: list[_Member] = []
    for i, b in enumerate(bsyms):
        if b.sym.id != ids["all_gather"] or not b.flat_proxy_args or b.flat_proxy_args[0].name not in records:
            continue
        if len(b.args) > 3 and b.args[3] is not None:
            continue  # gathered along another dim: not a parameter shard
        fut = b.flat_proxy_outs[0]
        w = idx.only_consumer(fut.name)
        if w is None or bsyms[w].sym.id != ids["wait"]:
            continue
        wait = bsyms[w]
        members.append(
            _Member(
                records[b.flat_proxy_args[0].name],
                "all_gather",
                b,
                wait,
                b.flat_proxy_args[0],
                wait.flat_proxy_outs[0],
                removed=[i, w],
            )
        )
    return members


def _dedupe_gathers(members: list[_Member], bsyms: list[Any]) -> tuple[list[_Member], list[Any], _Index]:
    """One gather per shard: a second gather of the same shard (thunder's recompute and ours) reuses the first."""
    from thunder.core.proxies import variableify

    kept: dict[str, _Member] = {}
    swap: dict[Any, Any] = {}
    drop: set[int] = set()
    for m in members:
        first = kept.setdefault(m.send.name, m)
        if first is not m:
            swap[variableify(m.result)] = first.result
            drop.update(m.removed)
    if not swap:
        return members, bsyms, _Index(bsyms)
    unique = list(kept.values())
    old_pos = {id(b): i for i, b in enumerate(bsyms)}
    new_bsyms = [b.from_bsym_swap_proxies(swap) for i, b in enumerate(bsyms) if i not in drop]
    survivors = [b for i, b in enumerate(bsyms) if i not in drop]
    remap = {old_pos[id(b)]: j for j, b in enumerate(survivors)}
    for m in unique:
        m.removed = [remap[i] for i in m.removed]
        m.collective, m.wait = new_bsyms[m.removed[0]], new_bsyms[m.removed[1]]
    return unique, new_bsyms, _Index(new_bsyms)


def _first_use(g: list[_Member], idx: _Index) -> int:
    """Where the trace first needs a parameter of the bucket (its old wait when nothing uses it)."""
    uses = [u for m in g for u in idx.consumers.get(m.result.name, [])]
    return min(uses) if uses else min(m.removed[1] for m in g)


def _prefetch_schedule(
    groups: list[list[_Member]], idx: _Index, start: int
) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Positions -> buckets to issue / wait for there: bucket k+1 issued where bucket k is first used (or once its
    shards exist), bucket k waited for right there."""
    issue_at: dict[int, list[int]] = {}
    wait_at: dict[int, list[int]] = {}
    for k, g in enumerate(groups):
        ready = max([start] + [idx.producer.get(m.send.name, -1) + 1 for m in g])
        at = max(ready, _first_use(groups[k - 1], idx)) if k else ready
        issue_at.setdefault(at, []).append(k)
        wait_at.setdefault(_first_use(g, idx), []).append(k)
    return issue_at, wait_at


def _gather_code(trace: Any, k: int, g: list[_Member], trace_name: str) -> _BucketCode:
    """Pack the shards, gather once, unpack into the unsharded tensors the trace already uses (one member: as is)."""
    rec = g[0].record
    label = _label(g, f"#{k}")
    names = tuple(m.record.config.param_name for m in g)
    ops = _Ops.get()
    if len(g) == 1:
        issue, wait = [g[0].collective], [g[0].wait]
        fut = g[0].collective.flat_proxy_outs[0]
    else:
        buf, made = _record_new(trace, ops.pack_gather, [m.send for m in g], label, names)
        fut, made_ag = _record_new(trace, _torchex("all_gather_prim_impl"), buf, rec.group, True, None)
        gathered, made_w = _record_new(trace, _torchex("wait_prim_impl"), fut)
        shapes = tuple(tuple(m.result.shape) for m in g)
        # `buf` only to free it there (snapshot.RELEASED_ONLY: not an input of the unpack in the trace model)
        unpack = ops.unpack_gather.bind(gathered, buf, shapes, rec.world, label, output=[m.result for m in g])
        issue, wait = made + made_ag, [*made_w, unpack]
    bucket = Bucket(
        "all_gather",
        trace_name,
        label,
        list(names),
        sum(m.send.numel * m.send.dtype.bytes for m in g),
        dtype_name(g[0].send.dtype),
        sends=[m.send.name for m in g],
        results=[m.result.name for m in g],
        reshard_after_forward=all(m.record.config.reshard_after_forward for m in g),
        future=fut.name,
        mesh_group="shard" if rec.replicas > 1 else "",
    )
    return _BucketCode(bucket, issue, wait)


def _emit_gathers(
    bsyms: list[Any],
    removed: set[int],
    codes: list[_BucketCode],
    issue_at: dict[int, list[int]],
    wait_at: dict[int, list[int]],
) -> list[Any]:
    out: list[Any] = []
    for i, b in enumerate(bsyms):
        for k in issue_at.get(i, ()):
            codes[k].bucket.issue_index = len(out)
            out.extend(codes[k].issue)
        for k in wait_at.get(i, ()):
            codes[k].bucket.wait_index = len(out)
            out.extend(codes[k].wait)
        if i not in removed:
            out.append(b)
    return out


# -- the pass: gradient buckets, issued as their last gradient appears, waited for at the return --------------------


def rewrite_reductions(
    trace: Any,
    bsyms: list[Any],
    grad_records: dict[str, ParamRecord],
    trace_name: str,
    *,
    accumulate: bool = False,
) -> tuple[list[Any], list[Bucket]]:
    """Bucket the gradient ``reduce_scatter`` / ``all_reduce`` of recorded parameters.

    ``grad_records`` maps the name of each *returned* reduced gradient to its parameter. Each bucket is issued right
    after its last gradient is produced and waited for when the next bucket is issued (a reduce_scatter) or just
    before the return (an all_reduce; module docstring); a sharded bucket's pack adds what
    earlier no_backward_sync micro-batches accumulated for its parameters (``thunder.comm.accumulation``).

    ``accumulate`` (a backward traced under ``fabric.no_backward_sync``): sharded buckets are not reduced at all;
    their unsharded gradients go to the parameters' accumulators and the backward returns no gradient for them.
    Returns the new bound symbols and the buckets (accumulated ones have kind ``accumulate``), in issue order.
    """
    idx = _Index(bsyms)
    members = _find_reductions(bsyms, idx, grad_records)
    if not members:
        return bsyms, []
    groups = _reduction_groups(members)
    issue_after: dict[int, list[int]] = {}
    codes: list[_BucketCode] = []
    kept: list[_BucketCode] = []
    for k, g in enumerate(groups):
        if accumulate and g[0].kind == "reduce_scatter":
            code, ready = _accumulation_code(trace, k, g, idx, trace_name)
            kept.append(code)
        else:
            code, ready = _reduction_code(trace, k, g, idx, trace_name)
        issue_after.setdefault(ready, []).append(len(codes))
        codes.append(code)
    dropped = {name for code in kept for name in code.bucket.results}
    out = _emit_reductions(bsyms, _removed(members), codes, issue_after, dropped)
    return out, [b for c in codes for b in (c.bucket, c.relayed) if b is not None]


def _divisions(g: list[_Member], idx: _Index) -> tuple[bool, list[Any], int]:
    """Whether the bucket's per-gradient divisions by the world size fold into the pack, what it packs, and the
    position after which all of that exists."""
    divide = all(m.undivided is not None for m in g)
    sends = [m.undivided if divide else m.send for m in g]
    ready = max(idx.producer.get(s.name, m.ready) for s, m in zip(sends, g, strict=True))
    if not divide:
        # Keep the per-gradient divisions we could not fold (e.g. fused by nvFuser): they stay where they were.
        for m in g:
            if m.undivided is not None:
                m.removed.remove(idx.producer[m.send.name])
        ready = max(idx.producer.get(m.send.name, m.ready) for m in g)
    return divide, sends, ready


def _is_division_by(b: Any, world: int) -> bool:
    return b.sym.name in ("true_divide", "div") and len(b.args) == 2 and b.args[1] == world


def _find_reductions(bsyms: list[Any], idx: _Index, grad_records: dict[str, ParamRecord]) -> list[_Member]:
    """The gradient reductions whose waited result is a recorded gradient, each with the division it may fold."""
    ids = executed_collective_ids()
    members: list[_Member] = []
    for i, b in enumerate(bsyms):
        if b.sym.id not in (ids["reduce_scatter"], ids["all_reduce"]):
            continue
        fut = b.flat_proxy_outs[0]
        w = idx.only_consumer(fut.name)
        if w is None or bsyms[w].sym.id != ids["wait"]:
            continue
        result = bsyms[w].flat_proxy_outs[0]
        rec = grad_records.get(result.name)
        if rec is None:
            continue
        if b.sym.id == ids["reduce_scatter"] and len(b.args) > 4 and b.args[4] is not None:
            continue
        send = b.flat_proxy_args[0]
        kind = "reduce_scatter" if b.sym.id == ids["reduce_scatter"] else "all_reduce"
        m = _Member(rec, kind, b, bsyms[w], send, result, removed=[i, w])
        p = idx.producer.get(send.name)
        if p is not None and _is_division_by(bsyms[p], rec.world) and idx.only_consumer(send.name) == i:
            m.undivided = bsyms[p].flat_proxy_args[0]
            m.removed.append(p)
            m.ready = idx.producer.get(m.undivided.name, p)
        else:
            m.ready = p if p is not None else _first_compute_index(bsyms)
        members.append(m)
    return members


def _reduction_groups(members: list[_Member]) -> list[list[_Member]]:
    """FSDP: by bucket label, in gradient-ready order; DDP: size-capped buckets in gradient-ready order."""
    fsdp = sorted((m for m in members if m.kind == "reduce_scatter"), key=lambda m: m.ready)
    groups = [g for _, g in group_in_order((_gather_key(m), m) for m in fsdp)]
    ddp = sorted((m for m in members if m.kind == "all_reduce"), key=lambda m: m.ready)
    for _, same in group_in_order(
        ((id(m.record.group), str(m.send.dtype), str(m.send.device), m.record.config.owner_id), m) for m in ddp
    ):
        cfg = same[0].record.config
        sizes = [(0, m.send.numel * m.send.dtype.bytes) for m in same]
        for bucket in size_capped(sizes, cfg.bucket_cap_bytes, cfg.first_bucket_cap_bytes or None):
            groups.append([same[j] for j in bucket])
    return groups


def _reduction_code(trace: Any, k: int, g: list[_Member], idx: _Index, trace_name: str) -> tuple[_BucketCode, int]:
    """Pack the gradients (divided by the world size once, when every member's division could be folded; cast to
    the reduce dtype), reduce once, unpack views of the result (cast back); and the position after which all of
    them exist."""
    ops = _Ops.get()
    rec = g[0].record
    kind = g[0].kind
    divide, sends, ready = _divisions(g, idx)
    names = tuple(m.record.config.param_name for m in g)
    label = _label(g, f"#{k}") if kind == "reduce_scatter" else f"#{k}"
    reduce_dtype = rec.config.reduce_dtype
    if reduce_dtype is not None and reduce_dtype == dtype_name(sends[0].dtype):
        reduce_dtype = None  # already in it: no cast
    accumulated = tuple(m.record.config.key for m in g) if kind == "reduce_scatter" else ()
    hybrid = kind == "reduce_scatter" and rec.replica_group is not None and rec.replicas > 1
    pack = ops.pack_scatter if kind == "reduce_scatter" else ops.pack_flat
    extra = (rec.replicas,) if hybrid else ()
    buf, made = _record_new(trace, pack, sends, rec.world, divide, label, names, reduce_dtype, accumulated, *extra)
    if kind == "reduce_scatter":
        fut, made_c = _record_new(trace, _torchex("reduce_scatter_prim_impl"), buf, _sum_op(), rec.group, True, None)
    else:
        fut, made_c = _record_new(trace, _torchex("all_reduce_prim_impl"), buf, _sum_op(), rec.group, True, True)
    reduced, made_w = _record_new(trace, _torchex("wait_prim_impl"), fut)
    shapes = tuple(tuple(m.result.shape) for m in g)
    back = None if reduce_dtype is None else dtype_name(g[0].result.dtype)
    bucket = Bucket(
        kind,
        trace_name,
        label,
        list(names),
        buf.numel * buf.dtype.bytes,
        dtype_name(buf.dtype),
        sends=[s.name for s in sends],
        results=[m.result.name for m in g],
        future=fut.name,
        mesh_group="shard" if hybrid else "",
    )
    if not hybrid:
        unpack = ops.unpack_views.bind(reduced, shapes, label, back, output=[m.result for m in g])
        if kind == "reduce_scatter":  # waited when the next bucket is issued (module docstring)
            return _BucketCode(bucket, made + made_c, [], relay=[*made_w, unpack]), ready
        return _BucketCode(bucket, made + made_c, [*made_w, unpack]), ready
    # Hybrid: the reduced shard (1/world of the bucket) is all-reduced in place across the replicas.
    fut2, made_r = _record_new(
        trace, _torchex("all_reduce_prim_impl"), reduced, _sum_op(), rec.replica_group, True, True
    )
    averaged, made_w2 = _record_new(trace, _torchex("wait_prim_impl"), fut2)
    unpack = ops.unpack_views.bind(averaged, shapes, label, back, output=[m.result for m in g])
    relayed = Bucket(
        "all_reduce",
        trace_name,
        label,
        list(names),
        reduced.numel * reduced.dtype.bytes,
        dtype_name(reduced.dtype),
        sends=[reduced.name],
        results=[m.result.name for m in g],
        future=fut2.name,
        mesh_group="replica",
    )
    code = _BucketCode(bucket, made + made_c, [*made_w2, unpack], relay=[*made_w, *made_r], relayed=relayed)
    return code, ready


def _accumulation_code(trace: Any, k: int, g: list[_Member], idx: _Index, trace_name: str) -> tuple[_BucketCode, int]:
    """no_backward_sync: add the bucket's unsharded gradients to their accumulators instead of reducing them."""
    from thunder.core import dtypes

    from thunderviz.thunder.comm.accumulation import accumulation_dtype

    ops = _Ops.get()
    divide, sends, ready = _divisions(g, idx)
    label = _label(g, f"#{k}")
    reduce_dtype = g[0].record.config.reduce_dtype
    wanted = None if reduce_dtype is None else getattr(torch, reduce_dtype)
    kept = [accumulation_dtype(dtypes.to_torch_dtype(s.dtype), wanted) for s in sends]
    keys = tuple(m.record.config.key for m in g)
    out, made = _record_new(
        trace, ops.accumulate, sends, keys, not divide, tuple(str(d).removeprefix("torch.") for d in kept), label
    )
    bucket = Bucket(
        "accumulate",
        trace_name,
        label,
        [m.record.config.param_name for m in g],
        sum(s.numel * torch.empty((), dtype=d).element_size() for s, d in zip(sends, kept, strict=True)),
        str(kept[0]).removeprefix("torch."),
        sends=[s.name for s in sends],
        results=[m.result.name for m in g],
        future=out.name,
    )
    return _BucketCode(bucket, made, []), ready


def _emit_reductions(
    bsyms: list[Any],
    removed: set[int],
    codes: list[_BucketCode],
    issue_after: dict[int, list[int]],
    dropped: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[Any]:
    """Lay the buckets' code into the trace; the return gives no gradient (None) for the ``dropped`` results."""
    from thunder.core import prims

    out: list[Any] = []
    relays: list[_BucketCode] = []  # issued buckets whose replica all_reduce is still to be issued

    def relay() -> None:
        for code in relays:
            if code.relayed is None:  # the relay is this bucket's own wait
                code.bucket.wait_index = len(out)
            out.extend(code.relay)
        relays.clear()

    for i, b in enumerate(bsyms):
        if b.sym.id == prims.PrimIDs.RETURN:
            relay()
            for code in sorted(codes, key=lambda c: c.bucket.issue_index):
                if code.wait:
                    code.bucket.wait_index = len(out)
                    out.extend(code.wait)
            if dropped:
                b = b.from_bsym(args=_without(b.args, dropped))
        if i not in removed:
            out.append(b)
        for k in issue_after.get(i, ()):
            relay()
            codes[k].bucket.issue_index = len(out)
            out.extend(codes[k].issue)
            if codes[k].relay:
                relays.append(codes[k])
    return out


def _without(args: Any, names: set[str]) -> Any:
    """``args`` with every proxy named in ``names`` replaced by None (tuples and lists kept as they are)."""
    if isinstance(args, Proxy):
        return None if args.name in names else args
    if isinstance(args, (tuple, list)):
        return type(args)(_without(a, names) for a in args)
    return args


# -- the pass: ZERO3, forward saves shards and backward recomputes from them ----------------------------------------


@dataclass
class _Zero3Plan:
    """What forward stopped saving for backward, and how backward recomputes it from re-gathered shards."""

    removed: list[str]  # names of saved tensors no longer saved
    added: list[Any]  # shard proxies now saved instead (when not saved already)
    chains: dict[str, list[Any]]  # removed name -> forward bound symbols computing it from unsharded weights
    weight_shard: dict[str, tuple[Any, ParamRecord]]  # unsharded weight name -> (its shard, its record)


def _weight_only(bsyms: Sequence[Any], weights: set[str]) -> dict[str, int]:
    """Names computed from nothing but ``weights`` (views, casts, transposes of unsharded weights) -> producer index."""
    from thunder.core import prims

    derived: dict[str, int] = {}
    for i, b in enumerate(bsyms):
        if b.sym.id == prims.PrimIDs.RETURN:
            continue
        args = [p.name for p in b.flat_proxy_args]
        if args and all(a in weights or a in derived for a in args):
            for o in b.flat_proxy_outs:
                derived.setdefault(o.name, i)
    return derived


def drop_weight_saves(
    bsyms: list[Any], resharded: dict[str, tuple[Any, ParamRecord]]
) -> tuple[list[Any], _Zero3Plan | None]:
    """ZERO3: stop saving for backward anything computed from resharded unsharded weights alone.

    thunder recomputes in backward what ``thunder_hooks`` tagged (the gathered weight and its unpadding), but a view
    made inside a decomposition — a LayerNorm weight unsqueezed and expanded to the activation's shape — is saved,
    and keeps the whole unsharded weight alive until backward. Such tensors leave the saved list; the shards they
    come from take their place (free: they are parameters), and ``restore_weight_saves`` recomputes them in
    backward after gathering those shards again.
    """
    from thunder.core.proxies import TensorProxy

    ret = bsyms[-1]
    if len(ret.args) < 2 or not isinstance(ret.args[1], (tuple, list)) or len(ret.args[1]) != 2:
        return bsyms, None
    saved_tensors, saved_other = ret.args[1]
    derived = _weight_only(bsyms, set(resharded))
    drop = [t for t in saved_tensors if isinstance(t, TensorProxy) and (t.name in derived or t.name in resharded)]
    if not drop:
        return bsyms, None
    producer = {o.name: i for i, b in enumerate(bsyms) for o in b.flat_proxy_outs}
    chains: dict[str, list[Any]] = {}
    needed: dict[str, tuple[Any, ParamRecord]] = {}
    for t in drop:
        todo, seen = [t.name], set()
        while todo:
            name = todo.pop()
            if name in resharded:
                needed[name] = resharded[name]
                continue
            i = producer[name]
            if i in seen:
                continue
            seen.add(i)
            todo.extend(p.name for p in bsyms[i].flat_proxy_args)
        chains[t.name] = [bsyms[i] for i in sorted(seen)]
    already = {t.name for t in saved_tensors if isinstance(t, TensorProxy)}
    added = []
    for shard, _ in needed.values():
        if shard.name not in already and shard.name not in {a.name for a in added}:
            added.append(shard)
    dropped = {t.name for t in drop}
    kept = tuple(t for t in saved_tensors if not (isinstance(t, TensorProxy) and t.name in dropped)) + tuple(added)
    new_ret = ret.from_bsym(args=(ret.args[0], (kept, saved_other)))
    return [*bsyms[:-1], new_ret], _Zero3Plan([t.name for t in drop], added, chains, needed)


def restore_weight_saves(trace: Any, bsyms: list[Any], plan: _Zero3Plan) -> list[Any]:
    """The backward side of ``drop_weight_saves``: unpack the new saved list, gather, recompute before first use."""
    from thunder.core import prims

    unpack_i = next(
        (
            i
            for i, b in enumerate(bsyms)
            if b.sym.id == prims.PrimIDs.UNPACK_SEQUENCE and any(o.name in plan.removed for o in b.flat_proxy_outs)
        ),
        None,
    )
    if unpack_i is None:
        raise RuntimeError(
            "thunderviz's ZERO3 pass could not find where backward unpacks the tensors forward saved; the forward"
            " and backward traces no longer match. Use sharding_strategy='ZERO2' and report this."
        )
    unpack = bsyms[unpack_i]
    outs = [o for o in unpack.flat_proxy_outs if o.name not in plan.removed] + list(plan.added)
    coll = unpack.args[0]
    bsyms = list(bsyms)
    bsyms[unpack_i] = unpack.from_bsym(args=(coll, len(outs)), output=outs)
    if isinstance(getattr(coll, "coll", None), list):
        # The backward's signature describes the saved list through this collection (thunder's memory estimate
        # reads it); the list is the one the split made for this very trace pair, so update it in place.
        coll.coll[:] = outs
    removed = {o.name: o for o in unpack.flat_proxy_outs if o.name in plan.removed}
    idx = _Index(bsyms)
    firsts = sorted((min(idx.consumers.get(n, [len(bsyms) - 1])), n) for n in plan.removed)
    insert_at: dict[int, list[Any]] = {}
    emitted: set[int] = set()
    gathered: set[str] = set()
    ag, wait = _torchex("all_gather_prim_impl"), _torchex("wait_prim_impl")

    def gather(w: Any, code: list[Any]) -> None:
        if w.name in gathered:
            return
        shard, rec = plan.weight_shard[w.name]
        fut, made = _record_new(trace, ag, shard, rec.group, True, None)
        code.extend([*made, wait.bind(fut, output=w)])
        gathered.add(w.name)

    for pos, name in firsts:
        code = insert_at.setdefault(pos, [])
        if name in plan.weight_shard:
            # the unsharded weight itself was saved (a fusion region's input: thunder's rematerialization keeps a
            # region's inputs rather than recomputing them), so it is gathered again as it is
            gather(removed[name], code)
        for b in plan.chains[name]:
            for w in (p for p in b.flat_proxy_args if p.name in plan.weight_shard):
                gather(w, code)
            if id(b) not in emitted:
                emitted.add(id(b))
                code.append(b)
    out: list[Any] = []
    for i, b in enumerate(bsyms):
        out.extend(insert_at.get(i, ()))
        out.append(b)
    return out


def _sum_op() -> Any:
    from thunder.distributed.prims import DistributedReduceOps

    return DistributedReduceOps.SUM


# -- the thunder Transform ---------------------------------------------------------------------------------------


class CommTransform(Transform):
    """Buckets and schedules the collectives of the parameters thunderviz distributed (see the module doc).

    One instance lives in a jitted object's ``compile_data.transforms``; ``note_param`` fills it while thunder
    traces, and each new cache entry's forward and backward traces go through ``transform_trace_post_optimization``.
    ``buckets`` holds the layout of the last entry built, for tests, reports and the ledger.
    """

    def __init__(self) -> None:
        self.pending: dict[str, ParamRecord] = {}
        self.pending_kept: list[Any] = []
        self.current: dict[str, ParamRecord] = {}
        self.forward_flat_args: list[str | None] | None = None
        self.zero3: _Zero3Plan | None = None
        self.buckets: dict[str, list[Bucket]] = {}
        #: the entry being built was traced under no_backward_sync: its backward accumulates, never reduces
        self.accumulating = False
        self.accumulated: list[Bucket] = []

    def note_param(self, shard_name: str, record: ParamRecord) -> None:
        self.pending[shard_name] = record

    def note_kept(self, proxies: Sequence[Any]) -> None:
        """Proxies of gathered parameters that backward must find saved, never recompute (ZERO2)."""
        self.pending_kept.extend(proxies)

    def transform_traces_pre_prologue(
        self, prologue_trace: Any, computation_trace: Any, epilogue_trace: Any, **kwargs: Any
    ) -> tuple[Any, Any, Any]:
        # A ZERO2 parameter first read inside a checkpointed region was gathered inside it, so thunder's checkpoint
        # lookaside tagged its gathered value *recompute in backward* along with the region: backward would gather
        # it again (ZERO3's cost without being asked). Gathered parameters are not activations: untag them.
        from thunder.core.proxies import ProxyTag

        for proxy in self.pending_kept:
            proxy.tags.discard(ProxyTag.RECOMPUTE_IN_BACKWARD)
        self.pending_kept = []
        # Tracing just finished: what it recorded belongs to the cache entry being built now.
        self.current, self.pending = self.pending, {}
        self.forward_flat_args = None
        self.zero3 = None
        self.buckets = {}
        self.accumulated = []
        from thunder.distributed import get_skip_data_parallel_grad_sync

        self.accumulating = bool(get_skip_data_parallel_grad_sync())
        return prologue_trace, computation_trace, epilogue_trace

    def transform_trace_post_optimization(self, computation_trace: Any, **kwargs: Any) -> Any:
        if not self.current:
            return computation_trace
        if TraceTag.BACKWARD in computation_trace.tags:
            return self._backward(computation_trace)
        return self._forward(computation_trace)

    def _forward(self, trace: Any) -> Any:
        ret = trace.bound_symbols[-1]
        if ret.args and isinstance(ret.args[0], dict) and "flat_args" in ret.args[0]:
            self.forward_flat_args = [getattr(a, "name", None) for a in ret.args[0]["flat_args"]]
        new_trace = from_trace(trace)
        bsyms, fusers = open_regions(_strip_dels(trace.bound_symbols))
        bsyms, gathers = rewrite_gathers(new_trace, bsyms, self.current, "forward")
        self.buckets["forward"] = gathers
        if not gathers:
            return trace
        resharded = _resharded_weights(bsyms, gathers, self.current)
        if resharded and TraceTag.AUGMENTED_FORWARD in trace.tags:
            bsyms, self.zero3 = drop_weight_saves(bsyms, resharded)
        new_trace, bsyms = refuse(new_trace, bsyms, fusers)
        return _finish(new_trace, bsyms, backward=False, buckets=gathers)

    def _backward(self, trace: Any) -> Any:
        new_trace = from_trace(trace)
        bsyms, fusers = open_regions(_strip_dels(trace.bound_symbols))
        if self.zero3 is not None:
            bsyms = restore_weight_saves(new_trace, bsyms, self.zero3)
        bsyms, gathers = rewrite_gathers(new_trace, bsyms, self.current, "backward")
        grad_records: dict[str, ParamRecord] = {}
        outs = bsyms[-1].args[0] if bsyms[-1].args else ()
        if self.forward_flat_args is not None and isinstance(outs, (tuple, list)):
            # The backward returns one gradient per forward input, in the order of the forward's flat_args.
            for name, out in zip(self.forward_flat_args, outs, strict=False):
                if name in self.current and isinstance(out, Proxy):
                    grad_records[out.name] = self.current[name]
        bsyms, reductions = rewrite_reductions(new_trace, bsyms, grad_records, "backward", accumulate=self.accumulating)
        self.accumulated = [b for b in reductions if b.kind == "accumulate"]
        reductions = [b for b in reductions if b.kind != "accumulate"]
        self.buckets["backward"] = gathers + reductions
        if not gathers and not reductions and not self.accumulated:
            return trace
        new_trace, bsyms = refuse(new_trace, bsyms, fusers)
        return _finish(new_trace, bsyms, backward=True, buckets=gathers + reductions, accumulated=self.accumulated)


def _resharded_weights(
    bsyms: Sequence[Any], gathers: Sequence[Bucket], records: dict[str, ParamRecord]
) -> dict[str, tuple[Any, ParamRecord]]:
    """Unsharded weight name -> (shard proxy, record) for forward gathers that ZERO3 does not keep for backward."""
    proxies = {p.name: p for b in bsyms for p in (*b.flat_proxy_args, *b.flat_proxy_outs)}
    out: dict[str, tuple[Any, ParamRecord]] = {}
    for bucket in gathers:
        if bucket.reshard_after_forward:
            for send, result in zip(bucket.sends, bucket.results, strict=True):
                out[result] = (proxies[send], records[send])
    return out


def _finish(
    new_trace: Any, bsyms: list[Any], *, backward: bool, buckets: list[Bucket], accumulated: Sequence[Bucket] = ()
) -> Any:
    from thunder.core.trace import TraceProvenance
    from thunder.executors.passes import del_last_used

    new_trace.bound_symbols = bsyms
    done = del_last_used(new_trace, clear_mutable_collections=backward)
    # Positions in the final trace (``del``s included), where captures and ledgers will look for them.
    issued: dict[str, int] = {}
    waited: dict[str, int] = {}
    wait_id = executed_collective_ids()["wait"]
    for i, b in enumerate(done.bound_symbols):
        for p in b.flat_proxy_outs:
            issued.setdefault(p.name, i)
        if b.sym.id == wait_id and b.flat_proxy_args:
            waited[b.flat_proxy_args[0].name] = i
    for bucket in buckets:
        bucket.issue_index = issued[bucket.future]
        bucket.wait_index = waited[bucket.future]
    for bucket in accumulated:  # no collective: the one op that adds the bucket to its accumulators
        bucket.issue_index = bucket.wait_index = issued[bucket.future]
    done._thunderviz_buckets = list(buckets)  # read back by thunder_hooks.trace_buckets (capture)
    done._thunderviz_accumulated = list(accumulated)  # thunder_hooks.trace_accumulated
    kinds: dict[str, int] = {}
    for b in [*buckets, *accumulated]:
        kinds[b.kind] = kinds.get(b.kind, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in kinds.items())
    done.set_provenance(TraceProvenance(f"thunderviz communication buckets ({summary})"))
    return done


def comm_transform_of(compile_data: Any) -> Any | None:
    """The ``CommTransform`` in a compile data's transforms, or None."""
    for t in getattr(compile_data, "transforms", None) or ():
        if isinstance(t, CommTransform):
            return t
    return None


def ensure_comm_transform(compile_data: Any) -> Any:
    """The compile data's ``CommTransform``, appended to its transforms on first use.

    thunder iterates that very list after tracing, so a transform appended while tracing still runs for this entry.
    """
    found = comm_transform_of(compile_data)
    if found is not None:
        return found
    transforms = compile_data.transforms
    if not isinstance(transforms, list):
        from thunderviz.errors import UnsupportedThunderError

        raise UnsupportedThunderError(
            f"thunderviz adds its communication pass to the jitted function's transforms, but they are a"
            f" {type(transforms).__name__}, not a list. Pass `transforms=[...]` as a list to `thunder.jit`."
        )
    t = CommTransform()
    transforms.append(t)
    return t
