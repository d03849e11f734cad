"""What one rank recorded: steps and regions, collectives with their waits, compute attributed to the graph's nodes.

The per-rank records a ``timeline.model.Timeline`` is made of, and ``TimelineShape``, what reading a whole timeline
needs of it: the analysis (``timeline.analysis``) and the Perfetto export (``timeline.chrome``) read timelines through
it, so the model can offer both as methods without the three modules importing each other in a circle.

No thunder, torch or IPython import here: timelines open and analyse anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from thunderviz.timeline.clock import ClockEstimate

__all__ = ["CollectiveEvent", "OpTable", "RankTimeline", "Region", "Segment", "TimelineShape"]


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


class TimelineShape(Protocol):
    """What the analysis and the Perfetto export read of a ``timeline.model.Timeline`` (which is one)."""

    ranks: dict[int, RankTimeline]
    world_size: int
    name: str
    problems: list[str]

    @property
    def rank_ids(self) -> list[int]: ...

    @property
    def steps(self) -> list[int]: ...


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


def _opt_int(x: Any) -> int | None:
    return None if x is None else int(x)


def _opt_str(x: Any) -> str | None:
    return None if x is None else str(x)
