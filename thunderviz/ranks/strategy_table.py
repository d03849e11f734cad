"""``thunderviz.compare_runs(...)``: the "which strategy?" table across runs, and the plan's candidates beside them.

Why one table: a user choosing a strategy ran ZERO2, ZERO3 and DDP in three cells and got three reports, each with
its own memory bars, ledger and timeline; the choice is made across them. Each row is one run (measured on its
ranks) or one plan candidate (predicted), with the same columns: peak per rank and what it is made of, bytes each
rank sends per step, the step time when a timeline measured it, whether it fits a budget, and one sentence of why
it differs from the leanest row. Numbers come from the reports and plans as they are: nothing is re-measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from thunderviz.parallel.plan import ring_bytes
from thunderviz.trace.units import format_bytes

__all__ = ["StrategyRow", "StrategyTable", "compare_runs"]

_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class StrategyRow:
    """One run or candidate. ``peak_bytes`` is the largest rank's step peak (None: nothing measured, ``note`` says
    why); ``parts`` splits it in the one memory account (``trace.memory.ACCOUNT``), measured for a run, predicted
    for a candidate; ``sent_bytes`` is
    what one rank sends per step with ring algorithms, the largest over the ranks; ``step_ms`` the median step of
    the slowest rank (None without a timeline); ``across_hosts`` what the busiest host sends to the others per step
    (None on one host, or when the hosts are unknown: ``ranks.traffic``)."""

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


@dataclass(frozen=True)
class StrategyTable:
    """The rows, leanest peak first among those that fit; shows itself as an HTML table in a notebook."""

    rows: tuple[StrategyRow, ...]
    budget: int | None = None

    def __str__(self) -> str:
        lines = [f"which strategy? (budget per rank: {format_bytes(self.budget) if self.budget else 'none'})"]
        for r in self.rows:
            peak = format_bytes(r.peak_bytes, unknown="not measured")
            sent = format_bytes(r.sent_bytes, unknown="?")
            step = "" if r.step_ms is None else f", step {r.step_ms:.1f} ms"
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
    every candidate of a ``thunderviz.plan(...)``.

    Args:
        runs: the reports to compare (at least one, or a plan); or one mapping of name -> report, whose names the
            rows take (a report's own ``--name`` otherwise, else "run N").
        plan: a ``Plan``; its candidates become rows marked "planned", and its budget is used unless ``budget`` is
            given.
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
    rows = [_run_row(r, i, name) for i, (r, name) in enumerate(zip(runs, names, strict=True))]
    if plan is not None:
        rows += [_candidate_row(c) for c in plan.candidates]
    rows = [_with_fit(r, budget) for r in rows]
    rows = _explained(rows)
    rows.sort(key=lambda r: (r.fits is False, r.peak_bytes is None, r.peak_bytes or 0))
    return StrategyTable(tuple(rows), budget)


def _run_row(report: Any, index: int, name: str | None) -> StrategyRow:
    strategy = report.strategy.describe() if report.strategy is not None else "no strategy"
    name = name or report.name or f"run {index + 1}"
    measured = {r: m for r, m in report.step_memory.items() if m.peak_bytes is not None}
    if measured:
        rank = max(sorted(measured), key=lambda r: measured[r].peak_bytes)  # ties: the lowest rank, every time
        peak, parts, note = measured[rank].peak_bytes, measured[rank].account, ""
    else:
        notes = {m.note for m in report.step_memory.values() if m.note}
        peak, parts, note = None, {}, "; ".join(sorted(notes)) or "no step was measured"
    return StrategyRow(
        name=name,
        source="measured",
        strategy=strategy,
        ranks=report.world_size,
        peak_bytes=peak,
        parts=parts,
        sent_bytes=sent_per_step(report.ledgers),
        step_ms=_step_ms(report),
        note=note,
        across_hosts=_across_hosts(report),
    )


def _across_hosts(report: Any) -> int | None:
    traffic = report.traffic() if hasattr(report, "traffic") else None
    return traffic.across_hosts if traffic is not None and traffic.hosts > 1 else None


def sent_per_step(ledgers: Mapping[str, Mapping[int, Any]]) -> int | None:
    """Bytes one rank sends in one step (every traced object's collectives, ring algorithms), the largest rank."""
    per_rank: dict[int, int] = {}
    for by_rank in ledgers.values():
        for rank, ledger in by_rank.items():
            for e in ledger.entries:
                if e.kind in _COLLECTIVES and e.bytes is not None:
                    per_rank[rank] = per_rank.get(rank, 0) + ring_bytes(e.kind, e.bytes, e.group_size or 1)
                else:
                    per_rank.setdefault(rank, 0)
    return max(per_rank.values()) if per_rank else None


def _step_ms(report: Any) -> float | None:
    timeline = getattr(report, "timeline_data", None)
    if timeline is None:
        return None
    us = timeline.analysis().step_time()
    return None if us is None else us / 1000.0


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
    """Each row's sentence: what makes its peak larger than the leanest comparable row's (same source), and how
    its traffic compares."""
    out = []
    for row in rows:
        peers = [r for r in rows if r.source == row.source and r.peak_bytes is not None and r is not row]
        if row.peak_bytes is None or not peers:
            out.append(replace(row, why=row.note))
            continue
        lean = min(peers, key=lambda r: r.peak_bytes or 0)
        if (lean.peak_bytes or 0) >= row.peak_bytes:
            out.append(replace(row, why=_leanest(row, peers)))
            continue
        grew = {k: v - lean.parts.get(k, 0) for k, v in row.parts.items()}
        part, extra = max(grew.items(), key=lambda kv: kv[1], default=("", 0))
        what = f", most of it {part} (+{format_bytes(extra)})" if extra > 0 else ""
        traffic = _traffic(row, lean)
        out.append(
            replace(
                row,
                why=f"{format_bytes(row.peak_bytes - (lean.peak_bytes or 0))} more per rank than {lean.name}"
                f"{what}{traffic}",
            )
        )
    return out


def _leanest(row: StrategyRow, peers: Sequence[StrategyRow]) -> str:
    heavier = [p for p in peers if p.sent_bytes is not None and row.sent_bytes is not None]
    if not heavier:
        return "the leanest peak per rank"
    least = min(heavier, key=lambda p: p.sent_bytes or 0)
    return "the leanest peak per rank" + _traffic(row, least)


def _traffic(row: StrategyRow, other: StrategyRow) -> str:
    if row.across_hosts is not None and other.across_hosts and row.across_hosts != other.across_hosts:
        # across hosts the slow link decides (issue 31): say what moved off it, or onto it
        ratio = row.across_hosts / other.across_hosts
        return f"; sends {ratio:.2f}x {other.name}'s bytes between hosts per step"
    if row.sent_bytes is None or other.sent_bytes is None or row.sent_bytes == other.sent_bytes:
        return ""
    if not other.sent_bytes:
        return f"; sends {format_bytes(row.sent_bytes)} per step where {other.name} sends nothing"
    ratio = row.sent_bytes / other.sent_bytes
    return f"; sends {ratio:.2f}x {other.name}'s bytes per step"
