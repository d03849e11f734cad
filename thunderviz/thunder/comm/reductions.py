"""The gradient buckets: reduced in one collective per bucket, issued as their last gradient appears.

The backward ``reduce_scatter`` (FSDP) / ``all_reduce`` (DDP) of each parameter's gradient is replaced by one per
bucket: the gradients are packed (and divided by the world size once, instead of once per gradient) as soon as the
last of them exists, reduced in one collective, and waited for: a ``reduce_scatter`` when the next bucket is issued
(or at the return), an ``all_reduce`` just before the backward returns. The results are views of the reduced buffer.

Why a reduce_scatter is not left until the return: its input, the bucket's unsharded gradients, lives until its
wait, so waiting at the return kept every bucket's unsharded gradients to the end of backward (planned for
Llama-2-70B under ZERO3 on 64 ranks: 124 GiB of them at the peak); one in flight while the next bucket's gradients
are computed is what FSDP2 keeps too. DDP's buckets are the gradients themselves (``.grad`` become views of them), so
waiting earlier would free nothing.

Hybrid sharding (a parameter with a replica group, ``ParamRecord.replica_group``): the reduce_scatters run in the
shard group as above, the pack divides by the whole world (shard x replicas), and each reduced shard is all-reduced
in place across the replica group, issued when the next gradient bucket is issued (so the reduce_scatter overlaps the
compute before it) and waited for with the others before the return; it is a bucket of its own
(``mesh_group="replica"``).

A backward traced under ``fabric.no_backward_sync`` reduces no sharded bucket: it adds the unsharded gradients to
the parameters' accumulators (``thunder.comm.accumulation``), and the next synchronizing backward's pack adds them in.
"""

from __future__ import annotations

from typing import Any

import torch
from thunder.core.proxies import Proxy

from thunderviz.parallel.buckets import group_in_order, size_capped
from thunderviz.thunder.capture.snapshot import dtype_name
from thunderviz.thunder.comm.bucket_code import (
    BucketCode,
    Index,
    Member,
    ParamRecord,
    first_compute_index,
    gather_key,
    record_new,
    replaced_positions,
    shared_label,
    torchex_symbol,
)
from thunderviz.thunder.comm.collectives import executed_collective_ids
from thunderviz.thunder.comm.ops import Ops
from thunderviz.trace.buckets import Bucket

__all__ = ["rewrite_reductions"]


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
    idx = Index(bsyms)
    members = _find_reductions(bsyms, idx, grad_records)
    if not members:
        return bsyms, []
    groups = _reduction_groups(members)
    issue_after: dict[int, list[int]] = {}
    codes: list[BucketCode] = []
    kept: list[BucketCode] = []
    for k, g in enumerate(groups):
        if accumulate and g[0].kind == "reduce_scatter":
            code, ready = _accumulation_code(trace, k, g, idx, trace_name)
            kept.append(code)
        else:
            code, ready = _reduction_code(trace, k, g, idx, trace_name)
        issue_after.setdefault(ready, []).append(len(codes))
        codes.append(code)
    dropped = {name for code in kept for name in code.bucket.results}
    out = _emit_reductions(bsyms, replaced_positions(members), codes, issue_after, dropped)
    return out, [b for c in codes for b in (c.bucket, c.relayed) if b is not None]


def _divisions(g: list[Member], idx: Index) -> tuple[bool, list[Any], int]:
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


def _find_reductions(bsyms: list[Any], idx: Index, grad_records: dict[str, ParamRecord]) -> list[Member]:
    """The gradient reductions whose waited result is a recorded gradient, each with the division it may fold."""
    ids = executed_collective_ids()
    members: list[Member] = []
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
        m = Member(rec, kind, b, bsyms[w], send, result, removed=[i, w])
        p = idx.producer.get(send.name)
        if p is not None and _is_division_by(bsyms[p], rec.world) and idx.only_consumer(send.name) == i:
            m.undivided = bsyms[p].flat_proxy_args[0]
            m.removed.append(p)
            m.ready = idx.producer.get(m.undivided.name, p)
        else:
            m.ready = p if p is not None else first_compute_index(bsyms)
        members.append(m)
    return members


