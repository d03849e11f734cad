"""Turn one rank's raw profiler events and our markers into a ``RankTimeline`` (pure; no torch, no thunder).

``timeline.record`` records; this module interprets, so the rules below can be tested on hand-made events.

Markers (``record_function`` labels the recorder controls, all starting with ``thunderviz.``):
``step#K`` (a step, closed at a step boundary), ``forward#M`` (a call of watched module M), ``backward`` (a
``fabric.backward`` call), ``optimizer`` (an optimizer's ``step()``), ``collective#K`` (the call that issued
collective K; for a synchronous one the whole call), ``wait#K`` (the ``wait()`` of async collective K).

Rules:

- Steps: the closed ``step#`` markers. A recording without step boundaries (no optimizer step, no explicit
  ``step()``) splits at each call of a watched module instead, the last one ending with the recording. With
  two or more steps the first is dropped (thunder compiles on it) and the next ``steps`` are kept; a single step
  is kept and flagged ``warmup_included``.
- Communication work: events named ``gloo:*`` on another thread than the markers' (gloo's workers), or GPU
  kernels named ``nccl*``. A backend runs its queue in issue order, so the k-th work event by start time belongs
  to the k-th issued collective (ours, plus any ``c10d::`` call made outside our wrappers).
- Backward without a ``backward`` marker: from the first to the last autograd engine event of the step.
- Names: the collectives of a forward (backward) region are matched in order to the forward (backward)
  collectives of that module's ledger; when the kinds line up they get the ledger's tensor name and module
  group, else they keep kind and shape and a note says why.
- Compute attribution: within a matched region, the time between consecutive collective anchors (issue calls
  and waits, whose trace op index the ledger knows) ran the trace ops between those indices; the segment is
  attributed to the module group most of those ops belong to (``Segment.share`` says how many).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from thunderviz.timeline.model import (
    CollectiveEvent,
    OpTable,
    RankTimeline,
    Region,
    Segment,
)

__all__ = ["MARK", "CollectiveMeta", "ModuleInfo", "RawEvent", "build_rank_timeline"]

MARK = "thunderviz."
_MARK_RE = re.compile(r"^thunderviz\.(step|forward|backward|optimizer|collective|wait|clock)(?:#(\d+))?$")
_C10D_KINDS = {
    "allreduce_": "all_reduce",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast",
    "barrier": "barrier",
    "alltoall_base_": "all_to_all",
    "reduce_": "reduce",
    "allreduce_coalesced_": "all_reduce",
    "gather_": "gather",
    "scatter_": "scatter",
}


@dataclass(frozen=True)
class RawEvent:
    """One profiler event, in microseconds on the rank's clock. ``device`` is ``cpu`` or ``cuda``."""

    name: str
    tid: int
    start: float
    end: float
    device: str = "cpu"


@dataclass(frozen=True)
class CollectiveMeta:
    """What our wrapper saw when collective K was issued."""

    kind: str
    sync: bool
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int | None = None
    group_size: int | None = None


@dataclass
class ModuleInfo:
    """A watched (jitted) module: its name, ledger entries (``LedgerEntry.to_dict()`` rows) and, per trace, the
    module group of every op (None for bookkeeping ops), from its captured traces."""

    name: str
    ledger: list[dict[str, Any]] = field(default_factory=list)
    op_groups: dict[str, list[str | None]] = field(default_factory=dict)
    problem: str = ""


