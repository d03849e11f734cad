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
from thunderviz.timeline.clock import align_clocks
from thunderviz.timeline.events import CollectiveEvent, OpTable, RankTimeline, Region, Segment

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
