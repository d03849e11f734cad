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
- Names and compute attribution: from each watched module's traces, by ``timeline.attribution``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from thunderviz.timeline.attribution import names_and_segments
from thunderviz.timeline.model import CollectiveEvent, OpTable, RankTimeline, Region
from thunderviz.timeline.raw_events import CollectiveMeta, ModuleInfo, RawEvent

__all__ = ["build_rank_timeline"]

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
    """Interpret one rank's events (see the module docstring for the rules).

    Each rule has its own function below, in the order the module docstring gives them; ``notes`` collects what
    each one could not do, in that order.
    """
    notes: list[str] = []
    marks = _Marks.split(events)
    kept = _steps(marks, closed_steps, end, steps, notes)
    regions, fwd_module = _regions(marks, kept.regions, modules)
    events_out = _collectives(marks, collectives, regions, kept.regions, notes)
    segments = names_and_segments(regions, events_out, fwd_module, modules, notes, _op_events(marks, kept.regions))
    ops = _op_table(marks, kept.regions)
    if not kept.regions:
        notes.append(
            "the recording holds no training step: no optimizer step(), no timeline.step() and no call of "
            "a jitted module ran while recording"
        )
    return RankTimeline(
        rank=rank,
        world_size=world_size,
        steps=kept.regions,
        regions=regions,
        collectives=events_out,
        segments=segments,
        ops=ops,
        clock_samples=list(clock_samples),
        host=host,
        pid=pid,
        device=device,
        backend=backend,
        step_rule=kept.rule,
        warmup_included=kept.warmup_included,
        notes=notes,
    )


@dataclass
class _Marks:
    """The events split into our markers (kind, number, event) and the rest, and the thread the markers ran on
    (the busiest CPU thread when there are none)."""

    marks: list[tuple[str, int | None, RawEvent]]
    others: list[RawEvent]
    main_tid: int

    @classmethod
    def split(cls, events: Sequence[RawEvent]) -> _Marks:
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
        return cls(marks, others, main_tid)

    def of(self, kind: str) -> list[tuple[int | None, RawEvent]]:
        """The ``(number, event)`` of every marker of ``kind``, in recording order."""
        return [(n, e) for k, n, e in self.marks if k == kind]


# -------------------------------------------------------------------------------------------------------- steps


@dataclass
class _Steps:
    regions: list[Region]
    rule: str
    warmup_included: bool


def _steps(marks: _Marks, closed_steps: Sequence[int], end: float, steps: int, notes: list[str]) -> _Steps:
    """The kept steps: closed ``step#`` markers, else one per watched-module call; the first dropped when more ran."""
    closed = set(closed_steps)
    step_marks = sorted(((n, e) for n, e in marks.of("step") if n in closed), key=lambda x: x[1].start)
    forwards = _forwards(marks)
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
    return _Steps([Region("step", a, b, first + i) for i, (a, b) in enumerate(windows)], rule, warmup_included)


def _forwards(marks: _Marks) -> list[tuple[int | None, RawEvent]]:
    return sorted(marks.of("forward"), key=lambda x: x[1].start)


def _step_of(step_regions: Sequence[Region], t: float) -> int | None:
    """The number of the kept step running at time ``t``, or None outside them."""
    for s in step_regions:
        if s.start <= t < s.end or (t == s.end == s.start):
            return s.step
    return None


# ------------------------------------------------------------------------------------------------------ regions


def _regions(
    marks: _Marks, step_regions: Sequence[Region], modules: Mapping[int, ModuleInfo]
) -> tuple[list[Region], dict[int, int]]:
    """Forward, backward and optimizer regions inside the kept steps, by start, and ``id(forward Region)`` ->
    module number. A backward without a marker spans the step's autograd events; it is named after the step's
    last forward before it."""
    regions: list[Region] = []
    fwd_module: dict[int, int] = {}  # id(forward Region) -> module number
    for n, e in _forwards(marks):
        st = _step_of(step_regions, e.start)
        if st is not None and n is not None:
            reg = Region("forward", e.start, e.end, st, modules.get(n, ModuleInfo(f"module {n}")).name)
            fwd_module[id(reg)] = n
            regions.append(reg)
    backward_marks = [e for _n, e in marks.of("backward")]
    for e in backward_marks:
        st = _step_of(step_regions, e.start)
        if st is not None:
            regions.append(Region("backward", e.start, e.end, st))
    if not backward_marks:
        regions.extend(_autograd_regions(marks.others, marks.main_tid, step_regions))
    for _n, e in marks.of("optimizer"):
        st = _step_of(step_regions, e.start)
        if st is not None:
            regions.append(Region("optimizer", e.start, e.end, st))
    regions.sort(key=lambda r: (r.start, r.kind))
    for r in regions:
        if r.kind == "backward" and not r.name:
            prev = [f for f in regions if f.kind == "forward" and f.step == r.step and f.start <= r.start]
            r.name = prev[-1].name if prev else ""
    return regions, fwd_module