def build_rank_timeline(
    events: Sequence[RawEvent],
    *,
    rank: int,
    world_size: int,
    steps: int,
    collectives: Mapping[int, CollectiveMeta],
    modules: Mapping[int, ModuleInfo],
    closed_steps: Sequence[int],
    end: float,
    clock_samples: Sequence[tuple[float, float]] = (),
    host: str = "",
    pid: int = 0,
    device: str = "cpu",
    backend: str = "",
) -> RankTimeline:
    """Interpret one rank's events (see the module docstring for the rules)."""
    notes: list[str] = []
    marks: list[tuple[str, int | None, RawEvent]] = []
    others: list[RawEvent] = []
    for e in events:
        m = _MARK_RE.match(e.name)
        if m:
            marks.append((m.group(1), None if m.group(2) is None else int(m.group(2)), e))
        else:
            others.append(e)
    tids = Counter(e.tid for _k, _n, e in marks)
    main_tid = tids.most_common(1)[0][0] if tids else _busiest_cpu_thread(others)

    # ---------------------------------------------------------------- steps
    closed = set(closed_steps)
    step_marks = sorted(((n, e) for k, n, e in marks if k == "step" and n in closed), key=lambda x: x[1].start)
    forwards = sorted(((n, e) for k, n, e in marks if k == "forward"), key=lambda x: x[1].start)
    if step_marks:
        windows = [(e.start, e.end) for _n, e in step_marks]
        rule = "a step ends when an optimizer's step() returns or timeline.step() is called"
    elif forwards:
        starts = [e.start for _n, e in forwards]
        windows = [(a, b) for a, b in zip(starts, [*starts[1:], end], strict=False)]
        rule = "no optimizer step ran: a step is one call of the jitted module and what follows it"
    else:
        windows = []
        rule = ""
    warmup_included = False
    first = 1  # steps are numbered as the cell ran them: step 1 is the first (thunder compiles on it)
    if len(windows) >= 2:
        windows = windows[1 : 1 + steps]
        first = 2
    elif len(windows) == 1:
        warmup_included = True
        notes.append("only one step ran, so the timeline shows it even though thunder compiles on the first step")
    step_regions = [Region("step", a, b, first + i) for i, (a, b) in enumerate(windows)]

    def step_of(t: float) -> int | None:
        for s in step_regions:
            if s.start <= t < s.end or (t == s.end == s.start):
                return s.step
        return None

    # ---------------------------------------------------------------- regions
    regions: list[Region] = []
    fwd_module: dict[int, int] = {}  # id(forward Region) -> module number
    for n, e in forwards:
        st = step_of(e.start)
        if st is not None and n is not None:
            reg = Region("forward", e.start, e.end, st, modules.get(n, ModuleInfo(f"module {n}")).name)
            fwd_module[id(reg)] = n
            regions.append(reg)
    backward_marks = [e for k, _n, e in marks if k == "backward"]
    for e in backward_marks:
        st = step_of(e.start)
        if st is not None:
            regions.append(Region("backward", e.start, e.end, st))
    if not backward_marks:
        regions.extend(_autograd_regions(others, main_tid, step_regions))
    for k, _n, e in marks:
        if k == "optimizer":
            st = step_of(e.start)
            if st is not None:
                regions.append(Region("optimizer", e.start, e.end, st))
    regions.sort(key=lambda r: (r.start, r.kind))
    for r in regions:
        if r.kind == "backward" and not r.name:
            prev = [f for f in regions if f.kind == "forward" and f.step == r.step and f.start <= r.start]
            r.name = prev[-1].name if prev else ""

    # ---------------------------------------------------------------- collectives and their work
    issue_marks = {n: e for k, n, e in marks if k == "collective" and n is not None}
    wait_marks = {n: e for k, n, e in marks if k == "wait" and n is not None}
    issues: list[tuple[float, int | None, RawEvent, CollectiveMeta]] = []
    for n, e in issue_marks.items():
        meta = collectives.get(n) or CollectiveMeta(kind="collective", sync=True)
        issues.append((e.start, n, e, meta))
    marked_spans = sorted((e.start, e.end) for e in issue_marks.values())
    for e in others:
        if e.tid == main_tid and e.name.startswith("c10d::") and not _inside(e, marked_spans):
            kind = _C10D_KINDS.get(e.name[len("c10d::") :], e.name[len("c10d::") :])
            issues.append((e.start, None, e, CollectiveMeta(kind=kind, sync=True)))
    issues.sort(key=lambda x: x[0])
    work = sorted((e for e in others if _is_comm_work(e, main_tid)), key=lambda e: e.start)
    if work and len(work) != len(issues):
        notes.append(
            f"{len(issues)} collectives issued but the backend ran {len(work)} work items in the recording; "
            f"start/end are given for the first {min(len(work), len(issues))} in issue order"
        )

    events_out: list[CollectiveEvent] = []
    per_step_count: Counter[int] = Counter()
    for i, (_t, n, e, meta) in enumerate(issues):
        st = step_of(e.start)
        if st is None:
            continue
        per_step_count[st] += 1
        w = work[i] if i < len(work) else None
        wm = wait_marks.get(n) if n is not None else None
        region = _region_at(regions, e.start, st)
        events_out.append(
            CollectiveEvent(
                step=st,
                index=per_step_count[st],
                kind=meta.kind,
                tensor=_shape_text(meta),
                issue_start=e.start,
                issue_end=e.end,
                start=None if w is None else max(w.start, e.start),
                end=None if w is None else w.end,
                wait_start=None if wm is None else wm.start,
                wait_end=None if wm is None else wm.end,
                sync=meta.sync,
                shape=meta.shape,
                dtype=meta.dtype,
                bytes=meta.bytes,
                group_size=meta.group_size,
                region="" if region is None else region.kind,
            )
        )

    # ---------------------------------------------------------------- names and compute attribution
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
            segments.extend(_segments(r, inside, mod.op_groups.get(r.kind, [])))

    # ---------------------------------------------------------------- top-level ops in the kept steps
    ops = OpTable()
    ids: dict[str, int] = {}
    lo = step_regions[0].start if step_regions else 0.0
    hi = step_regions[-1].end if step_regions else -1.0
    for e in _top_level([x for x in others if x.tid == main_tid and x.device == "cpu"]):
        if e.end > lo and e.start < hi:
            ops.add(e.name, e.start, e.end - e.start, 0, ids)
    for e in others:
        if e.device != "cpu" and e.end > lo and e.start < hi:
            ops.add(e.name, e.start, e.end - e.start, 1, ids)

    if not step_regions:
        notes.append(
            "the recording holds no training step: no optimizer step(), no timeline.step() and no call of "
            "a jitted module ran while recording"
        )
    return RankTimeline(
        rank=rank,
        world_size=world_size,
        steps=step_regions,
        regions=regions,
        collectives=events_out,
        segments=segments,
        ops=ops,
        clock_samples=list(clock_samples),
        host=host,
        pid=pid,
        device=device,
        backend=backend,
        step_rule=rule,
        warmup_included=warmup_included,
        notes=notes,
    )