def _reduction_groups(members: list[Member]) -> list[list[Member]]:
    """FSDP: by bucket label, in gradient-ready order; DDP: size-capped buckets in gradient-ready order."""
    fsdp = sorted((m for m in members if m.kind == "reduce_scatter"), key=lambda m: m.ready)
    groups = [g for _, g in group_in_order((gather_key(m), m) for m in fsdp)]
    ddp = sorted((m for m in members if m.kind == "all_reduce"), key=lambda m: m.ready)
    for _, same in group_in_order(
        ((id(m.record.group), str(m.send.dtype), str(m.send.device), m.record.config.owner_id), m) for m in ddp
    ):
        cfg = same[0].record.config
        sizes = [(0, m.send.numel * m.send.dtype.bytes) for m in same]
        for bucket in size_capped(sizes, cfg.bucket_cap_bytes, cfg.first_bucket_cap_bytes or None):
            groups.append([same[j] for j in bucket])
    return groups


def _reduction_code(trace: Any, k: int, g: list[Member], idx: Index, trace_name: str) -> tuple[BucketCode, int]:
    """Pack the gradients (divided by the world size once, when every member's division could be folded; cast to
    the reduce dtype), reduce once, unpack views of the result (cast back); and the position after which all of
    them exist."""
    ops = Ops.get()
    rec = g[0].record
    kind = g[0].kind
    divide, sends, ready = _divisions(g, idx)
    names = tuple(m.record.config.param_name for m in g)
    label = shared_label(g, f"#{k}") if kind == "reduce_scatter" else f"#{k}"
    reduce_dtype = rec.config.reduce_dtype
    if reduce_dtype is not None and reduce_dtype == dtype_name(sends[0].dtype):
        reduce_dtype = None  # already in it: no cast
    accumulated = tuple(m.record.config.key for m in g) if kind == "reduce_scatter" else ()
    hybrid = kind == "reduce_scatter" and rec.replica_group is not None and rec.replicas > 1
    pack = ops.pack_scatter if kind == "reduce_scatter" else ops.pack_flat
    extra = (rec.replicas,) if hybrid else ()
    buf, made = record_new(trace, pack, sends, rec.world, divide, label, names, reduce_dtype, accumulated, *extra)
    if kind == "reduce_scatter":
        fut, made_c = record_new(
            trace, torchex_symbol("reduce_scatter_prim_impl"), buf, _sum_op(), rec.group, True, None
        )
    else:
        fut, made_c = record_new(trace, torchex_symbol("all_reduce_prim_impl"), buf, _sum_op(), rec.group, True, True)
    reduced, made_w = record_new(trace, torchex_symbol("wait_prim_impl"), fut)
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
            return BucketCode(bucket, made + made_c, [], relay=[*made_w, unpack]), ready
        return BucketCode(bucket, made + made_c, [*made_w, unpack]), ready
    # Hybrid: the reduced shard (1/world of the bucket) is all-reduced in place across the replicas.
    fut2, made_r = record_new(
        trace, torchex_symbol("all_reduce_prim_impl"), reduced, _sum_op(), rec.replica_group, True, True
    )
    averaged, made_w2 = record_new(trace, torchex_symbol("wait_prim_impl"), fut2)
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
    code = BucketCode(bucket, made + made_c, [*made_w2, unpack], relay=[*made_w, *made_r], relayed=relayed)
    return code, ready


def _accumulation_code(trace: Any, k: int, g: list[Member], idx: Index, trace_name: str) -> tuple[BucketCode, int]:
    """no_backward_sync: add the bucket's unsharded gradients to their accumulators instead of reducing them."""
    from thunder.core import dtypes

    from thunderviz.thunder.comm.accumulation import accumulation_dtype

    ops = Ops.get()
    divide, sends, ready = _divisions(g, idx)
    label = shared_label(g, f"#{k}")
    reduce_dtype = g[0].record.config.reduce_dtype
    wanted = None if reduce_dtype is None else getattr(torch, reduce_dtype)
    kept = [accumulation_dtype(dtypes.to_torch_dtype(s.dtype), wanted) for s in sends]
    keys = tuple(m.record.config.key for m in g)
    out, made = record_new(
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
    return BucketCode(bucket, made, []), ready


def _emit_reductions(
    bsyms: list[Any],
    removed: set[int],
    codes: list[BucketCode],
    issue_after: dict[int, list[int]],
    dropped: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[Any]:
    """Lay the buckets' code into the trace; the return gives no gradient (None) for the ``dropped`` results."""
    from thunder.core import prims

    out: list[Any] = []
    relays: list[BucketCode] = []  # issued buckets whose replica all_reduce is still to be issued

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


def _sum_op() -> Any:
    from thunder.distributed.prims import DistributedReduceOps

    return DistributedReduceOps.SUM
