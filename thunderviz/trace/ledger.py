"""The collectives ledger: what each rank sends, in order, and where ranks disagree.

A collective is a rendezvous: if rank 0 issues ``all_gather(f32[64])`` while rank 1 issues
``all_gather(f32[32])`` or a ``reduce_scatter``, or one rank has one collective fewer, the job hangs (or, worse,
mixes up tensors) with no hint where. Lining up each rank's collectives and reporting the first place they differ
turns that hang into a sentence naming both ranks and the collective.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from thunderviz.trace.buckets import MESH_GROUP_WORDS, Bucket
from thunderviz.trace.model import COLLECTIVE_KINDS, OpRecord, TraceBundle, TraceSnapshot
from thunderviz.trace.wire import SENDING_KINDS, ring_bytes

__all__ = [
    "COLLECTIVE_KINDS",
    "Ledger",
    "LedgerEntry",
    "Mismatch",
    "bucket_description",
    "find_mismatches",
    "ledger_from_bundle",
]


@dataclass(frozen=True)
class LedgerEntry:
    """One collective or wait.

    ``tensor`` is the name of the tensor sent (the qualified parameter name when the trace knows it), ``shape``
    and ``dtype`` are those of that input, ``bytes`` its size on this rank (the collective's input, not what it
    sends: ``sent_bytes``), ``out_shape`` the result's shape.
    ``distance`` is the number of non-bookkeeping ops from the collective to its wait (None for a wait, or for
    a synchronous collective): small distances mean little overlap of communication with compute. A collective that
    thunderviz's communication pass packed for several parameters is one entry: ``bucket`` is its label and
    ``params`` the parameters it carries, ``bytes`` the whole bucket; ``tensor`` names it briefly
    (``blocks.0 (12 params, 97.6 KiB)``), the parameter list stays in ``params`` for details.
    """

    position: int
    trace: str
    op_index: int
    kind: str
    tensor: str
    shape: tuple[int, ...] | None
    dtype: str | None
    bytes: int | None
    group_size: int | None
    out_shape: tuple[int, ...] | None = None
    distance: int | None = None
    waits_for: int | None = None
    bucket: str | None = None
    params: tuple[str, ...] = ()
    #: hybrid sharding: ``shard`` or ``replica``, the group of the mesh the collective runs over (``Bucket``)
    mesh_group: str = ""

    def sent_bytes(self, world_size: int | None = None) -> int:
        """What this collective puts on the wire on this rank (``trace.wire.ring_bytes`` over its group, or over
        ``world_size`` ranks when the trace did not record the group); 0 for a wait."""
        if self.kind not in SENDING_KINDS or self.bytes is None:
            return 0
        return ring_bytes(self.kind, self.bytes, self.group_size or world_size or 1)

    def describe(self) -> str:
        """``all_gather of blocks.0.attn_qkv.weight float32[192, 128] (group of 2; forward op 8)``; under hybrid
        sharding ``(shard group of 2; ...)`` / ``(replica group of 2; ...)``."""
        shape = "?" if self.shape is None else "[" + ", ".join(str(d) for d in self.shape) + "]"
        which = f"{self.mesh_group} group" if self.mesh_group else "group"
        group = "" if self.group_size is None else f"{which} of {self.group_size}; "
        return f"{self.kind} of {self.tensor} {self.dtype or '?'}{shape} ({group}{self.trace} op {self.op_index})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "trace": self.trace,
            "op_index": self.op_index,
            "kind": self.kind,
            "tensor": self.tensor,
            "shape": None if self.shape is None else list(self.shape),
            "dtype": self.dtype,
            "bytes": self.bytes,
            "group_size": self.group_size,
            "out_shape": None if self.out_shape is None else list(self.out_shape),
            "distance": self.distance,
            "waits_for": self.waits_for,
            "bucket": self.bucket,
            "params": list(self.params),
            **({"mesh_group": self.mesh_group} if self.mesh_group else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LedgerEntry:
        shape, out_shape = d.get("shape"), d.get("out_shape")
        return cls(
            position=int(d["position"]),
            trace=str(d["trace"]),
            op_index=int(d["op_index"]),
            kind=str(d["kind"]),
            tensor=str(d["tensor"]),
            shape=None if shape is None else tuple(shape),
            dtype=d.get("dtype"),
            bytes=d.get("bytes"),
            group_size=d.get("group_size"),
            out_shape=None if out_shape is None else tuple(out_shape),
            distance=d.get("distance"),
            waits_for=d.get("waits_for"),
            bucket=d.get("bucket"),
            params=tuple(str(p) for p in d.get("params") or ()),
            mesh_group=str(d.get("mesh_group") or ""),
        )


@dataclass
class Ledger:
    """All collectives and waits of one rank, forward then backward, in issue order. ``world_size`` is the run's,
    for collectives whose group the trace did not record."""

    rank: int
    entries: list[LedgerEntry] = field(default_factory=list)
    name: str = ""
    world_size: int | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(COLLECTIVE_KINDS, 0)
        for e in self.entries:
            out[e.kind] = out.get(e.kind, 0) + 1
        return {k: v for k, v in out.items() if v}

    def sent_bytes(self) -> int:
        """What this rank puts on the wire in one step (``trace.wire``): every collective's ``sent_bytes``."""
        return sum(e.sent_bytes(self.world_size) for e in self.entries)

    def collectives(self) -> list[LedgerEntry]:
        """Entries other than waits: the rendezvous that must match across ranks."""
        return [e for e in self.entries if e.kind != "wait"]

    def to_dict(self) -> dict[str, Any]:
        out = {"rank": self.rank, "name": self.name, "entries": [e.to_dict() for e in self.entries]}
        return out | ({"world_size": self.world_size} if self.world_size else {})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Ledger:
        return cls(
            rank=int(d["rank"]),
            name=str(d.get("name", "")),
            entries=[LedgerEntry.from_dict(e) for e in d.get("entries", ())],
            world_size=d.get("world_size"),
        )


