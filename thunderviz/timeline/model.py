"""A measured per-rank timeline of one training run: steps, regions, collectives, attributed compute.

The trace model (``trace.model``) says what thunder *planned*; this says what *happened*, in time, on every rank.
Each rank records itself with torch.profiler (``timeline.record``) and produces a ``RankTimeline`` on its own
monotonic clock together with clock samples taken around a collective rendezvous. ``Timeline.from_ranks`` puts
the ranks on one clock (``timeline.clock.align_clocks``: each rank's offset to rank 0 with a proven bound) and
shifts every time to microseconds from the first recorded step, so ``timeline.analysis`` can ask "which
rank arrived last at all_gather #12, and who waited for it".

Files: ``save`` writes one versioned JSON per rank (as a torchrun job would) or one per timeline; ``timeline.file.load``
reads them, and every malformed file raises ``TraceFormatError`` naming the file and the field (through the same
hardened gate as trace files, ``trace.validate``). ``save_chrome_trace`` writes the Trace
Event Format (one process per rank) that Perfetto and chrome://tracing open.

No thunder, torch or IPython import here: timelines open and analyse anywhere.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thunderviz.errors import ThundervizError
from thunderviz.timeline.analysis import TimelineAnalysis
from thunderviz.timeline.chrome import chrome_trace
from thunderviz.timeline.clock import ClockEstimate, align_clocks

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CollectiveEvent",
    "NoTimelineError",
    "OpTable",
    "RankTimeline",
    "Region",
    "Segment",
    "Timeline",
    "save",
]

FORMAT_NAME = "thunderviz.timeline"
FORMAT_VERSION = 1


class NoTimelineError(ThundervizError, LookupError):
    """A report was asked for its timeline but has none (run without ``--timeline``, or no rank recorded)."""


@dataclass
class Region:
    """A labelled interval on a rank: a whole ``step``, or its ``forward``/``backward``/``optimizer`` part.

    ``name`` is the jitted module's name for forward/backward regions (empty otherwise).
    """

    kind: str
    start: float
    end: float
    step: int
    name: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def shifted(self, dt: float) -> Region:
        return Region(self.kind, self.start + dt, self.end + dt, self.step, self.name)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "end": self.end, "step": self.step, "name": self.name}


@dataclass
class Segment:
    """Compute on the rank's main thread between two collective anchors, attributed to a module group of the
    collapsed graph (``blocks.3``, ``lm_head``) through the trace ops that ran between those anchors.

    ``share`` is the fraction of those trace ops that belong to ``group`` (1.0: all of them); ``trace`` is
    ``forward`` or ``backward``.
    """

    group: str
    start: float
    end: float
    step: int
    trace: str
    share: float = 1.0

    @property
    def duration(self) -> float:
        return self.end - self.start

    def shifted(self, dt: float) -> Segment:
        return Segment(self.group, self.start + dt, self.end + dt, self.step, self.trace, self.share)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "start": self.start,
            "end": self.end,
            "step": self.step,
            "trace": self.trace,
            "share": self.share,
        }


@dataclass
class CollectiveEvent:
    """One collective as one rank lived it.

    ``index`` counts collectives (not waits) within the step from 1, the numbering of the collectives ledger
    (``Mismatch`` says "collective 12"). Times: ``issue_*`` is the call that handed it to the backend (for a
    synchronous collective the whole call); ``start``/``end`` the backend's work (gloo's worker thread, an NCCL
    kernel; None when the profiler saw none); ``wait_*`` the ``wait()`` that blocked the rank for an async one.
    ``tensor``, ``group`` and ``trace`` come from the collectives ledger when the runtime order matched it.
    """

    step: int
    index: int
    kind: str
    tensor: str
    issue_start: float
    issue_end: float
    start: float | None = None
    end: float | None = None
    wait_start: float | None = None
    wait_end: float | None = None
    sync: bool = False
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int | None = None
    group_size: int | None = None
    region: str = ""
    trace: str | None = None
    group: str | None = None
    ledger_position: int | None = None
    op_index: int | None = None
    wait_op_index: int | None = None

    @property
    def label(self) -> str:
        """``all_gather #12 blocks.3.attn_qkv.weight``: the collective's name in every message and view."""
        return f"{self.kind} #{self.index} {self.tensor}".rstrip()

    @property
    def arrival(self) -> float:
        """When this rank was ready for the rendezvous: the backend's start of the work (it starts after the
        rank's earlier collectives finished, never before the issue), else the issue time."""
        return self.start if self.start is not None else self.issue_start

    @property
    def blocked(self) -> float:
        """Microseconds the rank's main thread could not compute because of this collective: its ``wait()``
        for an async collective, the whole call for a synchronous one, plus the issue call itself."""
        issue = self.issue_end - self.issue_start
        if self.sync:
            return issue
        wait = 0.0 if self.wait_start is None or self.wait_end is None else self.wait_end - self.wait_start
        return issue + wait

    def blocked_intervals(self) -> list[tuple[float, float]]:
        out = [(self.issue_start, self.issue_end)]
        if not self.sync and self.wait_start is not None and self.wait_end is not None:
            out.append((self.wait_start, self.wait_end))
        return out

    def shifted(self, dt: float) -> CollectiveEvent:
        def s(x: float | None) -> float | None:
            return None if x is None else x + dt

        d = self.to_dict()
        d.update(
            issue_start=self.issue_start + dt,
            issue_end=self.issue_end + dt,
            start=s(self.start),
            end=s(self.end),
            wait_start=s(self.wait_start),
            wait_end=s(self.wait_end),
        )
        return CollectiveEvent.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "index": self.index,
            "kind": self.kind,
            "tensor": self.tensor,
            "issue_start": self.issue_start,
            "issue_end": self.issue_end,
            "start": self.start,
            "end": self.end,
            "wait_start": self.wait_start,
            "wait_end": self.wait_end,
            "sync": self.sync,
            "shape": None if self.shape is None else list(self.shape),
            "dtype": self.dtype,
            "bytes": self.bytes,
            "group_size": self.group_size,
            "region": self.region,
            "trace": self.trace,
            "group": self.group,
            "ledger_position": self.ledger_position,
            "op_index": self.op_index,
            "wait_op_index": self.wait_op_index,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CollectiveEvent:
        shape = d.get("shape")
        return cls(
            step=int(d["step"]),
            index=int(d["index"]),
            kind=str(d["kind"]),
            tensor=str(d["tensor"]),
            issue_start=float(d["issue_start"]),
            issue_end=float(d["issue_end"]),
            start=_opt_float(d.get("start")),
            end=_opt_float(d.get("end")),
            wait_start=_opt_float(d.get("wait_start")),
            wait_end=_opt_float(d.get("wait_end")),
            sync=bool(d.get("sync", False)),
            shape=None if shape is None else tuple(int(x) for x in shape),
            dtype=_opt_str(d.get("dtype")),
            bytes=_opt_int(d.get("bytes")),
            group_size=_opt_int(d.get("group_size")),
            region=str(d.get("region", "")),
            trace=_opt_str(d.get("trace")),
            group=_opt_str(d.get("group")),
            ledger_position=_opt_int(d.get("ledger_position")),
            op_index=_opt_int(d.get("op_index")),
            wait_op_index=_opt_int(d.get("wait_op_index")),
        )


