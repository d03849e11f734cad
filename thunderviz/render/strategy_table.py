"""The "which strategy?" table (``ranks.strategy_table.StrategyTable``) as static HTML: one stacked bar per row on
one scale with the budget line (the Memory view's bars and colours), then the table with each row's sentence.

Reads the table by attribute: render imports neither the rank engine nor the strategies.
"""

from __future__ import annotations

from typing import Any

from thunderviz.render.markup import escape, table
from thunderviz.render.memory_view import MemoryBar, account_segments, bars_svg
from thunderviz.trace.units import format_bytes

__all__ = ["strategy_table_html"]


def strategy_table_html(t: Any) -> str:
    """The table: bars of every row with a peak, then one line per row (names from user cells are escaped)."""
    budget = t.budget
    bars = [
        MemoryBar(
            label=f"{r.name} x{r.ranks}",
            kind=r.source,
            segments=account_segments(r.parts) or (("total", r.peak_bytes),),
            fits=r.fits,
        )
        for r in t.rows
        if r.peak_bytes is not None
    ]
    rows = [
        [
            r.name,
            r.source,
            r.strategy,
            r.ranks,
            format_bytes(r.peak_bytes, unknown="not measured"),
            format_bytes(r.sent_bytes, unknown="-"),
            format_bytes(r.across_hosts, unknown="-"),
            "-" if r.step_ms is None else f"{r.step_ms:.1f} ms",
            "-" if r.fits is None else ("yes" if r.fits else "no"),
            r.why,
        ]
        for r in t.rows
    ]
    headers = [
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
    head = (
        "<h4>Which strategy?</h4><p>Per-rank step peak (measured on the ranks, or planned), bytes each rank sends"
        f" per step; budget per rank: {escape(format_bytes(budget) if budget else 'none')}.</p>"
    )
    return f"<div class='thunderviz-strategies'>{head}{bars_svg(bars, budget)}{table(headers, rows)}</div>"
