"""Plans made of plain numbers (no rehearsal): for tests of what reads a plan — choosing, drawing, the magics' flag."""

from __future__ import annotations

from thunderviz.parallel.plan import candidate_specs
from thunderviz.strategies.planning import Candidate, Plan
from thunderviz.trace.memory import CATEGORIES, MemoryEstimate, group_of

__all__ = ["synthetic_plan"]


def _estimate(params: int, activations: int, phase: str = "backward") -> MemoryEstimate:
    breakdown = dict.fromkeys(CATEGORIES, 0) | {"parameters": params, "saved activations": activations}
    groups: dict[str, int] = {}
    for c, n in breakdown.items():
        groups[group_of(c)] = groups.get(group_of(c), 0) + n
    return MemoryEstimate(params + activations, breakdown, groups, phase, "synthetic")


def synthetic_plan(peaks: dict[str, int], world_size: int = 2, budget: int | None = None) -> Plan:
    """A plan whose candidate ``name`` has a predicted peak of ``peaks[name]`` bytes (a quarter of it parameters);
    communication grows along the preference order, as the ring formulas make it."""
    candidates = []
    for i, spec in enumerate(candidate_specs([world_size], list(peaks))):
        peak = peaks[spec.name]
        memory = _estimate(peak // 4, peak - peak // 4)
        fits = budget is None or peak <= budget
        candidates.append(Candidate(spec.name, world_size, spec.options, memory, 1000 * (i + 1), 2 + i, fits))
    return Plan(candidates, budget, "cpu", "Synthetic", "synthetic", 0.0)
