"""One clock for all ranks: each rank's offset to rank 0, estimated from rendezvous rounds, with a proven bound.

Every rank records on its own monotonic clock; collectives can only be compared across ranks once those clocks are
aligned. ``timeline.record`` takes ``(before, after)`` samples around collective rendezvous; ``align_clocks`` turns
them into a ``ClockEstimate`` per rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ClockEstimate", "align_clocks"]


@dataclass
class ClockEstimate:
    """A rank's clock offset to rank 0 in microseconds (``local - rank0``), within +/- ``uncertainty``."""

    offset: float = 0.0
    uncertainty: float = 0.0
    rounds: int = 0
    method: str = "none"

    def to_dict(self) -> dict[str, Any]:
        unc = None if math.isinf(self.uncertainty) else self.uncertainty  # JSON has no infinity: null = unknown
        return {"offset": self.offset, "uncertainty": unc, "rounds": self.rounds, "method": self.method}


def align_clocks(samples: Mapping[int, Sequence[tuple[float, float]]]) -> tuple[dict[int, ClockEstimate], list[str]]:
    """Each rank's clock offset to rank 0, with a bound, from ``(before, after)`` pairs around rendezvous.

    In every round all ranks enter one collective; it cannot finish on any rank before the last rank entered.
    So that instant M lies between each rank's ``before`` and ``after``, read on each rank's own clock. With
    ``theta_r`` the offset of rank r's clock, ``theta_r - theta_0`` lies in ``[before_r - after_0,
    after_r - before_0]``; intersecting the intervals of all rounds tightens the bound. The estimate is the
    middle of the intersection and the uncertainty its half width. If the intervals do not intersect (a clock
    drifted during the run), the narrowest round is used and a note says so.

    Returns:
        ``({rank: ClockEstimate}, notes)``; ranks without samples (no process group) get offset 0 and a note
        when there is more than one rank.
    """
    notes: list[str] = []
    out: dict[int, ClockEstimate] = {}
    if not samples:
        return out, notes
    ref = min(samples)
    base = list(samples[ref])
    for r, pairs in samples.items():
        if r == ref:
            out[r] = ClockEstimate(0.0, 0.0, len(base), "reference" if len(samples) > 1 else "single rank")
            continue
        n = min(len(pairs), len(base))
        if n == 0:
            out[r] = ClockEstimate(0.0, math.inf, 0, "none")
            notes.append(
                f"rank {r}: no clock samples (no process group?); its clock is taken as rank {ref}'s, "
                "which is only right on one host"
            )
            continue
        if len(pairs) != len(base):
            notes.append(f"rank {r}: {len(pairs)} clock samples vs {len(base)} on rank {ref}; using the first {n}")
        bounds = [(pairs[i][0] - base[i][1], pairs[i][1] - base[i][0]) for i in range(n)]
        lo = max(b[0] for b in bounds)
        hi = min(b[1] for b in bounds)
        method = "rendezvous bound"
        if lo > hi:
            lo, hi = min(bounds, key=lambda b: b[1] - b[0])
            method = "narrowest rendezvous (rounds disagree)"
            notes.append(
                f"rank {r}: the clock-offset bounds of {n} rounds do not intersect (clock drift or a preempted "
                f"rank); using the narrowest round, +/- {(hi - lo) / 2:.0f} us"
            )
        out[r] = ClockEstimate((lo + hi) / 2, (hi - lo) / 2, n, method)
    return out, notes
