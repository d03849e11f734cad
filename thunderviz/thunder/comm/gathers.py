"""The all_gather buckets: parameters gathered in one collective per bucket, issued one bucket ahead of first use.

The forward (and, for ZERO3, the backward) ``all_gather`` of each distributed parameter is replaced by one per bucket
(``parallel.buckets``): the bucket's local shards are packed into one flat buffer, gathered once, and unpacked into
the same unsharded tensors the rest of the trace already uses. Buckets are issued in order of first use, one bucket
ahead: bucket k+1's all_gather is issued just before bucket k is waited for, so its transfer overlaps bucket k's
compute, and at most two unsharded buckets exist beyond those still in use. Why not all of them early: a gathered
bucket is its parameters unsharded, so gathering every bucket at once would hold the whole model unsharded. Under
hybrid sharding the gathers run in the shard group (``ParamRecord.group``).

ZERO3's backward gathers are thunder's own: ``thunder_hooks`` tags the gathered parameter as *recomputed in backward*
before autodiff, so thunder's rematerialization puts a second ``all_gather`` of the shard in the backward trace and
saves the shard, not the unsharded weight; this pass buckets and schedules those gathers like the forward's
(``zero3_saves`` handles what thunder still saves of the unsharded weights).
"""

from __future__ import annotations

from typing import Any

from thunderviz.parallel.buckets import group_in_order
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

__all__ = ["rewrite_gathers"]


def rewrite_gathers(
    trace: Any, bsyms: list[Any], records: dict[str, ParamRecord], trace_name: str
) -> tuple[list[Any], list[Bucket]]:
    """Bucket the ``all_gather``s of recorded shards and issue each bucket one bucket ahead of its first use."""
    members = _find_gathers(bsyms, records)
    if not members:
        return bsyms, []
    members, bsyms, idx = _dedupe_gathers(members, bsyms)
    groups = [g for _, g in group_in_order((gather_key(m), m) for m in members)]
    groups.sort(key=lambda g: _first_use(g, idx))
    issue_at, wait_at = _prefetch_schedule(groups, idx, first_compute_index(bsyms))
    codes = [_gather_code(trace, k, g, trace_name) for k, g in enumerate(groups)]
    return _emit_gathers(bsyms, replaced_positions(members), codes, issue_at, wait_at), [c.bucket for c in codes]


def _find_gathers(bsyms: list[Any], records: dict[str, ParamRecord]) -> list[Member]:
    """The dim-0 ``all_gather``s of recorded shards whose only consumer is their wait."""
    ids = executed_collective_ids()
    idx = Index(bsyms)
    members: list[Member] = []
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
            Member(
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


def _dedupe_gathers(members: list[Member], bsyms: list[Any]) -> tuple[list[Member], list[Any], Index]:
    """One gather per shard: a second gather of the same shard (thunder's recompute and ours) reuses the first."""
    from thunder.core.proxies import variableify

    kept: dict[str, Member] = {}
    swap: dict[Any, Any] = {}
    drop: set[int] = set()
    for m in members:
        first = kept.setdefault(m.send.name, m)
        if first is not m:
            swap[variableify(m.result)] = first.result
            drop.update(m.removed)
    if not swap:
        return members, bsyms, Index(bsyms)
    unique = list(kept.values())
    old_pos = {id(b): i for i, b in enumerate(bsyms)}
    new_bsyms = [b.from_bsym_swap_proxies(swap) for i, b in enumerate(bsyms) if i not in drop]
    survivors = [b for i, b in enumerate(bsyms) if i not in drop]
    remap = {old_pos[id(b)]: j for j, b in enumerate(survivors)}
    for m in unique:
        m.removed = [remap[i] for i in m.removed]
        m.collective, m.wait = new_bsyms[m.removed[0]], new_bsyms[m.removed[1]]
    return unique, new_bsyms, Index(new_bsyms)


def _first_use(g: list[Member], idx: Index) -> int:
    """Where the trace first needs a parameter of the bucket (its old wait when nothing uses it)."""
    uses = [u for m in g for u in idx.consumers.get(m.result.name, [])]
    return min(uses) if uses else min(m.removed[1] for m in g)


def _prefetch_schedule(
    groups: list[list[Member]], idx: Index, start: int
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


def _gather_code(trace: Any, k: int, g: list[Member], trace_name: str) -> BucketCode:
    """Pack the shards, gather once, unpack into the unsharded tensors the trace already uses (one member: as is)."""
    rec = g[0].record
    label = shared_label(g, f"#{k}")
    names = tuple(m.record.config.param_name for m in g)
    ops = Ops.get()
    if len(g) == 1:
        issue, wait = [g[0].collective], [g[0].wait]
        fut = g[0].collective.flat_proxy_outs[0]
    else:
        buf, made = record_new(trace, ops.pack_gather, [m.send for m in g], label, names)
        fut, made_ag = record_new(trace, torchex_symbol("all_gather_prim_impl"), buf, rec.group, True, None)
        gathered, made_w = record_new(trace, torchex_symbol("wait_prim_impl"), fut)
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
    return BucketCode(bucket, issue, wait)


def _emit_gathers(
    bsyms: list[Any],
    removed: set[int],
    codes: list[BucketCode],
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
