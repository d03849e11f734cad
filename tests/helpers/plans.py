"""Plans made of plain numbers (no rehearsal): for tests of what reads a plan — choosing, drawing, the magics' flag."""

from __future__ import annotations

from thunderviz.parallel.plan import candidate_specs, link_cost
from thunderviz.strategies.candidates import Candidate
from thunderviz.strategies.planning import Plan
from thunderviz.trace.memory import CATEGORIES, MemoryEstimate, group_of

__all__ = ["synthetic_plan"]


def _estimate(params: int, activations: int, phase: str = "backward") -> MemoryEstimate:
    breakdown = dict.fromkeys(CATEGORIES, 0) | {"parameters": params, "saved activations": activations}
    groups: dict[str, int] = {}
    for c, n in breakdown.items():
        groups[group_of(c)] = groups.get(group_of(c), 0) + n
    return MemoryEstimate(params + activations, breakdown, groups, phase, "synthetic")


def synthetic_plan(
    peaks: dict[str, int],
    world_size: int = 2,
    budget: int | None = None,
    comm: dict[str, tuple[int, int]] | None = None,
) -> Plan:
    """A plan whose candidate ``name`` has a predicted peak of ``peaks[name]`` bytes (a quarter of it parameters)
    and sends ``comm[name]`` = (bytes, collectives) per step, priced on the CPU link; without ``comm`` both grow
    along the preference order, as the ring formulas make them."""
    candidates = []
    link = link_cost("cpu")
    for i, spec in enumerate(candidate_specs([world_size], list(peaks))):
        peak = peaks[spec.name]
        memory = _estimate(peak // 4, peak - peak // 4)
        fits = budget is None or peak <= budget
        sent, collectives = (comm or {}).get(spec.name, (1000 * (i + 1), 2 + i))
        seconds = link.seconds(sent, collectives)
        candidates.append(Candidate(spec.name, world_size, spec.options, memory, sent, collectives, seconds, fits))
    return Plan(candidates, budget, "cpu", "Synthetic", "synthetic", 0.0)
