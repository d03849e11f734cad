"""HTML for the rank engine's ``RunReport`` (what one notebook cell did on every rank), and a page of several.

Static HTML on purpose: the report must read the same in JupyterLab, in nbconvert output and on GitHub, none of
which run our JavaScript. The report object (``thunderviz.reports.run_report.RunReport``) keeps the data; this module
draws it, reusing the trace report (``render.html``) for the traces and ``render.markup`` for every table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from thunderviz.render.html import Report
from thunderviz.render.markup import decisions_table, escape, page
from thunderviz.render.memory_view import run_memory_html
from thunderviz.render.style import PAGE_CSS, wrap
from thunderviz.render.timeline_svg import timeline_html
from thunderviz.trace.memory import largest_peak
from thunderviz.trace.units import steps_text

if TYPE_CHECKING:  # read by attribute; render imports neither the decision table nor the rank protocol
    from thunderviz.cell.protocol import MemoryReading, StrategySpec
    from thunderviz.parallel.decisions import Decision
    from thunderviz.trace.memory import MemoryEstimate, StepMemory

__all__ = ["RunReportLike", "cell_seconds", "reports_page", "run_report_html", "run_report_title"]


class RunReportLike(Protocol):
    """The fields of ``RunReport`` this module reads (a Protocol, so render never imports the rank engine)."""

    name: str
    world_size: int
    backend: str
    strategy: StrategySpec | None
    seconds: float
    decisions: list[Decision]
    bundles_by_rank: dict[int, dict[str, Any]]
    ledgers: dict[str, dict[int, Any]]
    memory: dict[int, MemoryReading]
    step_memory: dict[int, StepMemory]
    prediction: MemoryEstimate | None
    prediction_name: str
    problems: list[str]
    timeline_requested: bool
    timeline_data: Any


def run_report_title(report: RunReportLike) -> str:
    """``zero2: thunder_fsdp (FSDP ZERO2 BLOCK) on 2 ranks, gloo: 3.20 s`` (the cell's name first, when it has one),
    and what starting the pool cost before that: ``13.61 s on the ranks + 6.50 s starting the pool``."""
    what = report.strategy.describe() if report.strategy is not None else "no strategy"
    name = f"{report.name}: " if getattr(report, "name", "") else ""
    return f"{name}{what} on {report.world_size} ranks, {report.backend}: {cell_seconds(report)}"


#: a pool start shorter than this is not mentioned (a warm pool's bookkeeping)
_START_SAID_FROM_S = 0.05


def cell_seconds(report: Any) -> str:
    """What a cell's time was spent on, as the report's header and the notebook's status chips both say it:
    ``3.20 s`` when the pool was ready, else ``13.61 s on the ranks + 6.50 s starting the pool``."""
    start = float(getattr(report, "start_seconds", 0.0) or 0.0)
    if start < _START_SAID_FROM_S:
        return f"{report.seconds:.2f} s"
    return f"{report.seconds:.2f} s on the ranks + {start:.2f} s starting the pool"


def run_report_html(report: RunReportLike, *, standalone: bool = True) -> str:
    """The report as self-contained HTML (no scripts, no network): a page when ``standalone``, else a fragment
    (inside our root element with the scoped stylesheet: nothing it styles leaks into the notebook)."""
    body = _report_body(report)
    if standalone:
        return page("thunderviz report", wrap(body, style=False), style=PAGE_CSS)
    return wrap(body)


def _report_body(report: RunReportLike) -> str:
    parts = [f"<h3>{escape(run_report_title(report))}</h3>"]
    story = getattr(report, "compile_story", "")
    if story:  # a re-run cell reuses thunder's interpreted trace: say so, and what it cost when it did not
        parts.append(f"<p class='compile'>compile: {escape(story)}</p>")
    traffic = report.traffic() if hasattr(report, "traffic") else None
    if traffic is not None and traffic.hosts > 1:  # the slow link's share: what hybrid sharding keeps off it
        parts.append(f"<p class='traffic'>communication: {escape(traffic.describe())}</p>")
    traces = _traces_html(report.bundles_by_rank, report.ledgers, report.decisions)
    if traces is None or not report.bundles_by_rank:
        parts.append(_decisions_html(report.decisions))  # otherwise the trace report carries the decisions
    parts.append(
        run_memory_html(
            getattr(report, "step_memory", {}),
            report.memory,
            getattr(report, "prediction", None),
            getattr(report, "prediction_name", ""),
            getattr(report, "plan", None),
        )
    )
    parts.append(traces or "")
    if report.timeline_requested:
        parts.append(_observed_html(report) + _timeline_html(report.timeline_data))
    if report.problems:
        items = "".join(f"<li><pre>{escape(p)}</pre></li>" for p in report.problems)
        parts.append(f"<h4>Not shown</h4><ul>{items}</ul>")
    return "\n".join(parts)


def reports_page(
    reports: Mapping[str, RunReportLike],
    *,
    title: str,
    heading: str | None = None,
    summary: str = "",
    summary_links: Sequence[tuple[str, str]] = (),
) -> str:
    """One page with each named report as a section (no script, no network), e.g. every report of a notebook: a
    table of contents first (a notebook's reports make a long page), then ``summary`` (HTML, e.g. the "which
    strategy?" table), then the sections. ``summary_links``: ``(anchor id, title)`` of the summary's parts, listed in
    the contents before the reports."""
    sections = [
        f"<section id='run-{i}'><h2>{escape(name)}</h2>{_report_body(r)}</section>"
        for i, (name, r) in enumerate(reports.items())
    ]
    toc = "".join(f"<li><a href='#{escape(anchor)}'>{escape(said)}</a></li>" for anchor, said in summary_links)
    toc += "".join(
        f"<li><a href='#run-{i}'>{escape(name)}</a> <span class='note'>{escape(_toc_line(r))}</span></li>"
        for i, (name, r) in enumerate(reports.items())
    )
    head = f"<nav><h2>Contents</h2><ol>{toc}</ol></nav>{summary}" if reports else summary
    return page(title, wrap(head + "\n".join(sections), style=False), heading=heading, style=PAGE_CSS)


def _toc_line(report: RunReportLike) -> str:
    """What a report's section holds, in a few words: the strategy and the number of ranks."""
    strategy = report.strategy.describe() if report.strategy is not None else "no strategy"
    plan = getattr(report, "plan", None)
    if plan is None:
        return f"{strategy} on {report.world_size} ranks"
    over = sum(1 for c in plan.candidates if not c.fits)
    return (
        f"{strategy} on {report.world_size} ranks, with its plan: {len(plan.candidates)} candidates against the"
        f" budget, {over} over it"
    )


def _observed_html(report: RunReportLike) -> str:
    """Which steps each measuring view observed, and the run's step time: the profiler and the memory meter never
    share a step (``rank.memory``), and a report that does not say which steps it read invites comparing
    numbers taken on different ones."""
    timed = report.step_time() if hasattr(report, "step_time") else None
    peak = largest_peak(report.step_memory)
    said = []
    drawn = steps_text(getattr(report.timeline_data, "steps", ()))
    if timed is not None:
        how = (
            "timed with the profiler stopped"
            if timed[2]
            else "as recorded by torch.profiler, whose per-op cost is in them (run more steps to time some unprofiled)"
        )
        said.append(f"step time {timed[0]:.1f} ms, the median over {steps_text(timed[1])} of the slowest rank, {how}")
    if drawn:
        said.append(f"the timeline draws {drawn}, recorded with torch.profiler (step 1 compiles)")
    if peak is not None and peak[1].steps:
        said.append(f"memory measured on {steps_text(peak[1].steps)} (torch's MemTracker), a step no other view times")
    return f"<p class='observed'>{escape('; '.join(said))}.</p>" if said else ""


def _timeline_html(timeline: Any) -> str:
    """The measured timeline (``--timeline``): SVG, analysis summary, per-rank breakdown (``render.timeline_svg``)."""
    if timeline is None:
        return "<h4>Timeline</h4><p>No rank returned a timeline; the problems below say why.</p>"
    return timeline_html(timeline)


def _decisions_html(decisions: Sequence[Decision]) -> str:
    if not decisions:
        return "<h4>Decisions</h4><p>No decisions were recorded (no object went through a thunderviz strategy).</p>"
    return "<h4>Decisions</h4>" + decisions_table(decisions)


def _traces_html(
    bundles_by_rank: Mapping[int, Mapping[str, Any]], ledgers: Mapping[str, Any], decisions: Sequence[Decision]
) -> str | None:
    """The trace section from ``render.html`` (graphs, per-rank ledgers, mismatches flagged)."""
    if not bundles_by_rank:
        if ledgers:
            return None
        return "<h4>Traces</h4><p>No thunder-compiled object ran in this cell.</p>"
    bundles = [b for rank in sorted(bundles_by_rank) for b in bundles_by_rank[rank].values()]
    # Static (SVG or DOT text, no script): it survives nbconvert/GitHub; the caller wraps it with the stylesheet.
    return Report(bundles, decisions=decisions or None, title="traces").body()