# ------------------------------------------------------------------------------------ collectives and their work


def _collectives(
    marks: _Marks,
    collectives: Mapping[int, CollectiveMeta],
    regions: Sequence[Region],
    step_regions: Sequence[Region],
    notes: list[str],
) -> list[CollectiveEvent]:
    """Every collective issued inside the kept steps, with the backend's k-th work item as the k-th issued one's
    start and end, and its ``wait()`` when one was marked."""
    issues = _issues(marks, collectives)
    work = sorted((e for e in marks.others if _is_comm_work(e, marks.main_tid)), key=lambda e: e.start)
    if work and len(work) != len(issues):
        notes.append(
            f"{len(issues)} collectives issued but the backend ran {len(work)} work items in the recording; "
            f"start/end are given for the first {min(len(work), len(issues))} in issue order"
        )
    wait_marks = {n: e for n, e in marks.of("wait") if n is not None}
    events_out: list[CollectiveEvent] = []
    per_step_count: Counter[int] = Counter()
    for i, (_t, n, e, meta) in enumerate(issues):
        st = _step_of(step_regions, e.start)
        if st is None:
            continue
        per_step_count[st] += 1
        w = work[i] if i < len(work) else None
        wm = wait_marks.get(n) if n is not None else None
        region = _region_at(regions, e.start, st)
        events_out.append(_collective_event(st, per_step_count[st], e, meta, w, wm, region))
    return events_out


def _issues(
    marks: _Marks, collectives: Mapping[int, CollectiveMeta]
) -> list[tuple[float, int | None, RawEvent, CollectiveMeta]]:
    """``(start, number, issue event, meta)`` in issue order: our ``collective#`` markers, plus the ``c10d::`` calls
    on the main thread outside them (collectives issued without our wrappers)."""
    issue_marks = {n: e for n, e in marks.of("collective") if n is not None}
    issues: list[tuple[float, int | None, RawEvent, CollectiveMeta]] = []
    for n, e in issue_marks.items():
        meta = collectives.get(n) or CollectiveMeta(kind="collective", sync=True)
        issues.append((e.start, n, e, meta))
    marked_spans = sorted((e.start, e.end) for e in issue_marks.values())
    for e in marks.others:
        if e.tid == marks.main_tid and e.name.startswith("c10d::") and not _inside(e, marked_spans):
            kind = _C10D_KINDS.get(e.name[len("c10d::") :], e.name[len("c10d::") :])
            issues.append((e.start, None, e, CollectiveMeta(kind=kind, sync=True)))
    issues.sort(key=lambda x: x[0])
    return issues


def _collective_event(
    step: int,
    index: int,
    issue: RawEvent,
    meta: CollectiveMeta,
    work: RawEvent | None,
    wait: RawEvent | None,
    region: Region | None,
) -> CollectiveEvent:
    return CollectiveEvent(
        step=step,
        index=index,
        kind=meta.kind,
        tensor=_shape_text(meta),
        issue_start=issue.start,
        issue_end=issue.end,
        start=None if work is None else max(work.start, issue.start),
        end=None if work is None else work.end,
        wait_start=None if wait is None else wait.start,
        wait_end=None if wait is None else wait.end,
        sync=meta.sync,
        shape=meta.shape,
        dtype=meta.dtype,
        bytes=meta.bytes,
        group_size=meta.group_size,
        region="" if region is None else region.kind,
    )


# ------------------------------------------------------------------------------ top-level ops in the kept steps


def _op_table(marks: _Marks, step_regions: Sequence[Region]) -> OpTable:
    """The main thread's top-level CPU ops (row 0) and every device event (row 1) that overlap the kept steps."""
    ops = OpTable()
    ids: dict[str, int] = {}
    lo = step_regions[0].start if step_regions else 0.0
    hi = step_regions[-1].end if step_regions else -1.0
    for e in _top_level([x for x in marks.others if x.tid == marks.main_tid and x.device == "cpu"]):
        if e.end > lo and e.start < hi:
            ops.add(e.name, e.start, e.end - e.start, 0, ids)
    for e in marks.others:
        if e.device != "cpu" and e.end > lo and e.start < hi:
            ops.add(e.name, e.start, e.end - e.start, 1, ids)
    return ops


# ------------------------------------------------------------------------------------------------------ helpers


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


def _op_events(marks: _Marks, step_regions: Sequence[Region]) -> list[RawEvent]:
    """The outermost ``aten::`` calls on the main thread inside the kept steps, by start: one per trace op the
    torch executor ran (those in autograd's backward sit under its engine's events, hence outermost ``aten::``
    rather than top-level)."""
    if not step_regions:
        return []
    lo, hi = step_regions[0].start, step_regions[-1].end
    aten = [
        e
        for e in marks.others
        if e.tid == marks.main_tid and e.device == "cpu" and e.name.startswith("aten::") and lo <= e.start < hi
    ]
    return _top_level(aten)


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