@dataclass(frozen=True)
class Mismatch:
    """The first place two ranks' collectives differ. ``field`` is count, kind, shape, dtype or group_size."""

    rank_a: int
    rank_b: int
    position: int
    field: str
    entry_a: LedgerEntry | None
    entry_b: LedgerEntry | None
    message: str

    def __str__(self) -> str:
        return self.message


def ledger_from_bundle(
    source: TraceBundle | TraceSnapshot | Iterable[TraceSnapshot], rank: int | None = None
) -> Ledger:
    """Build a rank's ledger from its bundle (forward then backward), one snapshot, or several snapshots."""
    world = None
    if isinstance(source, TraceBundle):
        snaps = list(source.traces().values())
        rank = source.rank if rank is None else rank
        name, world = source.name, source.world_size
    elif isinstance(source, TraceSnapshot):
        snaps, name = [source], source.label
    else:
        snaps, name = list(source), ""
        for s in snaps:
            if not isinstance(s, TraceSnapshot):
                raise TypeError(
                    f"ledger_from_bundle: expected a TraceBundle or TraceSnapshot(s), got {type(s).__name__}"
                )
    grads = source.gradient_params() if isinstance(source, TraceBundle) else {}
    ledger = Ledger(rank=0 if rank is None else rank, name=name, world_size=world)
    for snap in snaps:
        _append_snapshot(ledger, snap, grads if snap.label == "backward" else {})
    return ledger


def _append_snapshot(ledger: Ledger, snap: TraceSnapshot, grads: Mapping[str, str]) -> None:
    # Position of each op among non-bookkeeping ops, to measure collective -> wait distance in real work.
    work_pos: dict[int, int] = {}
    n = 0
    for op in snap.ops:
        if not op.is_bookkeeping:
            n += 1
        work_pos[op.index] = n
    future_owner: dict[str, int] = {}  # future tensor name -> ledger position of the collective
    pending: dict[int, OpRecord] = {}
    buckets = snap.buckets_by_issue()
    for op in snap.ops:
        if op.collective is None:
            continue
        pos = len(ledger.entries)
        if op.is_wait:
            fut = next((t for t in op.inputs if t.kind == "future"), op.inputs[0] if op.inputs else None)
            src_pos = future_owner.get(fut.name) if fut is not None else None
            out = op.outputs[0] if op.outputs else None
            if src_pos is not None and out is not None and out.name in grads:
                # A gradient's proxy name (t3723) means nothing to a person; the parameter's name does.
                ledger.entries[src_pos] = _replace(ledger.entries[src_pos], tensor=f"grad of {grads[out.name]}")
            tensor = ledger.entries[src_pos].tensor if src_pos is not None else (fut.name if fut else "?")
            ledger.entries.append(
                LedgerEntry(
                    position=pos,
                    trace=snap.label,
                    op_index=op.index,
                    kind="wait",
                    tensor=tensor,
                    shape=out.shape if out else None,
                    dtype=out.dtype if out else None,
                    bytes=None,
                    group_size=None,
                    out_shape=out.shape if out else None,
                    waits_for=src_pos,
                    bucket=ledger.entries[src_pos].bucket if src_pos is not None else None,
                    params=ledger.entries[src_pos].params if src_pos is not None else (),
                    mesh_group=ledger.entries[src_pos].mesh_group if src_pos is not None else "",
                )
            )
            coll_op = pending.pop(src_pos, None) if src_pos is not None else None
            if coll_op is not None:  # a second wait on the same future (only in an edited file) measures nothing
                src = ledger.entries[src_pos]
                ledger.entries[src_pos] = _replace(src, distance=work_pos[op.index] - work_pos[coll_op.index])
            continue
        tensors = [t for t in op.inputs if t.shape is not None]
        inp = tensors[0] if tensors else None
        out = next((t for t in op.outputs if t.shape is not None), None)
        tensor = "?" if inp is None else snap.param_names.get(inp.name, inp.name)
        bucket = buckets.get(op.index)
        if bucket is not None:
            tensor = bucket_description(bucket)
        ledger.entries.append(
            LedgerEntry(
                position=pos,
                trace=snap.label,
                op_index=op.index,
                kind=op.collective or "?",
                tensor=tensor,
                shape=inp.shape if inp else None,
                dtype=inp.dtype if inp else None,
                bytes=bucket.bytes if bucket is not None else (inp.bytes if inp else None),
                group_size=op.group_size,
                out_shape=out.shape if out else None,
                bucket=None if bucket is None else bucket.label,
                params=() if bucket is None else tuple(bucket.params),
                mesh_group="" if bucket is None else bucket.mesh_group,
            )
        )
        for t in op.outputs:
            if t.kind == "future":
                future_owner[t.name] = pos
                pending[pos] = op


