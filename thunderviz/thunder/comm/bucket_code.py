"""What every bucketing pass of the communication pass shares: reading a trace, and the pieces of one bucket.

The passes (``gathers``, ``reductions``, ``zero3_saves``) all read the same things from an execution trace (where each
proxy is produced and consumed, where compute begins) and add code to it the same way (a symbol called inside the
trace, with fresh names); the gather and reduction passes describe a bucket alike (its members, the bound symbols
that issue it and wait for it). ``ParamRecord`` lives here rather than next to the Transform that collects the records
(``comm_pass``, which re-exports it) because every member carries one, and ``comm_pass`` imports the passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as tdist

from thunderviz.parallel.buckets import CommConfig
from thunderviz.thunder.compat import ensure_supported_thunder
from thunderviz.trace.buckets import Bucket

ensure_supported_thunder()  # everything below reads thunder 0.2.6's trace format

__all__ = [
    "BucketCode",
    "Index",
    "Member",
    "ParamRecord",
    "first_compute_index",
    "gather_key",
    "record_new",
    "replaced_positions",
    "shared_label",
    "strip_dels",
    "torchex_symbol",
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


# -- reading traces ------------------------------------------------------------------------------------------------


def strip_dels(bsyms: Sequence[Any]) -> list[Any]:
    """The trace without ``del`` / collection clearing: they are recomputed after the rewrite."""
    from thunder.core import prims
    from thunder.executors.pythonex import clear_mutable_collection

    skip = {prims.PrimIDs.DEL, clear_mutable_collection.id}
    return [b for b in bsyms if b.sym.id not in skip]


class Index:
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
        """The one position that reads ``name``, or None when several or none do (then it is not ours to move)."""
        uses = self.consumers.get(name, [])
        return uses[0] if len(uses) == 1 else None


def first_compute_index(bsyms: Sequence[Any]) -> int:
    """The first position after the trace's unpacking of its inputs: the earliest place to issue a collective."""
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


def record_new(trace: Any, fn: Any, *args: Any) -> tuple[Any, list[Any]]:
    """Call a symbol inside ``trace`` (fresh output names) and return its result and the bound symbols it made."""
    from thunder.core.trace import tracectx

    trace.push_scope([])
    try:
        with tracectx(trace):
            out = fn(*args)
    finally:
        made = trace.pop_scope()
    return out, made


# -- what every bucket shares --------------------------------------------------------------------------------------


@dataclass
class Member:
    """One parameter's collective found in a trace: with its wait, what a bucket of them replaces."""

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
class BucketCode:
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


def gather_key(m: Member) -> tuple:
    """Members with equal keys may share a collective: one flat buffer has one dtype and device, goes over one
    process group, and stays within one module's bucket plan."""
    c = m.record.config
    return (id(m.record.group), str(m.send.dtype), str(m.send.device), c.owner_id, c.label)


def shared_label(members: Sequence[Member], fallback: str) -> str:
    """The bucket plan's label when every member has the same one, else ``fallback``."""
    labels = {m.record.config.label for m in members}
    return labels.pop() if len(labels) == 1 else fallback


def replaced_positions(members: Sequence[Member]) -> set[int]:
    """Positions of the bound symbols the buckets replace (collectives, waits, folded divisions)."""
    return {i for m in members for i in m.removed}


def torchex_symbol(name: str) -> Any:
    """thunder's torch-executor symbol ``name`` (a collective or its wait): what execution traces call."""
    from thunder.executors import torchex

    return getattr(torchex, name)
