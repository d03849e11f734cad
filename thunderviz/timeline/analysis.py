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

from thunderviz.trace.units import format_us

if TYPE_CHECKING:  # the model calls in here; at run time this module only reads its attributes
    from thunderviz.timeline.model import CollectiveEvent, RankTimeline, Timeline

__all__ = [
    "CLOCK_FACTOR",
    "JITTER_FACTOR",
    "STRAGGLER_RULE",
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

#: How far above the noise a rank's typical caused wait must be before it is named (see ``STRAGGLER_RULE``).
JITTER_FACTOR = 3.0
CLOCK_FACTOR = 3.0
#: ... and the least share of the median step time it must be (a rank 1 ms late in a 12 ms step is no straggler).
STRAGGLER_SHARE = 0.10
#: The rule, as every view states it.
STRAGGLER_RULE = (
    f"A rank is named a straggler when, in at least 3 of every 4 recorded steps, it arrived last and the wait it "
    f"caused (the lower quartile over steps) is above {JITTER_FACTOR:g}x the step-to-step jitter (the largest "
    f"robust standard deviation of a rank's step time: 1.4826 x its median absolute deviation, so one odd step "
    f"does not set the noise), {CLOCK_FACTOR:g}x the clock bound, and {STRAGGLER_SHARE:.0%} of "
    "the median step time; anything less is within noise."
)


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
        unc = f" (clock \u00b1{format_us(self.uncertainty)})" if self.uncertainty >= 1.0 else ""
        text = (
            f"{self.label} (step {self.step}): rank {self.last_rank} arrived {format_us(self.lateness)} after rank "
            f"{self.first_rank}{unc}"
        )
        waits = [f"rank {r} waited {format_us(w)}" for r, w in sorted(self.waited.items()) if w > 0]
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
    """A rank that made the others wait: how often it came last and how much waiting it caused.

    ``per_step`` is the waiting it caused in each recorded step (0.0 where it was not last), ``typical`` the lower
    quartile of those (what it caused in 3 of every 4 steps), ``jitter`` the step-to-step jitter and ``clock`` the
    clock bound it is compared with, ``step_time`` the median step time (see ``STRAGGLER_RULE``); ``named`` says
    whether it passed.
    """

    rank: int
    last_count: int
    collectives: int
    caused_wait: float
    worst: CollectiveWait | None = None
    per_step: tuple[float, ...] = ()
    typical: float = 0.0
    jitter: float = 0.0
    clock: float = 0.0
    step_time: float = 0.0
    named: bool = False

    @property
    def steps_last(self) -> int:
        """In how many recorded steps it arrived last at a collective someone waited for."""
        return sum(1 for w in self.per_step if w > 0)

    @property
    def message(self) -> str:
        """``rank 1 arrived last in 3 of 3 steps (3 of 6 collectives) and made the other ranks wait 49.2 ms or
        more per step ...``; the worst collective by its short name."""
        text = (
            f"rank {self.rank} arrived last in {self.steps_last} of {len(self.per_step)} steps "
            f"({self.last_count} of {self.collectives} collectives) and made the other ranks wait "
            f"{format_us(self.typical)} or more per step in 3 of every 4 steps ({format_us(self.caused_wait)} in total)"
        )
        return text + (f"; worst: {self.worst.message}" if self.worst is not None else "")

    @property
    def noise(self) -> str:
        """The noise it was compared with, in words: ``step jitter 8.6 ms, clock \u00b10.20 ms``."""
        return f"step jitter {format_us(self.jitter)}, clock \u00b1{format_us(self.clock)}"


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
        """Every rank that arrived last where another waited at least ``min_wait_us`` and longer than the two
        ranks' clock bound (below it, who came last is unknown), the named one (``STRAGGLER_RULE``) first, then by
        the waiting they caused."""
        waits = self.collectives()
        steps = self.timeline.steps
        per: dict[int, list[CollectiveWait]] = {}
        for w in waits:
            if w.worst_wait >= min_wait_us and w.lateness > w.uncertainty:
                per.setdefault(w.last_rank, []).append(w)
        jitter = _step_jitter(self.timeline)
        step_time = _median([e - b for t in self.timeline.ranks.values() for b, e in _step_spans(t, steps)])
        out = [_straggler(r, ws, len(waits), steps, jitter, step_time) for r, ws in per.items()]
        return sorted(out, key=lambda s: (not s.named, -s.typical, -s.caused_wait))

    def step_time(self) -> float | None:
        """The median over the recorded steps of the slowest rank's step (us): what a step costs the job; None
        without a step every rank recorded."""
        spans = [{s.step: s.end - s.start for s in t.steps} for t in self.timeline.ranks.values()]
        per_step = [max(s[n] for s in spans) for n in self.timeline.steps if spans and all(n in s for s in spans)]
        return _median(per_step) if per_step else None

    def straggler(self) -> Straggler | None:
        """The rank that held the others up when it passes ``STRAGGLER_RULE``; None when no rank stands out of the
        noise."""
        st = self.stragglers()
        return st[0] if st and st[0].named else None

    def summary(self) -> list[str]:
        """Sentences a person reads first: the straggler verdict with the noise it was measured against, then the
        worst collectives.

        Why a noise rule: ranks sharing CPUs (or a busy neighbour) take turns arriving last by tens of
        milliseconds, and one rank last at every collective of a few steps happens by chance; only a wait that
        stays well above the step-to-step jitter and the clock bound in most steps is a straggler
        (``STRAGGLER_RULE``).
        """
        lines = []
        top = self.straggler()
        st = self.stragglers()
        n = len(self.timeline.steps)
        if top is not None:
            lines.append(f"Straggler: {top.message} (above the noise: {top.noise})")
        elif n < 2:
            largest = f" (largest wait {format_us(max(s.caused_wait for s in st))})" if st else ""
            lines.append(
                f"No straggler named: {n} step recorded{largest}; record at least 2 steps (--steps 2) to tell a "
                "straggler from noise."
            )
        elif st:
            s = max(st, key=lambda s: max(s.per_step, default=0.0))
            lines.append(
                f"No straggler (largest wait {format_us(max(s.per_step, default=0.0))} in one step, by rank {s.rank}, "
                f"last in {s.steps_last} of {len(s.per_step)} steps: within noise, {s.noise})."
            )
        else:
            lines.append("No straggler: no rank made another wait 50 us or more at any collective.")
        said = top.worst if top is not None else None  # the straggler's sentence already names its worst collective
        for w in [w for w in self.collectives() if w is not said][:3]:
            if w.worst_wait > 0:
                lines.append(w.message)
        return lines


def _straggler(
    rank: int, ws: list[CollectiveWait], n_waits: int, steps: Sequence[int], jitter: float, step_time: float
) -> Straggler:
    """One rank's case against ``STRAGGLER_RULE``."""
    by_step = dict.fromkeys(steps, 0.0)
    for w in ws:
        if w.step in by_step:
            by_step[w.step] += w.worst_wait
    per_step = tuple(by_step[s] for s in steps)
    typical = _lower_quartile(per_step)
    clock = max((w.uncertainty for w in ws), default=0.0)
    named = (
        len(steps) >= 2
        and typical > JITTER_FACTOR * jitter
        and typical > CLOCK_FACTOR * clock
        and typical >= STRAGGLER_SHARE * step_time
    )
    return Straggler(
        rank=rank,
        last_count=len(ws),
        collectives=n_waits,
        caused_wait=sum(w.worst_wait for w in ws),
        worst=max(ws, key=lambda w: w.worst_wait),
        per_step=per_step,
        typical=typical,
        jitter=jitter,
        clock=clock,
        step_time=step_time,
        named=named,
    )


def _step_spans(t: RankTimeline, steps: Sequence[int]) -> list[Interval]:
    wanted = set(steps)
    return [(s.start, s.end) for s in t.steps if s.step in wanted]


def _step_jitter(tl: Timeline) -> float:
    """The largest robust standard deviation of one rank's step durations (1.4826 x the median absolute deviation,
    which equals the standard deviation for normal noise), over the steps every rank recorded.

    Robust because the caused wait it is compared with is a lower quartile: one step that ran long on every rank
    (measured: the first recorded step of the tutorial's straggler run, 1.25 s against 0.5 s) would otherwise
    raise the plain standard deviation to 0.43 s and hide a rank that was last by 0.5 s in every step."""
    out = 0.0
    for t in tl.ranks.values():
        d = [e - b for b, e in _step_spans(t, tl.steps)]
        if len(d) >= 2:
            mid = _median(d)
            out = max(out, 1.4826 * _median([abs(x - mid) for x in d]))
    return out


def _median(xs: Sequence[float]) -> float:
    v = sorted(xs)
    if not v:
        return 0.0
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def _lower_quartile(xs: Sequence[float]) -> float:
    """What a rank reached in 3 of every 4 steps: the ``n // 4``-th smallest value (the minimum below 4 steps)."""
    v = sorted(xs)
    return v[len(v) // 4] if v else 0.0


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
