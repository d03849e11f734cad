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

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from thunderviz.trace.units import format_us

if TYPE_CHECKING:  # the model calls in here; at run time this module only reads its attributes
    from thunderviz.timeline.events import CollectiveEvent, RankTimeline, TimelineShape

__all__ = [
    "STRAGGLER_RULE",
    "CollectiveWait",
    "RankBreakdown",
    "Straggler",
    "StragglerRule",
    "TimelineAnalysis",
    "close_gaps",
    "idle_intervals",
    "intersect",
    "subtract",
    "total",
    "union",
]

Interval = tuple[float, float]


@dataclass(frozen=True)
class StragglerRule:
    """When a rank is named a straggler, as numbers (``text`` states them with every verdict).

    A step *counts against* a rank when it arrived last there and the others' waiting for it adds up to at least
    ``share`` of that step (the slowest rank's step time) and more than ``clock_factor`` x the clock bound (below
    that, who came last is not known). The rank is named when at least ``most_steps`` of the recorded steps (and
    ``min_steps``) count against it.

    Why no jitter term: a tutorial run had rank 0 last in 4 of 4 steps, rank 1 waiting up to 52 ms of a 65 ms step, and
    the earlier rule (3x the step-to-step jitter) named nobody because the steps varied by 72 ms. Varying steps are
    no reason for one rank to be last every time. What keeps noise out is the count and the share: ranks sharing
    CPUs take turns arriving last, and in 20 unslowed 2-rank recordings of 4 steps (FSDP and DDP, 1 and 4 blocks,
    this project's 2 shared cores) a rank that was last in 3 of 4 steps made the other wait at most 42%, 34% and
    31% of those steps; a sleeping rank makes it 90% and more.
    """

    most_steps: float = 0.75
    share: float = 0.5
    clock_factor: float = 3.0
    min_steps: int = 2

    def steps_needed(self, steps: int) -> int:
        """How many of ``steps`` recorded steps must count against a rank to name it."""
        return max(self.min_steps, math.ceil(self.most_steps * steps - 1e-9))

    @property
    def text(self) -> str:
        """The rule in one sentence."""
        return (
            f"A rank is named a straggler when, in at least {_fraction(self.most_steps)} recorded steps, it arrived "
            f"last and the others waited for it {self.share:.0%} of the step or more (and over {self.clock_factor:g}x "
            "the clock bound)."
        )


def _fraction(x: float) -> str:
    """``0.75`` -> ``3 of every 4``; other values as a percentage."""
    for d in range(2, 11):
        n = round(x * d)
        if abs(n / d - x) < 1e-9:
            return f"{n} of every {d}"
    return f"{x:.0%} of the"


#: The rule every view states (``StragglerRule()``'s numbers).
DEFAULT_STRAGGLER_RULE = StragglerRule()
STRAGGLER_RULE = DEFAULT_STRAGGLER_RULE.text


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
    """A rank that made the others wait: in which steps it came last and how much waiting it caused.

    ``per_step`` is the waiting it caused in each recorded step (0.0 where it was not last), ``step_times`` each
    step's time (the slowest rank's), ``clock`` the clock bound its lateness is compared with, ``counted`` how many
    steps count against it under ``rule`` and ``named`` whether that is enough (``StragglerRule``).
    """

    rank: int
    last_count: int
    collectives: int
    caused_wait: float
    worst: CollectiveWait | None = None
    per_step: tuple[float, ...] = ()
    step_times: tuple[float, ...] = ()
    clock: float = 0.0
    counted: int = 0
    named: bool = False
    rule: StragglerRule = DEFAULT_STRAGGLER_RULE

    @property
    def steps_last(self) -> int:
        """In how many recorded steps it arrived last at a collective someone waited for."""
        return sum(1 for w in self.per_step if w > 0)

    @property
    def shares(self) -> tuple[float, ...]:
        """The waiting it caused in each step as a share of that step's time."""
        return tuple(w / t if t > 0 else 0.0 for w, t in zip(self.per_step, self.step_times, strict=False))

    @property
    def message(self) -> str:
        """One sentence with the numbers: ``rank 1 arrived last in 4 of 4 steps and made the other ranks wait
        98.2-101.8 ms per step (91-94% of the step, 401.8 ms in all), longest at reduce_scatter #2 ... in step 3``."""
        waits = [w for w in self.per_step if w > 0]
        shares = [x for x, w in zip(self.shares, self.per_step, strict=False) if w > 0]
        text = f"rank {self.rank} arrived last in {self.steps_last} of {len(self.per_step)} steps"
        if not waits:
            return text
        text += (
            f" and made the other ranks wait {_span(waits, format_us)} per step ({_span(shares, _percent)} of the "
            f"step, {format_us(self.caused_wait)} in all)"
        )
        if self.worst is not None:
            text += f", longest at {self.worst.label} in step {self.worst.step}"
        return text


