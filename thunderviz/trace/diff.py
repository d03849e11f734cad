"""Structural diff of two traces: what FSDP added to DDP, what ZERO3 changed from ZERO2, what a pass did.

Proxy names (``t2974``) are numbering accidents: two runs of the same model give different ones. The diff
therefore aligns ops by what they are (op name, output shapes and dtypes) and shows tensors under canonical names
(parameters by their qualified name, everything else ``v0, v1, ...`` in order of first appearance). Bookkeeping
ops (``python_del`` and friends) are ignored by default: they are half of a backward trace and all noise here.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from thunderviz.trace.attribution import top_group
from thunderviz.trace.buckets import Bucket, is_bucket_group
from thunderviz.trace.ledger import ledger_from_bundle
from thunderviz.trace.model import COLLECTIVE_KINDS, OpRecord, TraceBundle, TraceSnapshot, short_op_name
from thunderviz.trace.saved import TRACE_SAVED
from thunderviz.trace.units import format_bytes
from thunderviz.trace.wire import SENDING_KINDS, ring_bytes

__all__ = [
    "DiffRow",
    "GroupChange",
    "TraceDiff",
    "bytes_per_step",
    "canonical_names",
    "collective_changes",
    "diff_traces",
    "group_changes",
    "memory_changes",
    "sent_bytes",
    "verdict",
]


@dataclass(frozen=True)
class DiffRow:
    """One line of the aligned view. ``tag``: ``=`` same, ``+`` only in b, ``-`` only in a, ``~`` changed."""

    tag: str
    a: OpRecord | None
    b: OpRecord | None


@dataclass
class TraceDiff:
    a_label: str
    b_label: str
    rows: list[DiffRow] = field(default_factory=list)
    names_a: dict[str, str] = field(default_factory=dict)
    names_b: dict[str, str] = field(default_factory=dict)

    @property
    def added(self) -> list[OpRecord]:
        return [r.b for r in self.rows if r.tag == "+" and r.b is not None]

    @property
    def removed(self) -> list[OpRecord]:
        return [r.a for r in self.rows if r.tag == "-" and r.a is not None]

    @property
    def changed(self) -> list[tuple[OpRecord, OpRecord]]:
        return [(r.a, r.b) for r in self.rows if r.tag == "~" and r.a is not None and r.b is not None]

    @property
    def unchanged(self) -> int:
        return sum(1 for r in self.rows if r.tag == "=")

    def collective_delta(self) -> dict[str, int]:
        """kind -> net change in count from a to b (only kinds that changed).

        Net, because a collective whose shape changed at the same place (the wait of a sharded gradient) is an
        edit of the same rendezvous, not one more.
        """
        add = Counter(op.collective for op in self.added if op.collective)
        rem = Counter(op.collective for op in self.removed if op.collective)
        delta = {k: add.get(k, 0) - rem.get(k, 0) for k in COLLECTIVE_KINDS}
        return {k: v for k, v in delta.items() if v}

    def recomputed_delta(self) -> int:
        """How many more ops recompute forward values in b than in a (``OpRecord.recomputed``). Counted over both
        sides whole: a recomputed op can align with the same op of a, which computed it once from saved values."""
        in_b = sum(1 for r in self.rows if r.b is not None and r.b.recomputed)
        return in_b - sum(1 for r in self.rows if r.a is not None and r.a.recomputed)

    def summary_parts(self) -> list[str]:
        """The summary's clauses, each one kind of change, empty ones left out: ``["+53 all_gather, +53 wait",
        "other ops +91, −144", "+87 recomputed ops"]`` (ops backward recomputes from forward's inputs: activation
        checkpointing, ZERO3). A new kind of change is one more clause here, and every view that prints the summary
        shows it."""
        delta = self.collective_delta()
        collectives = [f"+{v} {k}" for k, v in delta.items() if v > 0] + [
            f"−{-v} {k}" for k, v in delta.items() if v < 0
        ]
        n_add = sum(1 for op in self.added if not op.collective)
        n_rem = sum(1 for op in self.removed if not op.collective)
        other = [
            t
            for n, t in (
                (n_add, f"+{n_add}"),
                (n_rem, f"−{n_rem}"),
                (len(self.changed), f"~{len(self.changed)} changed"),
            )
            if n
        ]
        parts = [", ".join(collectives)] if collectives else []
        if other:
            parts.append("other ops " + ", ".join(other))
        recomputed = self.recomputed_delta()
        if recomputed:
            parts.append(f"{recomputed:+d} recomputed ops")
        return parts

    @property
    def summary(self) -> str:
        """One line: ``+53 all_gather, +53 wait; other ops +91, −144`` (terms that are zero are left out; ``no
        differences`` when nothing differs)."""
        return "; ".join(self.summary_parts()) or "no differences"

    def describe(self, op: OpRecord, side: str) -> str:
        names = self.names_a if side == "a" else self.names_b
        outs = ", ".join(f"{names.get(t.name, t.name)}:{t.short()}" for t in op.outputs) or "-"
        ins = ", ".join(names.get(t.name, t.name) for t in op.inputs)
        where = f"  [{op.module}]" if op.module else ""
        return f"{outs} = {op.op}({ins}){where}"

    def to_text(self, context: int = 2, max_rows: int = 400) -> str:
        """The aligned view as text: differing rows with ``context`` equal rows around them."""
        keep = set()
        for i, r in enumerate(self.rows):
            if r.tag != "=":
                keep.update(range(max(0, i - context), min(len(self.rows), i + context + 1)))
        lines = [f"--- {self.a_label}", f"+++ {self.b_label}", self.summary]
        last = -1
        for i in sorted(keep):
            if len(lines) >= max_rows:
                lines.append(f"... {len(keep) - max_rows} more rows")
                break
            if i != last + 1:
                lines.append("@@")
            r = self.rows[i]
            if r.tag == "~":
                lines.append(f"- {self.describe(r.a, 'a')}")
                lines.append(f"+ {self.describe(r.b, 'b')}")
            elif r.tag == "-":
                lines.append(f"- {self.describe(r.a, 'a')}")
            elif r.tag == "+":
                lines.append(f"+ {self.describe(r.b, 'b')}")
            else:
                lines.append(f"  {self.describe(r.b, 'b')}")
            last = i
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary


def canonical_names(snap: TraceSnapshot) -> dict[str, str]:
    """Proxy name -> stable name: parameters keep their qualified names, the rest are numbered by first use."""
    out: dict[str, str] = {}
    for name, qual in snap.param_names.items():
        out[name] = qual
    n = 0
    for op in snap.ops:
        for t in (*op.inputs, *op.outputs):
            if t.name not in out:
                out[t.name] = f"v{n}"
                n += 1
    return out


def _key(op: OpRecord) -> tuple:
    return (op.op, tuple((t.shape, t.dtype) for t in op.outputs))


def _ops(snap: TraceSnapshot, include_bookkeeping: bool) -> list[OpRecord]:
    return [op for op in snap.ops if include_bookkeeping or not op.is_bookkeeping]


def diff_traces(a: TraceSnapshot, b: TraceSnapshot, *, include_bookkeeping: bool = False) -> TraceDiff:
    """Align ``a`` and ``b`` op by op and classify every op as same, added, removed or changed.

    An op is *changed* when the same op sits at the aligned position with different output shapes or dtypes
    (a sharded vs a full weight); other differences are an add plus a remove.
    """
    if not isinstance(a, TraceSnapshot) or not isinstance(b, TraceSnapshot):
        raise TypeError(
            f"diff_traces(a, b) compares two TraceSnapshot objects (bundle.forward, bundle.backward or a stage); "
            f"got {type(a).__name__} and {type(b).__name__}"
        )
    ops_a, ops_b = _ops(a, include_bookkeeping), _ops(b, include_bookkeeping)
    sm = difflib.SequenceMatcher(None, [_key(o) for o in ops_a], [_key(o) for o in ops_b], autojunk=False)
    rows: list[DiffRow] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            rows += [DiffRow("=", ops_a[i], ops_b[j]) for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
        elif tag == "delete":
            rows += [DiffRow("-", ops_a[i], None) for i in range(i1, i2)]
        elif tag == "insert":
            rows += [DiffRow("+", None, ops_b[j]) for j in range(j1, j2)]
        else:
            rows += list(_pair_replaced(ops_a[i1:i2], ops_b[j1:j2]))
    return TraceDiff(
        a_label=a.label, b_label=b.label, rows=rows, names_a=canonical_names(a), names_b=canonical_names(b)
    )


def _pair_replaced(xs: list[OpRecord], ys: list[OpRecord]) -> Iterable[DiffRow]:
    """Inside a replaced block, pair ops of the same name as changes (in order); the rest are adds/removes."""
    inner = difflib.SequenceMatcher(None, [o.op for o in xs], [o.op for o in ys], autojunk=False)
    for tag, i1, i2, j1, j2 in inner.get_opcodes():
        if tag == "equal":
            yield from (DiffRow("~", xs[i], ys[j]) for i, j in zip(range(i1, i2), range(j1, j2), strict=True))
        else:
            yield from (DiffRow("-", xs[i], None) for i in range(i1, i2))
            yield from (DiffRow("+", None, ys[j]) for j in range(j1, j2))


def collective_changes(a: TraceBundle, b: TraceBundle) -> str:
    """How the communication changes from run ``a`` to run ``b``, forward and backward, in one line.

    ``+4 all_gather (backward), +4 wait (backward); saved tensors (trace) 41.2 MiB -> 37.7 MiB`` for ZERO2 -> ZERO3:
    the collectives each trace gained or lost (net, as ``TraceDiff.collective_delta``), then what forward's trace
    hands to backward when either run recorded it (``memory_changes``; ``trace.saved.TRACE_SAVED``).
    """
    if not isinstance(a, TraceBundle) or not isinstance(b, TraceBundle):
        raise TypeError(
            f"collective_changes(a, b) compares two TraceBundle objects (from capture or a trace file); "
            f"got {type(a).__name__} and {type(b).__name__}"
        )
    parts = []
    for label in ("forward", "backward"):
        sa, sb = a.traces().get(label), b.traces().get(label)
        if sa is not None and sb is not None:
            parts += [f"{v:+d} {k} ({label})" for k, v in diff_traces(sa, sb).collective_delta().items()]
    line = ", ".join(parts) or "the same collectives"
    saved_a, saved_b = a.saved_for_backward, b.saved_for_backward
    if saved_a["tensors"] or saved_b["tensors"]:
        line += f"; {TRACE_SAVED} {format_bytes(saved_a['bytes'])} -> {format_bytes(saved_b['bytes'])}"
    if a.backward is not None and b.backward is not None:
        recomputed = b.backward.recomputed_ops - a.backward.recomputed_ops
        if recomputed:
            line += f"; {recomputed:+d} recomputed ops"
    kept = _kept_for_accumulation(a, b)
    return f"{line}; {kept}" if kept else line


def memory_changes(a: TraceBundle, b: TraceBundle, label: str | None = None) -> list[str]:
    """What changed in memory from run ``a`` to run ``b``, as clauses, unchanged ones left out: what forward's trace
    hands to backward (``saved tensors (trace) 218.1 KiB -> 178.3 KiB``: ``trace.saved.TRACE_SAVED``), the
    unsharded gradients a no_backward_sync backward keeps between micro-batches (``kept for accumulation 0 B -> 3.7
    KiB``), and thunder's estimated peak of trace ``label`` (``trace estimate backward 1.2 MiB -> 1.0 MiB``:
    thunder's ``get_alloc_memory``, one trace's intermediates, not a step peak; both traces without ``label``).
    Recomputed ops are a change of the trace, so ``TraceDiff.summary_parts`` names them."""
    out = []
    saved_a, saved_b = a.saved_for_backward, b.saved_for_backward
    if (saved_a["tensors"] or saved_b["tensors"]) and saved_a["bytes"] != saved_b["bytes"]:
        out.append(f"{TRACE_SAVED} {format_bytes(saved_a['bytes'])} -> {format_bytes(saved_b['bytes'])}")
    kept = _kept_for_accumulation(a, b)
    if kept:
        out.append(kept)
    for name in [label] if label else ["forward", "backward"]:
        pa, pb = a.memory.get(name), b.memory.get(name)
        if pa is not None and pb is not None and pa != pb:
            out.append(f"trace estimate {name} {format_bytes(pa)} -> {format_bytes(pb)}")
    return out


def _kept_for_accumulation(a: TraceBundle, b: TraceBundle) -> str:
    """``kept for accumulation 0 B -> 3.7 KiB`` when either run kept gradients between micro-batches, else ""."""
    kept_a, kept_b = a.accumulated_gradients["bytes"], b.accumulated_gradients["bytes"]
    return f"kept for accumulation {format_bytes(kept_a)} -> {format_bytes(kept_b)}" if kept_a or kept_b else ""


# -- per group: what a comparison's outlines and click details say ------------------------------------------------


@dataclass(frozen=True)
class GroupChange:
    """How one collapsed group (``blocks.0``, a bucket's ``all_gather blocks.0``) differs from run a to run b.

    ``status``: ``added`` / ``removed`` when only one run has the group at all, ``changed`` when both have it and
    its ops differ, ``same`` otherwise. A block both runs have is never ``added`` because ops were added to it:
    ZERO3's backward puts a few unsqueeze/expand ops into every block that ZERO2's backward has too (a diff
    once outlined them as "only in the right run"). ``communication`` says the same of the group's collectives and waits
    alone (its collectives node in the graph; ``""`` when neither run has any), ``compute`` of its other ops (the
    block's own node). Op counts are by short op name (``unsqueeze``, ``all_gather``); ``ops_changed`` counts ops
    at the same place with other output shapes or dtypes (a sharded gradient's wait); ``bytes_a``/``bytes_b`` what
    the group's collectives send on this rank (``sent_bytes``).
    """

    name: str
    status: str
    communication: str
    compute: str
    ops_added: dict[str, int]
    ops_removed: dict[str, int]
    ops_changed: dict[str, int]
    collectives_a: dict[str, int]
    collectives_b: dict[str, int]
    bytes_a: int
    bytes_b: int

    def describe(self, a_label: str = "a", b_label: str = "b") -> str:
        """One line: ``blocks.0 changed: ops +4 unsqueeze, +2 expand``; ``all_gather blocks.0: only in zero3``."""
        if self.status == "added":
            return f"{self.name}: only in {b_label}"
        if self.status == "removed":
            return f"{self.name}: only in {a_label}"
        if self.status == "same":
            return f"{self.name}: the same in both"
        parts = []
        ops = [f"+{n} {k}" for k, n in self.ops_added.items()] + [f"\u2212{n} {k}" for k, n in self.ops_removed.items()]
        ops += [f"~{n} {k}" for k, n in self.ops_changed.items()]
        if ops:
            parts.append("ops " + ", ".join(ops))
        if self.bytes_a != self.bytes_b:
            parts.append(f"bytes sent {format_bytes(self.bytes_a)} -> {format_bytes(self.bytes_b)}")
        return f"{self.name} changed: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "communication": self.communication,
            "compute": self.compute,
            "ops_added": dict(self.ops_added),
            "ops_removed": dict(self.ops_removed),
            "ops_changed": dict(self.ops_changed),
            "collectives_a": dict(self.collectives_a),
            "collectives_b": dict(self.collectives_b),
            "bytes_a": self.bytes_a,
            "bytes_b": self.bytes_b,
        }


def sent_bytes(op: OpRecord, buckets: dict[int, Bucket], world_size: int | None = None) -> int:
    """What collective ``op`` puts on the wire on this rank (``trace.wire``): the ring bytes of its bucket, else of
    its first shaped input, over its group (``world_size`` ranks when the trace did not record the group); 0 for a
    wait. The ledger's rule (``LedgerEntry.sent_bytes`` counts the same collective the same)."""
    if not op.is_collective or op.collective not in SENDING_KINDS:
        return 0
    bucket = buckets.get(op.index)
    if bucket is not None:
        n = bucket.bytes
    else:
        inp = next((t for t in op.inputs if t.shape is not None), None)
        n = (inp.bytes or 0) if inp is not None else 0
    return ring_bytes(op.collective, n, op.group_size or world_size or 1)


def _group(op: OpRecord) -> str:
    return top_group(op.module)


def _by_kind(ops: Iterable[OpRecord]) -> dict[str, int]:
    counts = Counter(op.collective for op in ops if op.collective)
    return {k: counts[k] for k in COLLECTIVE_KINDS if counts.get(k)}


def _part_status(in_a: bool, in_b: bool, same: bool) -> str:
    """One part of a group (its compute, its communication): ``""`` in neither run, else as ``GroupChange.status``."""
    if not in_a and not in_b:
        return ""
    if not in_a or not in_b:
        return "added" if in_b else "removed"
    return "same" if same else "changed"


def group_changes(a: TraceSnapshot, b: TraceSnapshot, diff: TraceDiff | None = None) -> dict[str, GroupChange]:
    """Every group of ``a`` and ``b`` (as the graph collapses them: ``trace.attribution.top_group``) -> its
    ``GroupChange``, in ``b``'s order, then the groups only ``a`` has.

    An aligned op that moved to another group counts as removed from the one and added to the other.
    """
    diff = diff if diff is not None else diff_traces(a, b)
    ops_a, ops_b = _ops(a, False), _ops(b, False)
    members_a: dict[str, list[OpRecord]] = {}
    members_b: dict[str, list[OpRecord]] = {}
    for op in ops_a:
        members_a.setdefault(_group(op), []).append(op)
    for op in ops_b:
        members_b.setdefault(_group(op), []).append(op)
    added: dict[str, Counter[str]] = {}
    removed: dict[str, Counter[str]] = {}
    changed: dict[str, Counter[str]] = {}
    comm_differs: set[str] = set()
    compute_differs: set[str] = set()

    def touched(group: str, op: OpRecord) -> None:
        (comm_differs if op.collective else compute_differs).add(group)

    for r in diff.rows:
        ga = _group(r.a) if r.a is not None else None
        gb = _group(r.b) if r.b is not None else None
        if r.tag == "=" and ga == gb:
            continue
        if r.tag == "~" and ga == gb and r.a is not None and r.b is not None:
            changed.setdefault(ga, Counter())[short_op_name(r.b.op)] += 1
            touched(ga, r.a)
            touched(ga, r.b)
            continue
        if r.a is not None and ga is not None:
            removed.setdefault(ga, Counter())[short_op_name(r.a.op)] += 1
            touched(ga, r.a)
        if r.b is not None and gb is not None:
            added.setdefault(gb, Counter())[short_op_name(r.b.op)] += 1
            touched(gb, r.b)
    buckets_a, buckets_b = a.buckets_by_issue(), b.buckets_by_issue()
    out: dict[str, GroupChange] = {}
    for name in [*members_b, *(n for n in members_a if n not in members_b)]:
        in_a, in_b = members_a.get(name, []), members_b.get(name, [])
        coll_a, coll_b = _by_kind(in_a), _by_kind(in_b)
        bytes_a = sum(sent_bytes(op, buckets_a) for op in in_a)
        bytes_b = sum(sent_bytes(op, buckets_b) for op in in_b)
        differs = name in added or name in removed or name in changed
        status = "added" if not in_a else "removed" if not in_b else "changed" if differs else "same"
        communication = _part_status(
            bool(coll_a), bool(coll_b), coll_a == coll_b and bytes_a == bytes_b and name not in comm_differs
        )
        compute = _part_status(
            any(op.collective is None for op in in_a),
            any(op.collective is None for op in in_b),
            name not in compute_differs,
        )
        out[name] = GroupChange(
            name=name,
            status=status,
            communication=communication,
            compute=compute,
            ops_added=dict(added.get(name, Counter()).most_common()),
            ops_removed=dict(removed.get(name, Counter()).most_common()),
            ops_changed=dict(changed.get(name, Counter()).most_common()),
            collectives_a=coll_a,
            collectives_b=coll_b,
            bytes_a=bytes_a,
            bytes_b=bytes_b,
        )
    return out


# -- the comparison's verdict: one sentence on what the second run sends and why -----------------------------------

_VERBS = {"all_gather": "gathers", "reduce_scatter": "reduce-scatters", "all_reduce": "all-reduces"}
_GERUNDS = {"all_gather": "gathering", "reduce_scatter": "reduce-scattering", "all_reduce": "all-reducing"}


def bytes_per_step(bundle: TraceBundle) -> int:
    """What one rank puts on the wire in one step (its forward and backward trace; ``trace.wire``): its ledger's
    ``sent_bytes``, so the verdict, the ledger and the "which strategy?" table say one number."""
    return ledger_from_bundle(bundle).sent_bytes()


def _where(ops: list[OpRecord], snap: TraceSnapshot) -> str:
    """``every block``, ``every block and root``, ``blocks.0 and blocks.1``: the groups ``ops`` belong to (a
    bucket's collective by its bucket's title), the model's numbered blocks named together when all of them are."""
    buckets = snap.buckets_by_issue()
    names = list(
        dict.fromkeys(
            buckets[op.index].title if op.index in buckets and is_bucket_group(_group(op)) else _group(op) for op in ops
        )
    )
    groups = {_group(op) for op in snap.ops if not op.is_bookkeeping}
    blocks = {g for g in groups if not is_bucket_group(g) and g.rsplit(".", 1)[-1].isdigit()}
    if len(blocks) >= 2 and blocks <= set(names):
        rest = [n for n in names if n not in blocks]
        names = ["every block", *rest]
    if len(names) > 3:
        keep = 1 if names[0] == "every block" else 2
        names = [*names[:keep], f"{len(names) - keep} more groups"]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _trace_clauses(label: str, sa: TraceSnapshot, sb: TraceSnapshot, b: TraceBundle) -> list[str]:
    d = diff_traces(sa, sb)
    delta = {k: v for k, v in d.collective_delta().items() if k != "wait"}
    gained = [k for k, v in delta.items() if v > 0]
    lost = [k for k, v in delta.items() if v < 0]
    out = []
    for i, kind in enumerate(gained):
        where = _where([op for op in d.added if op.collective == kind], sb)
        earlier = label == "backward" and any(op.collective == kind for op in b.forward.ops)
        clause = f"{_VERBS.get(kind, kind)} {where}{' again' if earlier else ''} in {label}"
        if i < len(lost):
            clause += f" instead of {_GERUNDS.get(lost[i], lost[i])}"
        out.append(clause)
    for kind in lost[len(gained) :]:
        where = _where([op for op in d.removed if op.collective == kind], sa)
        out.append(f"no longer {_VERBS.get(kind, kind)} {where} in {label}")
    return out


def _signed(n: int) -> str:
    sign = "+" if n > 0 else "\u2212"
    return "the same" if n == 0 else f"{sign}{format_bytes(abs(n))}"


def verdict(
    a: TraceBundle, b: TraceBundle, a_name: str, b_name: str, memory: tuple[str, int, int] | None = None
) -> str:
    """One sentence for a comparison's header: how many bytes ``b`` sends per step against ``a``, why (the
    collectives each trace gained or lost, and for which groups), and one memory difference.

    ``zero3 sends 1.33x zero2's bytes per step (197.9 KiB -> 263.9 KiB): it gathers every block and root again in
    backward; saved tensors (trace) −135.4 KiB``. ``memory`` is ``(what, bytes_a, bytes_b)`` (a measured step peak,
    say); without it, what forward's trace hands to backward when either run recorded it.
    """
    if not isinstance(a, TraceBundle) or not isinstance(b, TraceBundle):
        raise TypeError(f"verdict(a, b) compares two TraceBundle objects; got {type(a).__name__}, {type(b).__name__}")
    sa, sb = bytes_per_step(a), bytes_per_step(b)
    if not sa and not sb:
        head = f"neither {a_name} nor {b_name} sends anything"
    elif not sa:
        head = f"{b_name} sends {format_bytes(sb)} per step, {a_name} nothing"
    elif abs(sb / sa - 1) < 0.005:
        head = f"{b_name} sends the same bytes per step as {a_name} ({format_bytes(sa)})"
    else:
        ratio = f"{sb / sa:.2f}".rstrip("0").rstrip(".")
        head = f"{b_name} sends {ratio}x {a_name}'s bytes per step ({format_bytes(sa)} -> {format_bytes(sb)})"
    clauses = []
    for label in ("forward", "backward"):
        ta, tb = a.traces().get(label), b.traces().get(label)
        if ta is not None and tb is not None:
            clauses += _trace_clauses(label, ta, tb, b)
    sentence = head + (": it " + " and ".join(clauses) if clauses else ": the same collectives")
    if memory is None and (a.saved_for_backward["tensors"] or b.saved_for_backward["tensors"]):
        memory = (TRACE_SAVED, a.saved_for_backward["bytes"], b.saved_for_backward["bytes"])
    if memory is not None:
        sentence += f"; {memory[0]} {_signed(memory[2] - memory[1])}"
    return sentence
