"""``thunderviz.compare_runs(...)``: the "which strategy?" table across runs, and the plan's candidates beside them.

Why one table: a user choosing a strategy ran ZERO2, ZERO3 and DDP in three cells and got three reports, each with
its own memory bars, ledger and timeline; the choice is made across them. Each row is one run (measured on its
ranks) or one plan candidate (predicted), with the same columns: peak per rank and what it is made of, bytes each
rank sends per step, the step time when a timeline measured it, whether it fits a budget, and one sentence of why
it differs from the leanest row of its group. Numbers come from the reports and plans as they are (the report's own
``sent_per_step``, ``step_peak``, ``step_time``): nothing is re-measured or re-counted here.

Rows are compared only within one workload (``trace.workload``: the same model, batch, optimizer and world size):
a DDP cell with SGD is lean next to ZERO2 with AdamW because SGD keeps no optimizer state, and a table that ranked
them together called DDP "the leanest" while the plan said DDP with AdamW does not fit. So the table is a list of
groups, each ranked on its own with exactly one leanest row, and a run that shares its workload with nothing says
so and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from thunderviz.trace.units import format_bytes, steps_text
from thunderviz.trace.workload import Workload

__all__ = ["StrategyGroup", "StrategyRow", "StrategyTable", "compare_runs"]


@dataclass(frozen=True)
class StrategyRow:
    """One run or candidate. ``peak_bytes`` is the largest rank's step peak (None: nothing measured, ``note`` says
    why); ``parts`` splits it in the one memory account (``trace.memory.ACCOUNT``), measured for a run, predicted
    for a candidate; ``sent_bytes`` is what the busiest rank puts on the wire per step (``trace.wire``); ``step_ms``
    the median step of the slowest rank (None without a timeline); ``peak_steps`` / ``timed_steps`` the step
    numbers the peak and the step time were measured on (``timed_unprofiled``: with the profiler stopped);
    ``across_hosts`` what the busiest host sends to the others per step (None on one host, or when the hosts are
    unknown: ``reports.traffic``)."""

    name: str
    source: str  # "measured" or "planned"
    strategy: str
    ranks: int
    peak_bytes: int | None
    parts: dict[str, int] = field(default_factory=dict)
    sent_bytes: int | None = None
    step_ms: float | None = None
    fits: bool | None = None
    why: str = ""
    note: str = ""
    across_hosts: int | None = None
    peak_steps: tuple[int, ...] = ()
    timed_steps: tuple[int, ...] = ()
    timed_unprofiled: bool = False


@dataclass(frozen=True)
class StrategyGroup:
    """The rows of one workload, leanest peak first among those that fit. ``workload`` is None for runs whose
    workload is unknown (no module was traced); ``alone`` says why a single run is compared with nothing;
    ``recommended`` what the plan in the group recommends (the leanest row need not be it: the plan picks, among
    what fits, DDP, else the least communication)."""

    workload: Workload | None
    rows: tuple[StrategyRow, ...]
    alone: str = ""
    recommended: str = ""

    @property
    def title(self) -> str:
        return self.workload.describe() if self.workload is not None else "workload unknown (no module was traced)"


@dataclass(frozen=True)
class StrategyTable:
    """The groups (``StrategyGroup``), in the order their first run came; shows itself as HTML in a notebook."""

    groups: tuple[StrategyGroup, ...]
    budget: int | None = None

    @property
    def rows(self) -> tuple[StrategyRow, ...]:
        """Every row, group after group."""
        return tuple(r for g in self.groups for r in g.rows)

    def __str__(self) -> str:
        lines = [f"which strategy? (budget per rank: {format_bytes(self.budget) if self.budget else 'none'})"]
        for g in self.groups:
            said = "; ".join(x for x in (g.alone, g.recommended and f"the plan recommends {g.recommended}") if x)
            lines.append(f"{g.title}:" + (f" {said}" if said else ""))
            for r in g.rows:
                peak = format_bytes(r.peak_bytes, unknown="not measured")
                sent = format_bytes(r.sent_bytes, unknown="?")
                how = "unprofiled" if r.timed_unprofiled else "profiled"
                step = "" if r.step_ms is None else f", step {r.step_ms:.1f} ms ({steps_text(r.timed_steps)}, {how})"
                fits = "" if r.fits is None else (", fits" if r.fits else ", does not fit")
                across = "" if r.across_hosts is None else f" ({format_bytes(r.across_hosts)} per host across hosts)"
                lines.append(
                    f"- {r.name} ({r.source}, {r.ranks} ranks): peak {peak}, sends {sent}/step{across}{step}{fits}"
                )
                if r.why:
                    lines.append(f"    {r.why}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from thunderviz.render.strategy_table import strategy_table_html

        return strategy_table_html(self)


def compare_runs(*runs: Any, plan: Any = None, budget: int | None = None) -> StrategyTable:
    """One table of every run (``RunReport`` of a ``%%thunder_fsdp`` / ``%%thunder_ddp`` cell) and, with ``plan``,
    every candidate of a ``thunderviz.plan(...)``, grouped by workload (see the module docstring).

    Args:
        runs: the reports to compare (at least one, or a plan); or one mapping of name -> report, whose names the
            rows take (a report's own ``--name`` otherwise, else "run N").
        plan: a ``Plan``; its candidates become rows marked "planned", in the group of the runs whose workload it
            predicted, and its budget is used unless ``budget`` is given.
        budget: bytes per rank; a row fits when its peak is at most this.

    Raises:
        TypeError: something that is neither a run report nor a plan was passed.
    """
    names: list[str | None] = [None] * len(runs)
    if len(runs) == 1 and isinstance(runs[0], Mapping):
        names, runs = [str(k) for k in runs[0]], tuple(runs[0].values())
    if not runs and plan is None:
        raise TypeError("compare_runs(): pass the run reports to compare (report = %%thunder_fsdp ...), or plan=")
    for r in runs:
        if not hasattr(r, "step_memory") or not hasattr(r, "ledgers"):
            raise TypeError(
                f"compare_runs(): {type(r).__name__} is not a run report; pass what a %%thunder_fsdp or "
                "%%thunder_ddp cell returned (or engine.run(...))"
            )
    if budget is None and plan is not None:
        budget = getattr(plan, "memory_per_rank", None)
    grouped: dict[Any, list[StrategyRow]] = {}
    picks: dict[Any, str] = {}
    for i, (report, name) in enumerate(zip(runs, names, strict=True)):
        workload = getattr(report, "workload", None)
        key = workload if workload is not None else ("unknown", i)  # an unknown workload is compared with nothing
        grouped.setdefault(key, []).append(_run_row(report, i, name))
    if plan is not None:
        for c in plan.candidates:
            key = plan.workload(c.world_size) if hasattr(plan, "workload") else ("plan", c.world_size)
            grouped.setdefault(key, []).append(_candidate_row(c))
            pick = plan.recommended_for(c.world_size)
            picks[key] = f"{pick.name} (plan)" if pick is not None else "none (nothing fits)"
    groups = [
        replace(_group(key, rows, budget, grouped), recommended=picks.get(key, "")) for key, rows in grouped.items()
    ]
    return StrategyTable(tuple(groups), budget)


def _group(key: Any, rows: list[StrategyRow], budget: int | None, grouped: Mapping[Any, Any]) -> StrategyGroup:
    workload = key if isinstance(key, Workload) else None
    rows = _explained([_with_fit(r, budget) for r in rows])
    rows.sort(key=lambda r: (r.fits is False, r.peak_bytes is None, r.peak_bytes or 0))
    alone = ""
    if len(rows) == 1:
        others = [k for k in grouped if isinstance(k, Workload) and k != workload]
        if workload is None:
            alone = "compared with no other run: its workload is not known (no module was traced in its cell)"
        elif not others:
            alone = "the only run of its workload"
        else:
            nearest = min(others, key=lambda k: len(workload.differences(k)))
            alone = f"compared with no other run: {'; '.join(nearest.differences(workload))}"
    return StrategyGroup(workload, tuple(rows), alone)


def _run_row(report: Any, index: int, name: str | None) -> StrategyRow:
    strategy = report.strategy.describe() if report.strategy is not None else "no strategy"
    name = name or report.name or f"run {index + 1}"
    peak = report.step_peak()
    if peak is not None:
        measured = peak[1]
        peak_bytes, parts, note, steps = measured.peak_bytes, measured.account, "", measured.steps
    else:
        notes = {m.note for m in report.step_memory.values() if m.note}
        peak_bytes, parts, note, steps = None, {}, "; ".join(sorted(notes)) or "no step was measured", ()
    timed = report.step_time()
    return StrategyRow(
        name=name,
        source="measured",
        strategy=strategy,
        ranks=report.world_size,
        peak_bytes=peak_bytes,
        parts=parts,
        sent_bytes=report.sent_per_step(),
        step_ms=None if timed is None else timed[0],
        note=note,
        across_hosts=_across_hosts(report),
        peak_steps=tuple(steps),
        timed_steps=() if timed is None else timed[1],
        timed_unprofiled=timed is not None and timed[2],
    )


def _across_hosts(report: Any) -> int | None:
    traffic = report.traffic() if hasattr(report, "traffic") else None
    return traffic.across_hosts if traffic is not None and traffic.hosts > 1 else None


def _candidate_row(c: Any) -> StrategyRow:
    return StrategyRow(
        name=f"{c.name} (plan)",
        source="planned",
        strategy=c.name,
        ranks=c.world_size,
        peak_bytes=c.peak_bytes,
        parts=c.memory.account,
        sent_bytes=c.comm_bytes,
        across_hosts=c.inter_host_bytes if c.inter_host_bytes or c.options.hybrid else None,
    )


def _with_fit(row: StrategyRow, budget: int | None) -> StrategyRow:
    if budget is None or row.peak_bytes is None:
        return row
    return replace(row, fits=row.peak_bytes <= budget)


def _explained(rows: Sequence[StrategyRow]) -> list[StrategyRow]:
    """Each row's sentence: what makes its peak larger than its group's leanest row's (the smallest peak; on a tie
    the measured row, then the first), and how its traffic compares. Exactly one row of a group is the leanest."""
    peaked = [r for r in rows if r.peak_bytes is not None]
    lean = min(peaked, key=lambda r: (r.peak_bytes or 0, r.source != "measured")) if len(peaked) > 1 else None
    out = []
    for row in rows:
        if row.peak_bytes is None or lean is None:
            out.append(replace(row, why=row.note))
        elif row is lean:
            out.append(replace(row, why=_leanest(row, [r for r in peaked if r is not row])))
        else:
            grew = {k: v - lean.parts.get(k, 0) for k, v in row.parts.items()}
            part, extra = max(grew.items(), key=lambda kv: kv[1], default=("", 0))
            # the part that grew most, by its own amount: other parts may have shrunk (ZERO3 saves less for backward
            # than ZERO2 and gathers more into temporaries), so it can exceed the whole's difference
            what = f"; the largest difference: {part} +{format_bytes(extra)}" if extra > 0 else ""
            more = format_bytes(row.peak_bytes - (lean.peak_bytes or 0))
            out.append(replace(row, why=f"{more} more per rank than {lean.name}{what}{_traffic(row, lean)}"))
    return out


def _leanest(row: StrategyRow, peers: Sequence[StrategyRow]) -> str:
    heavier = [p for p in peers if p.sent_bytes is not None and row.sent_bytes is not None]
    if not heavier:
        return "the leanest peak per rank"
    least = min(heavier, key=lambda p: p.sent_bytes or 0)
    return "the leanest peak per rank" + _traffic(row, least)


def _traffic(row: StrategyRow, other: StrategyRow) -> str:
    if row.across_hosts is not None and other.across_hosts and row.across_hosts != other.across_hosts:
        # across hosts the slow link decides: say what moved off it, or onto it
        ratio = row.across_hosts / other.across_hosts
        return f"; sends {ratio:.2f}x {other.name}'s bytes between hosts per step"
    if row.sent_bytes is None or other.sent_bytes is None or row.sent_bytes == other.sent_bytes:
        return ""
    if not other.sent_bytes:
        return f"; sends {format_bytes(row.sent_bytes)} per step where {other.name} sends nothing"
    ratio = row.sent_bytes / other.sent_bytes
    return f"; sends {ratio:.2f}x {other.name}'s bytes per step"
