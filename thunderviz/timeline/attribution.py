"""Name a region's collectives from its module's ledger, and give the compute between them to module groups.

``timeline.build`` finds the steps, regions and collectives of one rank; this module adds what the watched modules'
traces know (``ModuleInfo``: each module's collectives ledger and the module group and name of every trace op):

- Names: the collectives of a forward (backward) region are matched in order to the forward (backward)
  collectives of that module's ledger; when the kinds line up they get the ledger's tensor name and module
  group, else they keep kind and shape and a note says why.
- Compute attribution: within a matched region, the time between consecutive collective anchors (issue calls
  and waits, whose trace op index the ledger knows) ran the trace ops between those indices. The profiler's own
  op events in that time (the outermost ``aten::`` calls on the main thread, one per trace op the torch executor
  ran) are matched in order to those trace ops by name, so each op event takes its trace op's module group, and
  every run of consecutive events of one group becomes a segment of that group (``Segment.share``: the part of its
  events matched by name; an unmatched event belongs to the group of the matched one before it). Why by events and
  not by anchors alone: a DDP forward has no collective at all, and its backward one all_reduce at the end, so
  the anchors alone would give the whole forward (backward) to a single block. Without op names (an older
  ``ModuleInfo``) or op events, the segment goes to the group most of its trace ops belong to.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping, Sequence

from thunderviz.timeline.events import CollectiveEvent, Region, Segment
from thunderviz.timeline.raw_events import ModuleInfo, RawEvent

__all__ = ["names_and_segments"]


def names_and_segments(
    regions: Sequence[Region],
    events_out: Sequence[CollectiveEvent],
    fwd_module: Mapping[int, int],
    modules: Mapping[int, ModuleInfo],
    notes: list[str],
    op_events: Sequence[RawEvent] = (),
) -> list[Segment]:
    """Name each forward/backward region's collectives from its module's ledger and, where they line up, attribute
    the compute between them to module groups (by the op events that ran, see the module docstring)."""
    segments: list[Segment] = []
    for ri, r in enumerate(regions):
        if r.kind not in ("forward", "backward"):
            continue
        mod = _module_for(r, ri, regions, fwd_module, modules)
        if mod is None or not mod.ledger:
            if mod is not None and mod.problem:
                note = (
                    f"{mod.name}: its traces could not be read ({mod.problem}); collectives are shown by kind and shape"
                )
                if note not in notes:
                    notes.append(note)
            continue
        inside = [
            c for c in events_out if c.step == r.step and r.start <= c.issue_start <= r.end and c.region == r.kind
        ]
        matched = _match_ledger(inside, mod, r.kind, notes)
        if matched:
            segments.extend(
                _segments(r, inside, mod.op_groups.get(r.kind, []), mod.op_names.get(r.kind, []), op_events)
            )
    return segments


def _module_for(
    r: Region, ri: int, regions: Sequence[Region], fwd_module: Mapping[int, int], modules: Mapping[int, ModuleInfo]
) -> ModuleInfo | None:
    if r.kind == "forward":
        n = fwd_module.get(id(r))
        return None if n is None else modules.get(n)
    for j in range(ri - 1, -1, -1):  # a backward belongs to the step's last forward before it
        f = regions[j]
        if f.kind == "forward" and f.step == r.step and id(f) in fwd_module:
            return modules.get(fwd_module[id(f)])
    return None


def _match_ledger(inside: list[CollectiveEvent], mod: ModuleInfo, trace: str, notes: list[str]) -> bool:
    entries = [e for e in mod.ledger if e.get("trace") == trace]
    colls = [e for e in entries if e.get("kind") != "wait"]
    waits = {e.get("waits_for"): e for e in entries if e.get("kind") == "wait"}
    kinds_run = [c.kind for c in inside]
    kinds_led = [e.get("kind") for e in colls]
    if kinds_run != kinds_led:
        note = (
            f"{mod.name} {trace}: {len(inside)} collectives ran but its ledger lists {len(colls)}"
            if len(inside) != len(colls)
            else f"{mod.name} {trace}: the collectives ran in another order than its ledger lists"
        )
        note += "; they are shown by kind and shape, without parameter names"
        if note not in notes:
            notes.append(note)
        return False
    groups = mod.op_groups.get(trace, [])
    for c, e in zip(inside, colls, strict=False):
        c.tensor = str(e.get("tensor", c.tensor))
        c.trace = trace
        c.ledger_position = e.get("position")
        c.op_index = e.get("op_index")
        w = waits.get(e.get("position"))
        c.wait_op_index = None if w is None else w.get("op_index")
        idx = c.op_index
        c.group = _group_near(groups, idx)
    return True


def _group_near(groups: Sequence[str | None], idx: int | None) -> str | None:
    """The group of the trace op at ``idx``, or (collectives carry none) of the nearest op that has one."""
    if idx is None or not groups:
        return None
    for d in range(len(groups)):
        for j in (idx + d, idx - d):
            if 0 <= j < len(groups) and groups[j] is not None:
                return groups[j]
    return None


def _segments(
    r: Region,
    inside: Sequence[CollectiveEvent],
    groups: Sequence[str | None],
    names: Sequence[str] = (),
    op_events: Sequence[RawEvent] = (),
) -> list[Segment]:
    """The region's compute between its collective anchors, by module group (see the module docstring)."""
    anchors: list[tuple[float, float, int]] = []
    for c in inside:
        if c.op_index is not None:
            anchors.append((c.issue_start, c.issue_end, c.op_index))
        if c.wait_op_index is not None and c.wait_start is not None and c.wait_end is not None:
            anchors.append((c.wait_start, c.wait_end, c.wait_op_index))
    anchors.sort()
    starts = [e.start for e in op_events]
    out: list[Segment] = []
    t_prev, idx_prev = r.start, -1
    for a, b, idx in [*anchors, (r.end, r.end, len(groups))]:
        if a > t_prev and idx > idx_prev + 1:
            end = min(a, r.end)
            lo, hi = bisect_left(starts, t_prev), bisect_left(starts, end)
            ran = _attribute(op_events[lo:hi], range(idx_prev + 1, idx), groups, names)
            if ran:
                out.extend(_runs(ran, t_prev, end, r))
            else:
                names_in = Counter(g for g in groups[idx_prev + 1 : idx] if g is not None)
                if names_in:
                    g, n = names_in.most_common(1)[0]
                    out.append(Segment(g, t_prev, end, r.step, r.kind, round(n / sum(names_in.values()), 3)))
        if idx > idx_prev:
            t_prev, idx_prev = max(t_prev, b), idx
        else:
            t_prev = max(t_prev, b)
    return out