def _percent(x: float) -> str:
    return f"{x:.0%}"


def _span(xs: Sequence[float], fmt: Callable[[float], str]) -> str:
    """``2.0 ms`` when the values print alike, else ``1.2-2.0 ms`` (``12-20%``)."""
    lo, hi = fmt(min(xs)), fmt(max(xs))
    if lo == hi:
        return lo
    unit = lo.rsplit(" ", 1)[-1] if " " in lo and lo.rsplit(" ", 1)[-1] == hi.rsplit(" ", 1)[-1] else ""
    if unit:
        return f"{lo.rsplit(' ', 1)[0]}\u2013{hi}"
    if lo.endswith("%") and hi.endswith("%"):
        return f"{lo[:-1]}\u2013{hi}"
    return f"{lo}\u2013{hi}"


@dataclass
class TimelineAnalysis:
    """Breakdown and straggler analysis of a ``Timeline`` (computed on first use, then cached)."""

    timeline: TimelineShape
    rule: StragglerRule = DEFAULT_STRAGGLER_RULE
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
        ranks' clock bound (below it, who came last is unknown), the named one (``self.rule``) first, then by the
        steps that count against them and the waiting they caused."""
        waits = self.collectives()
        steps = self.timeline.steps
        per: dict[int, list[CollectiveWait]] = {}
        for w in waits:
            if w.worst_wait >= min_wait_us and w.lateness > w.uncertainty:
                per.setdefault(w.last_rank, []).append(w)
        times = self._step_times()
        out = [_straggler(r, ws, len(waits), steps, times, self.rule) for r, ws in per.items()]
        return sorted(out, key=lambda s: (not s.named, -s.counted, -s.caused_wait))

    def _step_times(self) -> dict[int, float]:
        """Each step every rank recorded: the slowest rank's time for it (what the step cost the job)."""
        spans = [{s.step: s.end - s.start for s in t.steps} for t in self.timeline.ranks.values()]
        return {n: max(s[n] for s in spans) for n in self.timeline.steps if spans and all(n in s for s in spans)}

    def step_time(self) -> float | None:
        """What a step costs the job (us): the median over the steps of the slowest rank's step, the steps every
        rank timed unprofiled when there are any (``RankTimeline.unprofiled_steps``: torch.profiler's per-op cost is
        not in them), else the recorded ones; None without a step every rank timed. ``timed_steps`` says which."""
        per_step = list(self._unprofiled_times().values()) or list(self._step_times().values())
        return _median(per_step) if per_step else None

    def timed_steps(self) -> tuple[tuple[int, ...], bool]:
        """The step numbers ``step_time`` is the median over, and whether they were timed with the profiler
        stopped (True) or are the recorded, profiled steps (False)."""
        unprofiled = self._unprofiled_times()
        if unprofiled:
            return tuple(sorted(unprofiled)), True
        return tuple(sorted(self._step_times())), False

    def _unprofiled_times(self) -> dict[int, float]:
        """Each step every rank timed unprofiled: the slowest rank's time for it."""
        timed = [t.unprofiled_steps for t in self.timeline.ranks.values()]
        common = set.intersection(*(set(t) for t in timed)) if timed else set()
        return {n: max(t[n] for t in timed) for n in sorted(common)}

    def straggler(self) -> Straggler | None:
        """The rank that held the others up when it passes ``self.rule``; None when no rank does."""
        st = self.stragglers()
        return st[0] if st and st[0].named else None

    def summary(self) -> list[str]:
        """Sentences a person reads first: the straggler verdict (one sentence, with its numbers), then the worst
        collectives other than the one the verdict names."""
        lines = []
        top = self.straggler()
        st = self.stragglers()
        n = len(self.timeline.steps)
        rule = self.rule
        if top is not None:
            lines.append(f"Straggler: {top.message}.")
        elif n < rule.min_steps:
            largest = f" (largest wait {format_us(max(s.caused_wait for s in st))})" if st else ""
            lines.append(
                f"No straggler named: {n} step{'' if n == 1 else 's'} recorded{largest}; record at least "
                f"{rule.min_steps} steps (--steps {rule.min_steps}) to tell a straggler from ranks taking turns."
            )
        elif st:
            s = st[0]
            worst = max(range(len(s.per_step)), key=lambda i: s.per_step[i])
            lines.append(
                f"No straggler: no rank arrived last in {rule.steps_needed(n)} of {n} steps with the others waiting "
                f"{rule.share:.0%} of the step or more (closest: rank {s.rank}, last in {s.steps_last} of {n} steps, "
                f"longest wait {format_us(s.per_step[worst])} of a {format_us(s.step_times[worst])} step)."
            )
        else:
            lines.append("No straggler: no rank made another wait 50 us or more at any collective.")
        said = top.worst if top is not None else None  # the straggler's sentence already names its worst collective
        for w in [w for w in self.collectives() if w is not said][:3]:
            if w.worst_wait > 0:
                lines.append(w.message)
        return lines