def bucket_description(bucket: Bucket) -> str:
    """How a ledger row (and so every message and view) names a bucket: ``blocks.0 (12 params, 97.6 KiB)``; a
    bucket of one parameter by that parameter (``grad of ...`` when reduced). Never the parameter list: a real
    model's buckets hold hundreds."""
    params = list(bucket.params)
    where = MESH_GROUP_WORDS.get(bucket.mesh_group, "")
    if len(params) == 1:
        return (params[0] if bucket.kind == "all_gather" else f"grad of {params[0]}") + where
    return bucket.summary + where


def _replace(e: LedgerEntry, **kw: Any) -> LedgerEntry:
    from dataclasses import replace

    return replace(e, **kw)


def find_mismatches(ledgers: Mapping[int, Ledger]) -> list[Mismatch]:
    """Compare every rank's collectives with the lowest rank's; one ``Mismatch`` per disagreeing rank.

    Only the first difference per pair is reported: after it, the ranks are out of step and every later
    collective would differ too. Waits are local and not compared; tensor names may differ between ranks
    (proxy numbering) and are not compared either.
    """
    if not ledgers:
        return []
    ranks = sorted(ledgers)
    ref_rank = ranks[0]
    ref = ledgers[ref_rank].collectives()
    out: list[Mismatch] = []
    for r in ranks[1:]:
        other = ledgers[r].collectives()
        m = _first_difference(ref_rank, ref, r, other)
        if m is not None:
            out.append(m)
    return out


def _first_difference(ra: int, a: list[LedgerEntry], rb: int, b: list[LedgerEntry]) -> Mismatch | None:
    for i, (ea, eb) in enumerate(zip(a, b, strict=False)):  # unequal lengths are reported below
        for fld in ("kind", "shape", "dtype", "group_size", "mesh_group"):
            va, vb = getattr(ea, fld), getattr(eb, fld)
            if va != vb:
                msg = (
                    f"Ranks {ra} and {rb} disagree at collective {i + 1} ({fld} differs): "
                    f"rank {ra} issues {ea.describe()}, rank {rb} issues {eb.describe()}. "
                    "A real job would hang or mix up tensors here; make both ranks build the same model and "
                    "take the same code path (same shapes, dtypes and sharding)."
                )
                return Mismatch(ra, rb, i, fld, ea, eb, msg)
    if len(a) != len(b):
        i = min(len(a), len(b))
        longer, shorter = (ra, rb) if len(a) > len(b) else (rb, ra)
        extra = (a if len(a) > len(b) else b)[i]
        msg = (
            f"Ranks {ra} and {rb} issue different numbers of collectives: rank {ra} has {len(a)}, rank {rb} has "
            f"{len(b)}. The first one without a partner is collective {i + 1} on rank {longer}: {extra.describe()}; "
            f"rank {shorter} never issues it, so rank {longer} would wait forever."
        )
        return Mismatch(ra, rb, i, "count", a[i] if i < len(a) else None, b[i] if i < len(b) else None, msg)
    return None