@dataclass
class OpTable:
    """The top-level ops of a rank's compute thread(s) (``aten::mm``, ``Optimizer.step#SGD.step``), column-wise:
    a 2-rank x 20-step GPT timeline holds about 100k of them, which rows of dicts would make ten times larger.

    ``lane`` is 0 for the CPU thread(s) that run the step, 1 for GPU kernels (CUDA activity) when recorded.
    """

    names: list[str] = field(default_factory=list)
    name_ids: list[int] = field(default_factory=list)
    start: list[float] = field(default_factory=list)
    dur: list[float] = field(default_factory=list)
    lane: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.start)

    def add(self, name: str, start: float, dur: float, lane: int = 0, _ids: dict[str, int] | None = None) -> None:
        ids = _ids if _ids is not None else {n: i for i, n in enumerate(self.names)}
        i = ids.get(name)
        if i is None:
            i = ids[name] = len(self.names)
            self.names.append(name)
        self.name_ids.append(i)
        self.start.append(start)
        self.dur.append(dur)
        self.lane.append(lane)

    def rows(self) -> Iterable[tuple[str, float, float, int]]:
        for i, s, d, ln in zip(self.name_ids, self.start, self.dur, self.lane, strict=False):
            yield self.names[i], s, d, ln

    def intervals(self, lane: int = 0) -> list[tuple[float, float]]:
        return [(s, s + d) for s, d, ln in zip(self.start, self.dur, self.lane, strict=False) if ln == lane]

    def shifted(self, dt: float) -> OpTable:
        return OpTable(
            list(self.names), list(self.name_ids), [s + dt for s in self.start], list(self.dur), list(self.lane)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"names": self.names, "name_ids": self.name_ids, "start": self.start, "dur": self.dur, "lane": self.lane}