def _busiest_cpu_thread(events: Sequence[RawEvent]) -> int:
    c = Counter(e.tid for e in events if e.device == "cpu" and not e.name.startswith("gloo:"))
    return c.most_common(1)[0][0] if c else 0


def _inside(e: RawEvent, spans: Sequence[tuple[float, float]]) -> bool:
    return any(a <= e.start and e.end <= b for a, b in spans)


def _is_comm_work(e: RawEvent, main_tid: int) -> bool:
    if e.device == "cpu":
        return e.name.startswith("gloo:") and e.tid != main_tid
    return e.name.lower().startswith("nccl")


def _shape_text(meta: CollectiveMeta) -> str:
    if meta.shape is None:
        return ""
    return f"{meta.dtype or '?'}[{', '.join(str(d) for d in meta.shape)}]"


def _region_at(regions: Sequence[Region], t: float, step: int) -> Region | None:
    best = None
    for r in regions:
        if r.step == step and r.start <= t <= r.end and (best is None or r.duration < best.duration):
            best = r
    return best


def _autograd_regions(events: Sequence[RawEvent], main_tid: int, steps: Sequence[Region]) -> list[Region]:
    out = []
    eng = [e for e in events if e.name.startswith("autograd::engine::evaluate_function") and e.device == "cpu"]
    for s in steps:
        inside = [e for e in eng if s.start <= e.start < s.end]
        if inside:
            out.append(Region("backward", min(e.start for e in inside), max(e.end for e in inside), s.step))
    return out


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


def _segments(r: Region, inside: Sequence[CollectiveEvent], groups: Sequence[str | None]) -> list[Segment]:
    anchors: list[tuple[float, float, int]] = []
    for c in inside:
        if c.op_index is not None:
            anchors.append((c.issue_start, c.issue_end, c.op_index))
        if c.wait_op_index is not None and c.wait_start is not None and c.wait_end is not None:
            anchors.append((c.wait_start, c.wait_end, c.wait_op_index))
    anchors.sort()
    out: list[Segment] = []
    t_prev, idx_prev = r.start, -1
    for a, b, idx in [*anchors, (r.end, r.end, len(groups))]:
        if a > t_prev and idx > idx_prev + 1:
            names = Counter(g for g in groups[idx_prev + 1 : idx] if g is not None)
            if names:
                g, n = names.most_common(1)[0]
                out.append(Segment(g, t_prev, min(a, r.end), r.step, r.kind, round(n / sum(names.values()), 3)))
        if idx > idx_prev:
            t_prev, idx_prev = max(t_prev, b), idx
        else:
            t_prev = max(t_prev, b)
    return out


def _top_level(events: Sequence[RawEvent]) -> list[RawEvent]:
    out = []
    stack: list[float] = []
    for e in sorted(events, key=lambda e: (e.start, -e.end)):
        while stack and stack[-1] <= e.start:
            stack.pop()
        if not stack:
            out.append(e)
        stack.append(e.end)
    return out