def _straggler(
    rank: int,
    ws: list[CollectiveWait],
    n_waits: int,
    steps: Sequence[int],
    step_times: dict[int, float],
    rule: StragglerRule,
) -> Straggler:
    """One rank's case against ``rule``."""
    by_step = dict.fromkeys(steps, 0.0)
    for w in ws:
        if w.step in by_step:
            by_step[w.step] += w.worst_wait
    per_step = tuple(by_step[s] for s in steps)
    times = tuple(step_times.get(s, 0.0) for s in steps)
    clock = max((w.uncertainty for w in ws), default=0.0)
    counted = sum(
        1
        for w, t in zip(per_step, times, strict=True)
        if w > 0 and t > 0 and w >= rule.share * t and w > rule.clock_factor * clock
    )
    return Straggler(
        rank=rank,
        last_count=len(ws),
        collectives=n_waits,
        caused_wait=sum(w.worst_wait for w in ws),
        worst=max(ws, key=lambda w: w.worst_wait),
        per_step=per_step,
        step_times=times,
        clock=clock,
        counted=counted,
        named=len(steps) >= rule.min_steps and counted >= rule.steps_needed(len(steps)),
        rule=rule,
    )


def _step_spans(t: RankTimeline, steps: Sequence[int]) -> list[Interval]:
    wanted = set(steps)
    return [(s.start, s.end) for s in t.steps if s.step in wanted]


def _median(xs: Sequence[float]) -> float:
    v = sorted(xs)
    if not v:
        return 0.0
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def idle_intervals(t: RankTimeline) -> list[Interval]:
    """Where ``t``'s main thread was idle inside its recorded steps: in no op and not blocked by a collective (a
    ``sleep``, data loading, Python between ops); what the breakdown's ``idle`` adds up and the views draw."""
    window, busy, blocked = _main_thread(t)
    return subtract(subtract(window, busy), blocked)


def _main_thread(t: RankTimeline) -> tuple[list[Interval], list[Interval], list[Interval]]:
    """The recorded steps, and within them where the main thread ran an op and where a collective blocked it."""
    window = union((s.start, s.end) for s in t.steps)
    blocked = intersect(union(iv for c in t.collectives for iv in c.blocked_intervals()), window)
    busy = intersect(union(t.ops.intervals(0)), window)
    return window, busy, blocked


def _rank_breakdown(tl: TimelineShape, rank: int) -> RankBreakdown:
    t = tl.ranks[rank]
    window, busy, blocked = _main_thread(t)
    work = [(c.start, c.end) for c in t.collectives if c.start is not None and c.end is not None]
    comm = intersect(union(work + blocked), window)
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


def _collective_waits(tl: TimelineShape) -> list[CollectiveWait]:
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
