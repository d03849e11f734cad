"""What forward keeps for backward, attributed: per collapsed-graph group, per source line, and against eager PyTorch.

Saved tensors are the activations half of a step's memory (``trace.memory``'s ``saved activations``), and the
question users ask is where they come from. The forward trace knows: each saved tensor has a producing op, the op
has a module (``trace.attribution``; its top group is the collapsed graph's block) and a source line (thunder
records them for forward ops). A saved tensor no op produced is an input of the trace (a parameter or its shard, or
the batch). Plain data: no torch, so reports and widgets use it anywhere.

``SavedComparison`` is thunder against eager PyTorch for the same module, line by line (made by
``thunder.memory.saved_compare``): where thunder saves more, which tensors, from which line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from thunderviz.trace.attribution import top_group
from thunderviz.trace.model import TraceSnapshot

__all__ = [
    "INPUTS",
    "TRACE_SAVED",
    "TRACE_SAVED_NOTE",
    "LineComparison",
    "SavedComparison",
    "SavedRow",
    "SavedTensor",
    "saved_by_group",
    "saved_by_line",
    "saved_tensors",
]

#: The key of saved tensors that no op of the trace produced: trace inputs (parameters, their shards, the batch).
INPUTS = "(trace inputs: parameters and the batch)"

#: How every view names what this module attributes: the trace's own list of what forward hands to backward. Not the
#: memory account's "saved for backward" (``trace.memory``), a part of the step peak: the trace counts once per
#: tensor (views again), parameters included, whether or not it is alive at the peak, so it can exceed the peak.
TRACE_SAVED = "saved tensors (trace)"
#: One sentence that says so, for the views' notes.
TRACE_SAVED_NOTE = (
    "Saved tensors (trace): every tensor the forward trace hands to backward, once per tensor, parameters included;"
    ' not a part of the step peak, whose "saved for backward" is what autograd keeps that is alive at the peak and'
    " is neither a parameter, a gradient nor optimizer state."
)


@dataclass(frozen=True)
class SavedTensor:
    """One tensor kept for backward: its name, shape, dtype, bytes, and where it was made (``line`` is
    ``file.py:12``, ``file`` the full path, both empty when unknown)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    group: str
    line: str = ""
    code: str = ""
    file: str = ""

    def short(self) -> str:
        return f"{self.name} {self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class SavedRow:
    """Saved tensors sharing a key (a group or a source line): how many, how many bytes, which ones."""

    key: str
    tensors: int
    bytes: int
    code: str = ""
    names: tuple[str, ...] = ()


def saved_tensors(forward: TraceSnapshot) -> list[SavedTensor]:
    """Every tensor the forward trace saves for backward, with the group and source line of the op that made it."""
    producers = forward.producers()
    ops = {op.index: op for op in forward.ops}
    out = []
    for t in forward.saved_for_backward:
        op = ops.get(producers.get(t.name, -1))
        if op is not None and op.is_bookkeeping:  # unpacking the trace's arguments: an input, not a result
            op = None
        if op is not None and op.inner:  # a fusion region: the op inside it that computed the tensor
            op = next((i for i in reversed(op.inner) if any(o.name == t.name for o in i.outputs)), op)
        group = (top_group(op.module) or INPUTS) if op is not None else INPUTS
        line = code = file = ""
        if op is not None and op.source is not None:
            file, code = op.source.file, op.source.code
            line = f"{os.path.basename(file)}:{op.source.line}"
        out.append(
            SavedTensor(t.name, tuple(t.shape or ()), t.dtype or "?", int(t.bytes or 0), group, line, code, file)
        )
    return out


def _rows(tensors: Iterable[SavedTensor], key: str) -> list[SavedRow]:
    groups: dict[str, list[SavedTensor]] = {}
    for t in tensors:
        groups.setdefault(getattr(t, key) or "(no source line)", []).append(t)
    rows = [
        SavedRow(k, len(ts), sum(t.bytes for t in ts), ts[0].code if key == "line" else "", tuple(t.name for t in ts))
        for k, ts in groups.items()
    ]
    return sorted(rows, key=lambda r: (-r.bytes, r.key))


def saved_by_group(forward: TraceSnapshot) -> list[SavedRow]:
    """Saved bytes per collapsed-graph group (the model's blocks, the root), largest first."""
    return _rows(saved_tensors(forward), "group")


def saved_by_line(forward: TraceSnapshot) -> list[SavedRow]:
    """Saved bytes per source line of the op that made them, largest first."""
    return _rows(saved_tensors(forward), "line")


@dataclass(frozen=True)
class LineComparison:
    """One source line: what thunder saves for backward from it and what eager PyTorch saves."""

    line: str
    code: str
    thunder_bytes: int
    eager_bytes: int
    thunder: tuple[str, ...] = ()
    eager: tuple[str, ...] = ()

    @property
    def extra(self) -> int:
        """Bytes thunder saves beyond eager on this line (negative: fewer)."""
        return self.thunder_bytes - self.eager_bytes


@dataclass(frozen=True)
class SavedComparison:
    """Thunder's saved-for-backward against eager PyTorch's for one module and batch, line by line.

    Totals count each storage once (eager often saves one tensor for several ops); parameters are left out on both
    sides (they are alive anyway), so what remains is activation memory.
    """

    module: str
    thunder_bytes: int
    eager_bytes: int
    lines: tuple[LineComparison, ...] = field(default_factory=tuple)

    def more_in_thunder(self) -> list[LineComparison]:
        """The lines where thunder saves more than eager, most extra bytes first."""
        return sorted((c for c in self.lines if c.extra > 0), key=lambda c: -c.extra)

    def summary(self) -> str:
        from thunderviz.trace.units import format_bytes

        more = self.more_in_thunder()
        head = (
            f"{self.module}: thunder saves {format_bytes(self.thunder_bytes)} for backward, eager"
            f" {format_bytes(self.eager_bytes)}"
        )
        if not more:
            return head + "; thunder saves no more than eager on any line"
        top = more[0]
        return head + f"; most extra on {top.line} ({format_bytes(top.extra)}): {top.code.strip()}"
