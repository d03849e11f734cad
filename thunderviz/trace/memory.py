"""Per-rank memory of one training step as plain data: what a plan predicts, what a run measured, and how far apart.

Why plain data here: the prediction is made in one process (``thunder.memory.rehearsal``), the measurement on every rank
(``thunder.memory.meter``), and both are drawn by ``render`` and the widgets, which must not import torch. A step is
forward, the loss, backward, the optimizer step and ``zero_grad``; its *peak* is the most tensor bytes alive at once
on one rank during it, everything counted (the quantity ``torch.cuda.max_memory_allocated()`` reports in steady state
after ``reset_peak_memory_stats()``).

One account for every view: ``ACCOUNT`` names what a step peak is made of and ``COLORS`` gives each part one colour;
the plan's bars, a run's measured bars, the reports, the widgets, ``compare_runs`` and the predicted-against-measured
check all read ``MemoryEstimate.account`` and ``StepMemory.account``, so a part has one value wherever it is shown.
Each storage alive at the peak is in exactly one part, decided in this order, by the same rules for a prediction
(``thunder.memory.storage_tracker``) and a measurement (``thunder.memory.meter``):

- ``parameters``: the modules' parameters and buffers (this rank's shards under FSDP);
- ``gradients``: gradient tensors alive at the peak, whether already in ``.grad`` or computed in backward and on their
  way there (thunder's backward hands every gradient over at its end, so counting ``.grad`` alone left the part
  empty at a peak inside backward);
- ``optimizer state``: the optimizer's state only; what its ``step()`` allocates on the way is a temporary;
- ``saved for backward``: what autograd keeps for backward, of whatever origin (activations, the batch, FSDP's
  gathered parameters under ZERO2), when it is none of the above;
- ``temporaries``: everything else, communication buffers included (packed buckets, gathered parameters not saved
  for backward). torch's ``MemTracker`` cannot tell a collective's buffer from any other temporary, so the
  prediction, which could, counts them here too: the two sides show the same parts (``LEGEND`` says so on every bar).

A measurement from CUDA's allocator statistics knows only the total (one ``total`` part). The account is not the
trace's "saved tensors" (``trace.saved``), which counts every tensor forward hands to backward, parameters included,
once per tensor: a different fact with its own name.

Finer and coarser splits stay underneath: a prediction labels ``CATEGORIES`` (``MemoryEstimate.breakdown``), and
both sides keep torch ``MemTracker``'s own split (``MEASURED_GROUPS``: parameters, gradients in ``.grad``,
everything the optimizer step holds, the rest). ``compare`` checks a prediction against a measurement like with
like: the total and each part of the account holding at least ``COMPARED_SHARE`` of the peak on either side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from thunderviz.trace.units import format_bytes

__all__ = [
    "ACCOUNT",
    "CATEGORIES",
    "COLORS",
    "COMPARED_SHARE",
    "LEGEND",
    "MEASURED_GROUPS",
    "PHASES",
    "TOLERANCE",
    "CategoryGap",
    "MemoryComparison",
    "MemoryEstimate",
    "StepMemory",
    "account_of",
    "compare",
    "group_of",
    "largest_peak",
    "to_account",
]

#: What a predicted peak is made of, in the order bars stack. ``parameters`` counts module buffers too.
CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer state",
    "gathered parameters",
    "saved activations",
    "temporaries",
    "communication buffers",
    "inputs",
)

#: What a step peak is made of in every view, in the order bars stack (see the module docstring).
ACCOUNT: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer state",
    "saved for backward",
    "temporaries",
)

#: How a bar's legend names a part when its name alone would hide what the account put in it.
LEGEND: dict[str, str] = {"temporaries": "temporaries (incl. comm. buffers)"}

#: One colour per account category, for every bar and legend (``total``: a measurement that has only the total).
COLORS: dict[str, str] = {
    "parameters": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer state": "#e15759",
    "saved for backward": "#59a14f",
    "temporaries": "#edc948",
    "total": "#79706e",
}

#: Where each predicted category goes in the account: what autograd saved is ``saved activations`` whatever it was
#: before (``thunder.memory.storage_tracker``); buffers of collectives and the unsaved batch are temporaries.
_ACCOUNT_OF = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer state": "optimizer state",
    "gathered parameters": "temporaries",
    "saved activations": "saved for backward",
    "temporaries": "temporaries",
    "communication buffers": "temporaries",
    "inputs": "temporaries",
}


def account_of(category: str) -> str:
    """The account category (``ACCOUNT``) a predicted category (``CATEGORIES``) is drawn as."""
    return _ACCOUNT_OF[category]


def to_account(breakdown: Mapping[str, int]) -> dict[str, int]:
    """A predicted breakdown (``CATEGORIES``) in the account's categories, every one present (0 when empty)."""
    out = dict.fromkeys(ACCOUNT, 0)
    for category, n in breakdown.items():
        out[account_of(category)] += int(n)
    return out


