"""Where the time went: per-rank compute / communication / exposed communication / idle, and stragglers.

Written here rather than taken from HolisticTraceAnalysis (``holistictraceanalysis`` 0.5.0): on the CPU/gloo
traces torch.profiler writes for these ranks, HTA's temporal and idle-time breakdowns and its critical path
raise (IndexError / "No objects to concatenate" / ValueError), and its communication-computation overlap is NaN,
because all of them are built on GPU kernels and CUDA streams; it has no per-collective arrival analysis at all.
(Evaluated on real 2-rank gloo traces of a thunder FSDP step; see the timeline helper's report.)

Definitions, per rank, over the recorded steps (the union of step intervals):

- **exposed communication**: the main thread was blocked by a collective: inside an issue call, a synchronous
  collective, or the ``wait()`` of an async one;
- **communication**: the backend's work was in flight (gloo worker / NCCL kernel), or the rank was blocked;
- **overlapped communication**: communication minus exposed, i.e. hidden behind compute;
- **compute**: an op ran on the main thread and the rank was not blocked;
- **idle**: none of the above (Python between ops, a ``sleep``, data loading).

Per collective (the same step and index on every rank): a rank *arrives* when the backend starts its part of
the work (``CollectiveEvent.arrival``); the last rank to arrive holds everybody else up; what another rank
*waited for it* is the part of that rank's blocked time that lies between its own arrival and the last arrival.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the model calls in here; at run time this module only reads its attributes
    from thunderviz.timeline.model import CollectiveEvent, Timeline

__all__ = [
    "STRAGGLER_SHARE",
    "CollectiveWait",
    "RankBreakdown",
    "Straggler",
    "TimelineAnalysis",
    "close_gaps",
    "intersect",
    "subtract",
    "total",
    "union",
]

Interval = tuple[float, float]

#: ``summary`` names a straggler when the waiting it caused is at least this share of the recorded time.
STRAGGLER_SHARE = 0.05


# --------------------------------------------------------------------------------------------------------------
# Interval arithmetic on sorted, disjoint lists


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping intervals; the result is sorted and disjoint (empty intervals dropped)."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def close_gaps(xs: Sequence[Interval], gap: float) -> list[Interval]:
    """Sorted, disjoint intervals with every gap of at most ``gap`` closed.

    For drawing: at a picture's resolution a gap narrower than a pixel is invisible, and closing it gives about
    10x fewer rectangles for the same picture (the widget and the static SVG both draw busy time this way).
    """
    out: list[list[float]] = []
    for a, b in xs:
        if out and a - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def intersect(xs: Sequence[Interval], ys: Sequence[Interval]) -> list[Interval]:
    """Intersection of two sorted disjoint lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(xs: Sequence[Interval], ys: Sequence[Interval]) -> list[Interval]:
    """``xs`` minus ``ys`` (both sorted and disjoint)."""
    out: list[Interval] = []
    j = 0
    for a, b in xs:
        cur = a
        while j < len(ys) and ys[j][1] <= cur:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > cur:
                out.append((cur, ys[k][0]))
            cur = max(cur, ys[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def total(xs: Iterable[Interval]) -> float:
    return sum(b - a for a, b in xs)


# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankBreakdown:
    """Microseconds per step (mean over the recorded steps) on one rank; ``steps`` is how many."""

    rank: int
    steps: int
    step_time: float
    compute: float
    communication: float
    exposed: float
    overlapped: float
    idle: float

    def row(self) -> dict[str, float | int]:
        """Milliseconds, for tables."""
        ms = {
            k: round(getattr(self, k) / 1000, 3)
            for k in ("step_time", "compute", "communication", "exposed", "overlapped", "idle")
        }
        return {"rank": self.rank, "steps": self.steps, **ms}


@dataclass(frozen=True)
class CollectiveWait:
    """One collective across ranks: who arrived when, who came last, and who waited how long for it.

    Times in microseconds on the common clock; ``uncertainty`` is the clock bound of the two ranks compared in
    ``message`` (the last and the earliest).
    """

    step: int
    index: int
    kind: str
    tensor: str
    arrivals: dict[int, float]
    waited: dict[int, float]
    last_rank: int
    first_rank: int
    uncertainty: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.kind} #{self.index} {self.tensor}".rstrip()

    @property
    def lateness(self) -> float:
        """How much later the last rank arrived than the first."""
        return self.arrivals[self.last_rank] - self.arrivals[self.first_rank]

    @property
    def worst_wait(self) -> float:
        return max(self.waited.values(), default=0.0)

    @property
    def message(self) -> str:
        """``all_gather #12 blocks.3.attn_qkv.weight (step 2): rank 1 arrived 8.2 ms after rank 0``."""
        unc = f" (clock +/- {_ms(self.uncertainty)})" if self.uncertainty >= 1.0 else ""
        text = (
            f"{self.label} (step {self.step}): rank {self.last_rank} arrived {_ms(self.lateness)} after rank "
            f"{self.first_rank}{unc}"
        )
        waits = [f"rank {r} waited {_ms(w)}" for r, w in sorted(self.waited.items()) if w > 0]
        return text + ("; " + ", ".join(waits) if waits else "")

    def row(self) -> dict[str, object]:
        return {
            "step": self.step,
            "collective": self.label,
            "last_rank": self.last_rank,
            "late_ms": round(self.lateness / 1000, 3),
            "worst_wait_ms": round(self.worst_wait / 1000, 3),
            "arrivals_ms": {r: round(a / 1000, 3) for r, a in self.arrivals.items()},
            "waited_ms": {r: round(w / 1000, 3) for r, w in self.waited.items()},
        }


@dataclass(frozen=True)
class Straggler:
    """A rank that made the others wait: how often it came last and how much waiting it caused in total."""

    rank: int
    last_count: int
    collectives: int
    caused_wait: float
    worst: CollectiveWait | None = None

    @property
    def message(self) -> str:
        text = (
            f"rank {self.rank} arrived last at {self.last_count} of {self.collectives} collectives and made the "
            f"other ranks wait {_ms(self.caused_wait)} in total"
        )
        return text + (f"; worst: {self.worst.message}" if self.worst is not None else "")


@dataclass
class TimelineAnalysis:
    """Breakdown and straggler analysis of a ``Timeline`` (computed on first use, then cached)."""

    timeline: Timeline
    _waits: list[CollectiveWait] | None = field(default=None, init=False, repr=False)

    def breakdown(self) -> list[RankBreakdown]:
        """Per rank: compute / communication / exposed / overlapped / idle per step (see the module docstring)."""
        return [_rank_breakdown(self.timeline, r) for r in self.timeline.rank_ids]

    def collectives(self) -> list[CollectiveWait]:
        """Every collective seen on at least two ranks, worst first: by the longest wait it caused, then by
        how late its last rank arrived."""
        if self._waits is None:
            self._waits = _collective_waits(self.timeline)
        return list(self._waits)

    def stragglers(self, *, min_wait_us: float = 50.0) -> list[Straggler]:
        """Ranks ordered by the waiting they caused (collectives where others waited at least ``min_wait_us``
        count as "arrived last"); the first one is the rank to look at."""
        waits = self.collectives()
        per: dict[int, list[CollectiveWait]] = {}
        for w in waits:
            if w.worst_wait >= min_wait_us:
                per.setdefault(w.last_rank, []).append(w)
        out = [
            Straggler(
                rank=r,
                last_count=len(ws),
                collectives=len(waits),
                caused_wait=sum(w.worst_wait for w in ws),
                worst=max(ws, key=lambda w: w.worst_wait),
            )
            for r, ws in per.items()
        ]
        return sorted(out, key=lambda s: -s.caused_wait)

    def straggler(self) -> Straggler | None:
        """The rank that held the others up, when the waiting it caused is at least ``STRAGGLER_SHARE`` of the
        recorded time (see ``summary``); None when no rank stands out."""
        st = self.stragglers()
        if st and st[0].caused_wait >= STRAGGLER_SHARE * self.timeline.duration:
            return st[0]
        return None

    def summary(self) -> list[str]:
        """Sentences a person reads first: the straggler (if any), and the worst collectives.

        A rank is called the straggler when the waiting it caused is at least ``STRAGGLER_SHARE`` of the recorded
        time; below that, ranks that take turns arriving last by a few milliseconds (what two ranks sharing CPUs
        do) are reported as no clear straggler, with the numbers.
        """
        lines = []
        st = self.stragglers()
        recorded = self.timeline.duration
        top = self.straggler()
        if top is not None:
            lines.append("Straggler: " + top.message)
        elif st:
            share = st[0].caused_wait / recorded if recorded > 0 else 0.0
            lines.append(
                f"No clear straggler: the most waiting one rank caused was rank {st[0].rank}'s "
                f"{_ms(st[0].caused_wait)} in total, {share:.1%} of the {_ms(recorded)} recorded."
            )
        else:
            lines.append("No straggler: no rank made another wait 50 us or more at any collective.")
        for w in self.collectives()[:3]:
            if w.worst_wait > 0:
                lines.append(w.message)
        return lines


def _ms(us: float) -> str:
    ms = us / 1000
    return f"{ms:.1f} ms" if abs(ms) >= 1 else f"{ms:.2f} ms"


def _rank_breakdown(tl: Timeline, rank: int) -> RankBreakdown:
    t = tl.ranks[rank]
    window = union((s.start, s.end) for s in t.steps)
    blocked = intersect(union(iv for c in t.collectives for iv in c.blocked_intervals()), window)
    work = [(c.start, c.end) for c in t.collectives if c.start is not None and c.end is not None]
    comm = intersect(union(work + blocked), window)
    busy = intersect(union(t.ops.intervals(0)), window)
    compute = subtract(busy, blocked)
    idle = subtract(subtract(window, busy), blocked)
    n = max(len(t.steps), 1)
    return RankBreakdown(
        rank=rank,
        steps=len(t.steps),
        step_time=total(window) / n,
        compute=total(compute) / n,
        communication=total(comm) / n,
        exposed=total(blocked) / n,
        overlapped=total(subtract(comm, blocked)) / n,
        idle=total(idle) / n,
    )


def _collective_waits(tl: Timeline) -> list[CollectiveWait]:
    by_key: dict[tuple[int, int], dict[int, CollectiveEvent]] = {}
    for r, t in tl.ranks.items():
        for c in t.collectives:
            by_key.setdefault((c.step, c.index), {})[r] = c
    out: list[CollectiveWait] = []
    for (step, index), evs in by_key.items():
        if len(evs) < 2:
            continue
        arrivals = {r: c.arrival for r, c in evs.items()}
        last = max(arrivals, key=lambda r: (arrivals[r], -r))
        first = min(arrivals, key=lambda r: (arrivals[r], r))
        t_last = arrivals[last]
        waited = {}
        for r, c in evs.items():
            if r == last:
                waited[r] = 0.0
                continue
            lo, hi = arrivals[r], t_last
            waited[r] = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in c.blocked_intervals())
        ref = evs[first]
        unc = tl.ranks[last].clock.uncertainty + tl.ranks[first].clock.uncertainty
        out.append(
            CollectiveWait(
                step=step,
                index=index,
                kind=ref.kind,
                tensor=ref.tensor,
                arrivals=arrivals,
                waited=waited,
                last_rank=last,
                first_rank=first,
                uncertainty=unc,
            )
        )
    out.sort(key=lambda w: (-w.worst_wait, -w.lateness, w.step, w.index))
    return out
