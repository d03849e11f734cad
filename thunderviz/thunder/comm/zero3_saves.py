"""ZERO3's saved weights: forward saves shards, not tensors made from unsharded weights; backward recomputes them.

thunder's rematerialization already recomputes in backward what ``thunder_hooks`` tagged (the gathered weight), but
a view made inside a decomposition (a LayerNorm weight unsqueezed and expanded to the activation's shape) is still
saved for backward, and keeps the whole unsharded weight alive until then: ZERO3 would hold what it promised to
free. This pass drops such tensors from forward's saved list, saves the shards instead, and in backward gathers the
shards again and recomputes the dropped tensors just before their first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from thunderviz.thunder.comm.bucket_code import Index, ParamRecord, record_new, torchex_symbol
from thunderviz.trace.buckets import Bucket

__all__ = ["Zero3Plan", "drop_weight_saves", "resharded_weights", "restore_weight_saves"]


@dataclass
class Zero3Plan:
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
) -> tuple[list[Any], Zero3Plan | None]:
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
    return [*bsyms[:-1], new_ret], Zero3Plan([t.name for t in drop], added, chains, needed)


def restore_weight_saves(trace: Any, bsyms: list[Any], plan: Zero3Plan) -> list[Any]:
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
    idx = Index(bsyms)
    firsts = sorted((min(idx.consumers.get(n, [len(bsyms) - 1])), n) for n in plan.removed)
    insert_at: dict[int, list[Any]] = {}
    emitted: set[int] = set()
    gathered: set[str] = set()
    ag, wait = torchex_symbol("all_gather_prim_impl"), torchex_symbol("wait_prim_impl")

    def gather(w: Any, code: list[Any]) -> None:
        if w.name in gathered:
            return
        shard, rec = plan.weight_shard[w.name]
        fut, made = record_new(trace, ag, shard, rec.group, True, None)
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


def resharded_weights(
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