@dataclass
class RankTimeline:
    """Everything recorded on one rank. Times are microseconds: on the rank's own monotonic clock as recorded
    (``aligned`` False), on the common clock from the first step once ``Timeline.from_ranks`` aligned them.

    ``clock_samples`` are ``(before, after)`` pairs (microseconds, local clock) taken around each rendezvous of
    the clock rounds: every rank's pair brackets the same instant, the last rank's arrival (``align_clocks``).
    ``comm_threads`` names the lanes the backend's work ran on (gloo worker threads, NCCL streams).
    ``unprofiled_steps`` are the steps right after the recorded ones, timed by the recorder's own clock with the
    profiler stopped (step number -> microseconds): torch.profiler's per-op cost makes the recorded steps of a small
    model up to twice as long, so a run's step time is read from these when there are any
    (``TimelineAnalysis.step_time``).
    """

    rank: int
    world_size: int
    steps: list[Region] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    collectives: list[CollectiveEvent] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    ops: OpTable = field(default_factory=OpTable)
    clock_samples: list[tuple[float, float]] = field(default_factory=list)
    clock: ClockEstimate = field(default_factory=ClockEstimate)
    aligned: bool = False
    host: str = ""
    pid: int = 0
    device: str = "cpu"
    backend: str = ""
    step_rule: str = ""
    warmup_included: bool = False
    notes: list[str] = field(default_factory=list)
    unprofiled_steps: dict[int, float] = field(default_factory=dict)

    @property
    def start(self) -> float:
        return self.steps[0].start if self.steps else 0.0

    @property
    def end(self) -> float:
        return self.steps[-1].end if self.steps else 0.0

    def step_numbers(self) -> list[int]:
        return [s.step for s in self.steps]

    def shifted(self, dt: float) -> RankTimeline:
        """A copy with every time moved by ``dt`` microseconds (clock samples stay local)."""
        return RankTimeline(
            rank=self.rank,
            world_size=self.world_size,
            steps=[s.shifted(dt) for s in self.steps],
            regions=[r.shifted(dt) for r in self.regions],
            collectives=[c.shifted(dt) for c in self.collectives],
            segments=[s.shifted(dt) for s in self.segments],
            ops=self.ops.shifted(dt),
            clock_samples=list(self.clock_samples),
            clock=self.clock,
            aligned=self.aligned,
            host=self.host,
            pid=self.pid,
            device=self.device,
            backend=self.backend,
            step_rule=self.step_rule,
            warmup_included=self.warmup_included,
            notes=list(self.notes),
            unprofiled_steps=dict(self.unprofiled_steps),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "steps": [s.to_dict() for s in self.steps],
            "regions": [r.to_dict() for r in self.regions],
            "collectives": [c.to_dict() for c in self.collectives],
            "segments": [s.to_dict() for s in self.segments],
            "ops": self.ops.to_dict(),
            "clock_samples": [list(p) for p in self.clock_samples],
            "clock": self.clock.to_dict(),
            "aligned": self.aligned,
            "host": self.host,
            "pid": self.pid,
            "device": self.device,
            "backend": self.backend,
            "step_rule": self.step_rule,
            "warmup_included": self.warmup_included,
            "notes": list(self.notes),
            "unprofiled_steps": [[step, us] for step, us in sorted(self.unprofiled_steps.items())],
        }


