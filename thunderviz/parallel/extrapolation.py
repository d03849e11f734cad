"""A transformer's step peak from the same model cut to a few blocks: every moment of the step, extrapolated.

Why every moment and not the peak: the peak of a model cut to 2 or 3 blocks need not be where the whole model's is.
Llama-2-70B under ZERO3 shows it: with 2 or 3 blocks the peak sits in backward where two gathered blocks, a
gradient bucket and the backward's temporaries meet (a block's saved activations, 1.3 GiB, are fewer bytes than one
gathered block, 1.6 GiB), one block further on in the larger cut; the whole model's peak is at the start of
backward, where 80 blocks' activations are alive. Extrapolating the two cut peaks category by category (what the
plan did) mixed two different moments and predicted 124 GiB of communication buffers. Both peaks were in backward,
so checking the phase could not see it.

So the rehearsal records a *timeline* (``Timeline``): the bytes per category at every moment a new total was
reached, with the op that made it and the block computing then (the block whose parameters the last op read).
Consecutive moments of one phase and one block form a *run*. A run of the smaller cut is paired with the run of the
same block counted from the start and with the run of the same block counted from the end in the larger cut (block
``j`` of 2 with blocks ``j`` and ``j + 1`` of 3): both are real places of that block in the whole model. A block's
run ends with the hand-over to the next block (its gathered parameters unpacked, the one after prefetched), which
differs when the next block is the last, so inside a pair of runs the moments are matched one by one while the runs
are alike from their start; a moment of the larger cut past that (the prefetch a block makes when another block
follows the next one) takes the per-block increment of the last moment alike, its neighbour in the same hand-over.
Runs that differ from their first moment (a checkpointed block's backward, Llama-2-7B's ZERO2 ``+ac``: a middle
block's recomputation begins with another op than the last block's) are aligned by their ops (``difflib``) instead,
when at least half of each is matched (``_pairs``). Runs outside the blocks (embedding, head, loss, a ``foreach``
optimizer op over every parameter) pair in order.

Each pair of moments is extrapolated affinely in the number of blocks (every block adds the same tensors at the same
moment), and the whole model's peak is the largest of them. Why the blocks between the first and the last need no
pair of their own: at a moment inside block ``j`` of ``n`` identical blocks each block before it contributes one
constant and each block after it another, so the memory there is affine in ``j`` and largest at one end of the
blocks of its kind, which the pairs from the start and from the end reach. When the cuts' runs do not correspond
(a different number of runs of some block), ``extrapolate_peak`` says so and the plan rehearses the whole model.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from thunderviz.trace.memory import CATEGORIES, MEASURED_GROUPS

__all__ = ["CUTS", "MANY", "ExtrapolatedPeak", "Timeline", "extrapolate_peak"]

#: A moment whose op read the parameters of several blocks at once (a ``foreach`` optimizer op).
MANY = "many"


@dataclass
class Timeline:
    """The moments of one counted step at one world size: one entry per moment a new total was reached.

    ``blocks`` is how many repeated blocks the rehearsed model had; per moment: ``events`` (the tracker's change
    counter then), ``phases``, ``marks`` (the block computing: its index, None before any block, ``MANY``), ``ops``
    (the op that made the moment), ``categories`` (bytes per ``CATEGORIES``) and ``groups`` (bytes per
    ``MEASURED_GROUPS``). ``regrads`` are the storages that became gradients after they were made, ``(made at,
    became a gradient at, [(event, category)], bytes)``: alive at a moment between the two, they count as gradients
    there (see ``StorageTracker``).
    """

    blocks: int
    events: list[int] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    marks: list[Any] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    categories: list[tuple[int, ...]] = field(default_factory=list)
    groups: list[tuple[int, ...]] = field(default_factory=list)
    regrads: list[tuple[int, int, list[tuple[int, str]], int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.events)

    def total(self, i: int) -> int:
        return sum(self.categories[i])

    def at(self, i: int) -> tuple[dict[str, int], dict[str, int]]:
        """(bytes per category, bytes per measured group) at moment ``i``, storages on their way to becoming
        gradients counted as gradients."""
        breakdown = dict(zip(CATEGORIES, self.categories[i], strict=True))
        event = self.events[i]
        for made, became, history, n in self.regrads:
            if not made <= event < became:
                continue
            then = None
            for at, category in history:
                if at > event:
                    break
                then = category
            if then is not None and then != "gradients":
                moved = min(n, breakdown[then])
                breakdown[then] -= moved
                breakdown["gradients"] += moved
        return breakdown, dict(zip(MEASURED_GROUPS, self.groups[i], strict=True))


@dataclass(frozen=True)
class ExtrapolatedPeak:
    """The whole model's peak: bytes per category and per measured group, its phase, and whether some runs were
    aligned by their ops (``_pairs``: then exact but for the tensors made at an unmatched moment, which take a
    neighbour's increment; on a 6-block Llama checkpointed under DDP, one 512-byte gradient block over)."""

    breakdown: dict[str, int]
    groups: dict[str, int]
    phase: str
    aligned: bool = False

    @property
    def peak_bytes(self) -> int:
        return sum(self.breakdown.values())


#: How far a block's neighbours reach into its run, in the order a phase visits the blocks: the one before it (a
#: reduce_scatter still in flight in backward) and the two after it (the next is unpacked and the one after it
#: prefetched in its hand-over). A run's *kind* is its distance from each end, clipped to these.
BEFORE, AFTER = 1, 2
#: The cuts whose runs hold every kind the whole model has at a fixed place (``BEFORE + AFTER`` blocks) and, one
#: block more, the open kind between them (module doc).
CUTS = (BEFORE + AFTER, BEFORE + AFTER + 1)


def _kind(t: Timeline, phase: str, mark: Any) -> Any:
    """A block's distances from the start and the end of the order the phase visits them (backward: from the last
    block), clipped to ``BEFORE`` and ``AFTER``; a moment outside the blocks keeps its mark."""
    if not isinstance(mark, int):
        return mark
    p = t.blocks - 1 - mark if phase == "backward" else mark
    return (min(p, BEFORE), min(t.blocks - 1 - p, AFTER))


def _open(kind: Any) -> bool:
    """A kind the whole model has at every place between its ends (both distances clipped)."""
    return isinstance(kind, tuple) and kind == (BEFORE, AFTER)


def _runs(t: Timeline) -> dict[tuple[str, Any, int], list[int]]:
    """The moments in runs of one (phase, block), keyed by (phase, kind, how many runs of that block came before)."""
    runs: dict[tuple[str, Any, int], list[int]] = {}
    seen: dict[tuple[str, Any], int] = {}
    last = None
    for i in range(len(t)):
        key = (t.phases[i], t.marks[i])
        if key != last:
            seen[key] = seen.get(key, -1) + 1
            last = key
        runs.setdefault((key[0], _kind(t, *key), seen[key]), []).append(i)
    return runs


def _alike(ta: Timeline, a: list[int], tb: Timeline, b: list[int]) -> int:
    """How many moments two runs begin with alike (the same ops, one by one)."""
    same = 0
    for i, j in zip(a, b, strict=False):
        if ta.ops[i] != tb.ops[j]:
            break
        same += 1
    return same


#: The share of each of two runs that must be aligned by their ops for the alignment to stand (``_pairs``).
ALIGNED = 0.5


def _pairs(ta: Timeline, a: list[int], tb: Timeline, b: list[int]) -> tuple[list[tuple[int, int]], bool] | None:
    """For each moment of run ``b``, the positions (in ``b``, in ``a``) of the pair whose difference is its
    per-block increment, and whether the runs were aligned by their ops; None when they cannot be paired.

    Runs that begin alike pair one by one while they are alike, and a moment past that takes the last pair's
    increment (the larger cut's own hand-over). Runs that do not begin alike (a checkpointed block's backward run
    starts with another op where the next block is the last) are aligned by their ops (``difflib``), and an unmatched
    moment takes the increment of the matched moment before it (after it, at the start); they stand only when at
    least ``ALIGNED`` of each run is matched."""
    same = _alike(ta, a, tb, b)
    if same:
        return [(min(x, same - 1),) * 2 for x in range(len(b))], False
    ops_a, ops_b = [ta.ops[i] for i in a], [tb.ops[j] for j in b]
    matcher = difflib.SequenceMatcher(None, ops_a, ops_b, autojunk=False)
    partner = {m.b + k: m.a + k for m in matcher.get_matching_blocks() for k in range(m.size)}
    if not partner or len(partner) < ALIGNED * max(len(a), len(b)):
        return None
    out, ref = [], min(partner)
    for x in range(len(b)):
        if x in partner:
            ref = x
        out.append((ref, partner[ref]))
    return out, True


#: A moment of the whole model: the larger cut's moment ``j`` plus, per term ``(coefficient, r, i)``, that many times
#: the larger cut's moment ``r`` less the smaller cut's moment ``i`` (what one more block adds there).
_Moment = tuple[int, list[tuple[int, int, int]]]


def _moments(t0: Timeline, t1: Timeline, n: int) -> tuple[list[_Moment], bool] | None:
    """Every moment of the whole model the cuts determine (module doc), and whether some runs were aligned by their
    ops; None when their runs do not correspond."""
    k1 = t1.blocks
    small, large = _runs(t0), _runs(t1)
    paired = {key for key in large if not _open(key[1])}
    if paired != set(small):
        return None
    found = {key: _pairs(t0, small[key], t1, large[key]) for key in paired}
    if not all(found.values()):
        return None
    pairs = {key: got[0] for key, got in found.items()}
    aligned = any(got[1] for got in found.values())
    out: list[_Moment] = []
    for key in paired:
        a, b = small[key], large[key]
        out += [(j, [(n - k1, b[x], a[i])]) for j, (x, i) in zip(b, pairs[key], strict=True)]
    for (phase, kind, nth), m in large.items():
        if not _open(kind):
            continue
        p = BEFORE  # the open run's place in the larger cut: CUTS[1] blocks hold one
        # what one more block already visited adds (a run after as many blocks), and one more still to come
        earlier, later = (phase, (BEFORE, AFTER - 1), nth), (phase, (0, AFTER), nth)
        if earlier not in paired or later not in paired:
            return None
        # each moment of the open run, placed in the runs beside it in the larger cut, and through their pairs
        placed = {e: _pairs(t1, large[e], t1, m) for e in (earlier, later)}
        if not all(placed.values()):
            return None
        # per moment of the open run: the (larger cut's, smaller cut's) moments whose difference it takes
        through = {
            e: [(large[e][r], small[e][i]) for r, i in (pairs[e][w] for _, w in got[0])] for e, got in placed.items()
        }
        for x, j in enumerate(m):
            before, after = through[earlier][x], through[later][x]
            for q in {BEFORE, n - 1 - AFTER}:  # the ends of the whole model's run of this kind
                out.append((j, [(q - p, *before), ((n - 1 - q) - (k1 - 1 - p), *after)]))
        aligned = aligned or any(got[1] for got in placed.values())
    return out, aligned


def extrapolate_peak(timelines: Mapping[int, Timeline], n: int) -> ExtrapolatedPeak | None:
    """The peak of the model with ``n`` blocks from the timelines of two cuts one block apart (``{blocks:
    Timeline}``, module doc); None when their runs do not correspond."""
    if len(timelines) != 2:
        raise ValueError(f"extrapolate_peak: needs timelines at exactly two block counts, got {sorted(timelines)}")
    (k0, t0), (k1, t1) = sorted(timelines.items())
    if (k0, k1) != CUTS:
        raise ValueError(f"extrapolate_peak: needs the cuts {CUTS}, got {k0} and {k1}")
    found = _moments(t0, t1, n)
    if not found or not found[0]:
        return None
    moments, aligned = found

    def total(m: _Moment) -> int:
        j, terms = m
        return t1.total(j) + sum(c * (t1.total(r) - t0.total(i)) for c, r, i in terms)

    j, terms = max(moments, key=lambda m: (total(m), -m[0]))
    breakdown, groups = t1.at(j)
    for c, r, i in terms:
        (cr, gr), (ci, gi) = t1.at(r), t0.at(i)
        breakdown = {k: v + c * (cr[k] - ci[k]) for k, v in breakdown.items()}
        groups = {k: v + c * (gr[k] - gi[k]) for k, v in groups.items()}
    return ExtrapolatedPeak(breakdown, groups, t1.phases[j], aligned)
