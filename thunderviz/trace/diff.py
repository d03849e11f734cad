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

from thunderviz.trace.model import COLLECTIVE_KINDS, OpRecord, TraceBundle, TraceSnapshot
from thunderviz.trace.units import format_bytes

__all__ = ["DiffRow", "TraceDiff", "canonical_names", "collective_changes", "diff_traces", "memory_changes"]


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

    ``+4 all_gather (backward), +4 wait (backward); saved for backward 41.2 MiB -> 37.7 MiB`` for ZERO2 -> ZERO3:
    the collectives each trace gained or lost (net, as ``TraceDiff.collective_delta``), then what forward keeps
    for backward when either run recorded it (``memory_changes``).
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
        line += f"; saved for backward {format_bytes(saved_a['bytes'])} -> {format_bytes(saved_b['bytes'])}"
    if a.backward is not None and b.backward is not None:
        recomputed = b.backward.recomputed_ops - a.backward.recomputed_ops
        if recomputed:
            line += f"; {recomputed:+d} recomputed ops"
    kept = _kept_for_accumulation(a, b)
    return f"{line}; {kept}" if kept else line


def memory_changes(a: TraceBundle, b: TraceBundle, label: str | None = None) -> list[str]:
    """What changed in memory from run ``a`` to run ``b``, as clauses, unchanged ones left out: what forward saves
    for backward (``saved for backward 218.1 KiB -> 178.3 KiB``), the unsharded gradients a no_backward_sync
    backward keeps between micro-batches (``kept for accumulation 0 B -> 3.7 KiB``), and thunder's estimated peak
    of trace ``label`` (``trace estimate backward 1.2 MiB -> 1.0 MiB``: thunder's ``get_alloc_memory``, one trace's
    intermediates, not a step peak; both traces without ``label``). Recomputed ops
    are a change of the trace, so ``TraceDiff.summary_parts`` names them."""
    out = []
    saved_a, saved_b = a.saved_for_backward, b.saved_for_backward
    if (saved_a["tensors"] or saved_b["tensors"]) and saved_a["bytes"] != saved_b["bytes"]:
        out.append(f"saved for backward {format_bytes(saved_a['bytes'])} -> {format_bytes(saved_b['bytes'])}")
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