#: How many trace ops ahead an op event may match (trace ops that ran no ``aten::`` call, like ``shallow_copy``
#: or our bucket packing, are skipped this way; measured: at most 3 in a row in TinyGPT's traces).
_LOOKAHEAD = 12


def _attribute(
    events: Sequence[RawEvent], indices: range, groups: Sequence[str | None], names: Sequence[str]
) -> list[tuple[RawEvent, str, bool]]:
    """``(event, group, matched)`` for each op event, matched in order to the trace ops at ``indices`` by name;
    empty when there is nothing to match (no events, or no op names)."""
    ops = [
        (_trace_op_key(names[j]), groups[j])
        for j in indices
        if j < len(groups) and j < len(names) and groups[j] is not None and names[j]
    ]
    if not events or not ops:
        return []
    out: list[tuple[RawEvent, str | None, bool]] = []
    p = 0
    for e in events:
        key = e.name.removeprefix("aten::")
        k = next((q for q in range(p, min(p + _LOOKAHEAD, len(ops))) if ops[q][0] == key), None)
        if k is None:
            out.append((e, out[-1][1] if out else None, False))
        else:
            out.append((e, ops[k][1], True))
            p = k + 1
    first = next((g for _e, g, _m in out if g is not None), ops[0][1])  # events before the first match
    return [(e, g if g is not None else first, m) for e, g, m in out]


def _trace_op_key(name: str) -> str:
    """A trace op's name as the profiler calls the ``aten::`` op it runs: ``torch_prims_reshape_impl`` ->
    ``reshape``, ``torch.ops.aten.embedding_backward`` -> ``embedding_backward``."""
    key = name.rsplit(".", 1)[-1]
    key = key.removeprefix("torch_").removeprefix("prims_").removesuffix("_impl").removesuffix("_prim")
    return key


def _runs(ran: Sequence[tuple[RawEvent, str, bool]], t0: float, t1: float, r: Region) -> list[Segment]:
    """One segment per run of consecutive op events of one group, tiling ``t0..t1``: a run lasts from its first
    event to the next run's first event (the first from ``t0``, the last to ``t1``)."""
    out: list[Segment] = []
    i = 0
    while i < len(ran):
        j = i
        while j + 1 < len(ran) and ran[j + 1][1] == ran[i][1]:
            j += 1
        start = t0 if not out else ran[i][0].start
        end = ran[j + 1][0].start if j + 1 < len(ran) else t1
        matched = sum(1 for _e, _g, m in ran[i : j + 1] if m)
        out.append(Segment(ran[i][1], start, end, r.step, r.kind, round(matched / (j + 1 - i), 3)))
        i = j + 1
    return out
