"""The "which strategy?" table (``reports.strategy_table.StrategyTable``) as static HTML: per workload group, one
stacked bar per row on one scale with the budget line (the Memory view's bars and colours), then the table with each
row's sentence.

Reads the table by attribute: render imports neither the rank engine nor the strategies.
"""

from __future__ import annotations

from typing import Any

from thunderviz.render.markup import escape, table
from thunderviz.render.memory_view import MemoryBar, account_segments, bars_svg
from thunderviz.trace.units import format_bytes, steps_text

__all__ = ["STRATEGIES_ID", "strategy_table_html"]

#: The anchor of the table on a page (the demo page's contents link it).
STRATEGIES_ID = "which-strategy"

_HEADERS = [
    "run",
    "from",
    "strategy",
    "ranks",
    "peak per rank",
    "sent per step per rank",
    "sent per step per host to other hosts",
    "step",
    "fits",
    "why",
]


def _steps(steps: Any, how: str = "") -> str:
    said = ", ".join(x for x in (steps_text(steps), how) if x)
    return f" ({said})" if said else ""


def _group_html(group: Any, budget: int | None) -> str:
    bars = [
        MemoryBar(
            label=f"{r.name} x{r.ranks}",
            kind=r.source,
            segments=account_segments(r.parts) or (("total", r.peak_bytes),),
            fits=r.fits,
        )
        for r in group.rows
        if r.peak_bytes is not None
    ]
    rows = [
        [
            r.name,
            r.source,
            r.strategy,
            r.ranks,
            format_bytes(r.peak_bytes, unknown="not measured") + ("" if r.peak_bytes is None else _steps(r.peak_steps)),
            format_bytes(r.sent_bytes, unknown="-"),
            format_bytes(r.across_hosts, unknown="-"),
            "-"
            if r.step_ms is None
            else f"{r.step_ms:.1f} ms{_steps(r.timed_steps, 'unprofiled' if r.timed_unprofiled else 'profiled')}",
            "-" if r.fits is None else ("yes" if r.fits else "no"),
            r.why,
        ]
        for r in group.rows
    ]
    said = "; ".join(x for x in (group.alone, group.recommended and f"the plan recommends {group.recommended}") if x)
    alone = f" <span class='note'>{escape(said)}</span>" if said else ""
    return f"<h5>{escape(group.title)}{alone}</h5>{bars_svg(bars, budget)}{table(_HEADERS, rows)}"


def strategy_table_html(t: Any) -> str:
    """The table: per workload group, bars of every row with a peak, then one line per row (names from user cells are
    escaped)."""
    budget = t.budget
    said = escape(format_bytes(budget) if budget else "none")
    head = (
        f"<h4 id='{STRATEGIES_ID}'>Which strategy?</h4><p>Per-rank step peak (measured on the ranks, or planned),"
        " bytes each rank puts on the wire per step (ring algorithms), runs compared only with runs of the same"
        f" model, batch, optimizer and ranks; budget per rank: {said}.</p>"
    )
    groups = "".join(_group_html(g, budget) for g in t.groups)
    return f"<div class='thunderviz-strategies'>{head}{groups}</div>"