@dataclass
class Timeline:
    """One timeline per rank on a common clock (microseconds from the first recorded step).

    Build it with ``Timeline.from_ranks(rank_timelines)`` (what each rank's recorder returned, or ``load``-ed
    files). ``problems`` says what is missing and why (a rank that died while profiling, a clock that could not
    be aligned); the ranks that did record are still there.
    """

    ranks: dict[int, RankTimeline]
    world_size: int
    name: str = ""
    problems: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_ranks(
        cls, rank_timelines: Iterable[RankTimeline], *, name: str = "", problems: Iterable[str] = ()
    ) -> Timeline:
        """Align each rank's clock to rank 0 (``align_clocks``) and move every time to the common clock."""
        got = list(rank_timelines)
        for r in got:
            if not isinstance(r, RankTimeline):
                raise TypeError(
                    f"Timeline.from_ranks: expected RankTimeline objects (one per rank), got {type(r).__name__}"
                )
        by_rank: dict[int, RankTimeline] = {}
        for r in got:
            if r.rank in by_rank:
                raise ValueError(f"Timeline.from_ranks: rank {r.rank} appears twice; pass one timeline per rank")
            by_rank[r.rank] = r
        probs = list(problems)
        world = max([r.world_size for r in got] + [len(got)]) if got else 0
        missing = sorted(set(range(world)) - set(by_rank))
        if missing:
            probs.append(f"no timeline from rank(s) {missing}: the view shows the {len(by_rank)} rank(s) that recorded")
        if any(r.aligned for r in got) and not all(r.aligned for r in got):
            raise ValueError(
                "Timeline.from_ranks: mix of aligned and unaligned rank timelines; pass what the ranks recorded"
            )
        if got and all(r.aligned for r in got):
            return cls(ranks=dict(sorted(by_rank.items())), world_size=world, name=name, problems=probs)
        clocks, notes = align_clocks({r: t.clock_samples for r, t in by_rank.items()})
        probs.extend(notes)
        starts = [t.start - clocks[r].offset for r, t in by_rank.items() if t.steps]
        origin = min(starts) if starts else 0.0
        ranks: dict[int, RankTimeline] = {}
        for r, t in sorted(by_rank.items()):
            moved = t.shifted(-clocks[r].offset - origin)
            moved.clock = clocks[r]
            moved.aligned = True
            ranks[r] = moved
        return cls(ranks=ranks, world_size=world, name=name, problems=probs)

    # ------------------------------------------------------------------ queries

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    @property
    def steps(self) -> list[int]:
        """Step numbers every rank recorded (the ones cross-rank comparisons use)."""
        sets = [set(t.step_numbers()) for t in self.ranks.values()]
        return sorted(set.intersection(*sets)) if sets else []

    @property
    def duration(self) -> float:
        return max((t.end for t in self.ranks.values()), default=0.0)

    def collective(self, step: int, index: int) -> dict[int, CollectiveEvent]:
        """The same collective on every rank that recorded it: ``{rank: event}``."""
        out = {}
        for r, t in self.ranks.items():
            for c in t.collectives:
                if c.step == step and c.index == index:
                    out[r] = c
                    break
        return out

    def groups(self) -> list[str]:
        """Module groups that compute or collectives were attributed to, in first-seen order."""
        seen: dict[str, None] = {}
        for t in self.ranks.values():
            for s in t.segments:
                seen.setdefault(s.group, None)
            for c in t.collectives:
                if c.group:
                    seen.setdefault(c.group, None)
        return list(seen)

    def spans_of(self, group: str) -> dict[int, list[tuple[float, float, str]]]:
        """Where a graph node's work happened: ``{rank: [(start, end, what)]}`` for its attributed compute
        segments and its collectives (issue through end of work), in time order."""
        out: dict[int, list[tuple[float, float, str]]] = {}
        for r, t in self.ranks.items():
            spans = [(s.start, s.end, f"compute ({s.trace})") for s in t.segments if s.group == group]
            for c in t.collectives:
                if c.group == group:
                    spans.append((c.issue_start, c.end if c.end is not None else c.issue_end, c.label))
            out[r] = sorted(spans)
        return out

    def analysis(self) -> TimelineAnalysis:
        """``timeline.analysis.TimelineAnalysis`` over this timeline (breakdown and stragglers)."""
        return TimelineAnalysis(self)

    def __repr__(self) -> str:
        steps = self.steps
        n = sum(len(t.collectives) for t in self.ranks.values())
        return (
            f"<Timeline {self.name or 'run'}: {len(self.ranks)} of {self.world_size} ranks, {len(steps)} step(s), "
            f"{n} collectives recorded>"
        )

    # ------------------------------------------------------------------ files

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "name": self.name,
            "world_size": self.world_size,
            "problems": list(self.problems),
            "ranks": [t.to_dict() for _, t in sorted(self.ranks.items())],
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the aligned timeline as one JSON file (``load`` reads it back)."""
        return _write_json(self.to_dict(), path)

    def save_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """One Trace Event Format JSON for Perfetto / chrome://tracing: one process per rank, with lanes for
        steps and regions, the main thread's ops, attributed compute, and the backend's communication work."""
        return _write_json(chrome_trace(self), path)


def save(timeline: Timeline | RankTimeline, path: str | os.PathLike[str]) -> Path:
    """Write a rank's recording (one file per rank on a cluster) or a whole aligned ``Timeline``."""
    if isinstance(timeline, Timeline):
        return timeline.save(path)
    if not isinstance(timeline, RankTimeline):
        raise TypeError(f"save(timeline, path): expected a Timeline or RankTimeline, got {type(timeline).__name__}")
    doc = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": "",
        "world_size": timeline.world_size,
        "problems": [],
        "ranks": [timeline.to_dict()],
    }
    return _write_json(doc, path)


# --------------------------------------------------------------------------------------------------------------
# Writing files (reading them is ``timeline.file``'s job)


def _write_json(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":"), default=_json_default, allow_nan=False), encoding="utf-8")
    os.replace(tmp, p)
    return p


def _json_default(x: Any) -> Any:
    raise TypeError(f"cannot write {type(x).__name__} to a timeline file")


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


def _opt_int(x: Any) -> int | None:
    return None if x is None else int(x)


def _opt_str(x: Any) -> str | None:
    return None if x is None else str(x)