#: What torch's MemTracker can tell apart on a rank: its PARAM+BUFFER, GRAD, OPT, and everything else.
MEASURED_GROUPS: tuple[str, ...] = ("parameters", "gradients", "optimizer", "activations and temporaries")

#: Where in the step the peak happened.
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer step")

#: Predicted and measured may differ by this fraction before the report names the category.
TOLERANCE = 0.10
#: A part of the account is compared when it holds at least this share of the peak on either side (a few KiB of
#: difference in a small part is not worth a warning).
COMPARED_SHARE = 0.05

_GROUP = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer state": "optimizer",
}


def group_of(category: str) -> str:
    """The measured group a predicted category falls in (MemTracker's view of it)."""
    return _GROUP.get(category, "activations and temporaries")


@dataclass(frozen=True)
class MemoryEstimate:
    """A predicted per-rank peak for one step.

    ``breakdown`` maps each of ``CATEGORIES`` to the bytes of that kind alive at the peak (they sum to
    ``peak_bytes``); ``groups`` is the same peak as MemTracker would split it (``MEASURED_GROUPS``: it counts what
    the optimizer step allocates as optimizer memory, and gradients from the moment they reach ``.grad``);
    ``phase`` is where the peak is (``PHASES``). ``how`` says how it was obtained (rehearsed whole, or extrapolated
    over repeated blocks, and from what).
    """

    peak_bytes: int
    breakdown: dict[str, int]
    groups: dict[str, int]
    phase: str
    how: str = ""

    def __post_init__(self) -> None:
        if sum(self.breakdown.values()) != self.peak_bytes:
            raise ValueError(
                f"MemoryEstimate: the breakdown sums to {sum(self.breakdown.values())} bytes, not the peak"
                f" {self.peak_bytes}"
            )

    @property
    def account(self) -> dict[str, int]:
        """The peak in the account every view draws (``ACCOUNT``)."""
        return to_account(self.breakdown)

    def to_dict(self) -> dict[str, object]:
        return {
            "peak_bytes": self.peak_bytes,
            "breakdown": dict(self.breakdown),
            "groups": dict(self.groups),
            "phase": self.phase,
            "how": self.how,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> MemoryEstimate:
        return cls(
            peak_bytes=int(d["peak_bytes"]),  # type: ignore[arg-type]
            breakdown={str(k): int(v) for k, v in dict(d["breakdown"]).items()},  # type: ignore[arg-type]
            groups={str(k): int(v) for k, v in dict(d["groups"]).items()},  # type: ignore[arg-type]
            phase=str(d["phase"]),
            how=str(d.get("how", "")),
        )


@dataclass(frozen=True)
class StepMemory:
    """What one rank measured: the peak of a steady-state step (the largest over the steps measured).

    ``source`` is ``"cuda"`` (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` at each step's
    start: only the total is known) or ``"memtracker"`` (torch's ``MemTracker``, dispatch-level accounting on CPU:
    ``groups`` holds its split, see ``MEASURED_GROUPS``, and ``parts`` the same peak in the account, ``ACCOUNT``).
    ``steps`` lists the step numbers measured (the first step compiles and creates
    the optimizer state, so it is never one of them); ``note`` says why nothing was measured.
    """

    peak_bytes: int | None
    source: str
    groups: dict[str, int] = field(default_factory=dict)
    steps: tuple[int, ...] = ()
    note: str = ""
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return self.peak_bytes is not None

    @property
    def account(self) -> dict[str, int]:
        """The peak in the account every view draws (``ACCOUNT``); ``{"total": peak}`` when only the total is known
        (CUDA's allocator statistics), empty when nothing was measured."""
        if self.peak_bytes is None:
            return {}
        if self.parts:
            return {c: int(self.parts.get(c, 0)) for c in ACCOUNT if c in self.parts}
        return {"total": self.peak_bytes}

    def to_dict(self) -> dict[str, object]:
        return {
            "peak_bytes": self.peak_bytes,
            "source": self.source,
            "groups": dict(self.groups),
            "steps": list(self.steps),
            "note": self.note,
            "parts": dict(self.parts),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> StepMemory:
        peak = d.get("peak_bytes")
        return cls(
            peak_bytes=None if peak is None else int(peak),  # type: ignore[arg-type]
            source=str(d.get("source", "")),
            groups={str(k): int(v) for k, v in dict(d.get("groups") or {}).items()},  # type: ignore[arg-type]
            steps=tuple(int(s) for s in d.get("steps") or ()),  # type: ignore[union-attr]
            note=str(d.get("note", "")),
            parts={str(k): int(v) for k, v in dict(d.get("parts") or {}).items()},  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class CategoryGap:
    """One group compared: predicted and measured bytes, and their relative difference (of the measured)."""

    group: str
    predicted: int
    measured: int

    @property
    def relative(self) -> float:
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else float("inf")
        return (self.predicted - self.measured) / self.measured

    def describe(self) -> str:
        sign = "+" if self.predicted >= self.measured else "-"
        pct = "inf" if self.relative == float("inf") else f"{abs(self.relative) * 100:.1f}"
        return (
            f"{self.group}: predicted {format_bytes(self.predicted)}, measured {format_bytes(self.measured)}"
            f" ({sign}{pct}%)"
        )


@dataclass(frozen=True)
class MemoryComparison:
    """Predicted against measured for one rank: the total, and each part of the account both sides know."""

    total: CategoryGap
    groups: tuple[CategoryGap, ...]

    def off(self, tolerance: float = TOLERANCE) -> list[CategoryGap]:
        """The total and the parts further apart than ``tolerance``; a part is compared when it holds at least
        ``COMPARED_SHARE`` of the peak on either side."""
        floor = COMPARED_SHARE * max(self.total.measured, self.total.predicted)
        out = [self.total] if abs(self.total.relative) > tolerance else []
        for gap in self.groups:
            if max(gap.predicted, gap.measured) < floor:
                continue
            if abs(gap.relative) > tolerance:
                out.append(gap)
        return out

    def summary(self, tolerance: float = TOLERANCE) -> str:
        """``within 10%: predicted 23.4 MiB, measured 23.4 MiB (-0.0%)`` or which parts are off."""
        off = self.off(tolerance)
        if not off:
            compared = [g.group for g in self.groups if _compared(g, self.total)]
            parts = f" (total and {', '.join(compared)})" if compared else " (the total)"
            return f"within {tolerance * 100:.0f}%{parts}: {self.total.describe().removeprefix('total: ')}"
        return "; ".join(g.describe() for g in off)


def _compared(gap: CategoryGap, total: CategoryGap) -> bool:
    return max(gap.predicted, gap.measured) >= COMPARED_SHARE * max(total.measured, total.predicted)


def compare(predicted: MemoryEstimate, measured: StepMemory) -> MemoryComparison | None:
    """Predicted against measured, like with like: the total, and each part of the account when the measurement has
    the account (MemTracker's; CUDA's statistics have the total only); None when nothing was measured."""
    if measured.peak_bytes is None:
        return None
    total = CategoryGap("total", predicted.peak_bytes, measured.peak_bytes)
    if not measured.parts:
        return MemoryComparison(total, ())
    mine, theirs = predicted.account, measured.account
    gaps = tuple(CategoryGap(c, mine.get(c, 0), theirs.get(c, 0)) for c in ACCOUNT)
    return MemoryComparison(total, gaps)


def largest_peak(step_memory: Mapping[int, StepMemory]) -> tuple[int, StepMemory] | None:
    """The rank with the largest measured step peak and its ``StepMemory`` (ties: the lowest rank); None when no rank
    measured one. What stands for a run's peak wherever one number does (tables, verdicts)."""
    measured = {r: m for r, m in step_memory.items() if m.peak_bytes is not None}
    if not measured:
        return None
    rank = max(sorted(measured), key=lambda r: measured[r].peak_bytes or 0)
    return rank, measured[rank]
