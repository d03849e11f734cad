"""The Memory view as static HTML: stacked bars per candidate with the budget line, predicted next to measured,
saved-for-backward per group and per source line, thunder against eager.

Static (inline SVG, no script) so it reads the same in JupyterLab, nbconvert, GitHub and the offline report; the
trace widget draws the same bars live from the same data (``MemoryBar``, built here). Every bar, predicted or
measured, a plan's or a run's or ``compare_runs``'s, is drawn in the one account of ``trace.memory`` (``ACCOUNT``, in
that order, coloured by ``COLORS``): a ``MemoryBar`` refuses any other category, so a second scheme cannot come back.
Reads plans, candidates and reports by attribute: render imports neither the strategies nor the rank
engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from thunderviz.render.markup import escape, table
from thunderviz.trace.memory import ACCOUNT, COLORS, LEGEND, MemoryEstimate, StepMemory, compare
from thunderviz.trace.model import TraceSnapshot
from thunderviz.trace.saved import TRACE_SAVED, TRACE_SAVED_NOTE, SavedComparison, saved_by_group, saved_by_line
from thunderviz.trace.units import format_bytes, steps_text

__all__ = [
    "COLORS",
    "PEAK_NOTE",
    "MemoryBar",
    "account_segments",
    "bars_svg",
    "peak_note_html",
    "plan_bars",
    "plan_html",
    "plan_predicted",
    "plan_run_bars",
    "run_bars",
    "run_memory_html",
    "saved_comparison_html",
    "saved_html",
]

#: What "step peak" means wherever a report or view shows one: a definition, not news, so every view folds it
#: (``peak_note_html``); the predicted and the measured peak differ only in how they were obtained.
PEAK_NOTE = (
    "The most tensor bytes alive at once on a rank during one steady-state training step, in five parts:"
    " parameters, gradients, optimizer state, saved for backward, temporaries (communication buffers included:"
    " torch's MemTracker cannot tell them apart, so the plan counts them there too). Predicted: the plan's rehearsal;"
    " measured: MemTracker on CPU, CUDA's allocator statistics (the total only) on a GPU."
)

_DRAWN = frozenset((*ACCOUNT, "total"))


def peak_note_html() -> str:
    """``PEAK_NOTE`` folded under one line: 580 characters of definition had stood open under every report's table."""
    return (
        f"<details class='note'><summary>What \u201cstep peak\u201d means</summary><p>{escape(PEAK_NOTE)}</p></details>"
    )


@dataclass(frozen=True)
class MemoryBar:
    """One stacked bar: a candidate's predicted peak, or a rank's measured one, split into segments."""

    label: str
    kind: str  # "predicted", "measured" or "planned"
    segments: tuple[tuple[str, int], ...]
    fits: bool | None = None

    def __post_init__(self) -> None:
        unknown = [c for c, _ in self.segments if c not in _DRAWN]
        if unknown:
            raise ValueError(
                f"MemoryBar {self.label!r}: {unknown} are not categories of the memory account"
                f" ({', '.join(ACCOUNT)}, or 'total'); put the split in the account first (trace.memory.to_account)"
            )

    @property
    def total(self) -> int:
        return sum(n for _, n in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "kind": self.kind,
            "total": self.total,
            "fits": self.fits,
            "segments": [
                {"category": c, "bytes": n, "color": COLORS.get(c, "#999"), "legend": LEGEND.get(c, c)}
                for c, n in self.segments
            ],
        }


def account_segments(account: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """An account (``MemoryEstimate.account``, ``StepMemory.account``) as a bar's segments: the account's order,
    empty categories left out."""
    return tuple((k, int(account[k])) for k in (*ACCOUNT, "total") if account.get(k))


def plan_bars(plan: Any) -> list[MemoryBar]:
    """One predicted bar per candidate of a ``Plan`` (by attribute: ``candidates``, each with ``memory``)."""
    return [
        MemoryBar(f"{c.name} x{c.world_size}", "predicted", account_segments(c.memory.account), c.fits)
        for c in plan.candidates
    ]


def plan_predicted(plan: Any, prediction: Any) -> bool:
    """Whether a run's ``prediction`` is one of ``plan``'s candidates (the cell ran with ``--plan``): then its bars
    are drawn once, as the plan's, with the measured ranks under that candidate (``plan_run_bars``)."""
    return plan is not None and prediction is not None and any(c.memory == prediction for c in plan.candidates)


def plan_run_bars(plan: Any, measured: Mapping[int, StepMemory], ran_as: str = "") -> list[MemoryBar]:
    """Every candidate of a ``Plan`` (predicted; fits its budget or not), and each rank's measured peak right under
    the candidate called ``ran_as`` (``"fsdp-zero2-block x2"``, a run report's ``prediction_name``), on one scale:
    the plan's "will it fit" and how the run it recommended came out, in one picture. A measured bar fits when it is
    within the plan's budget. Ranks go last when no candidate is called ``ran_as``."""
    budget = getattr(plan, "memory_per_rank", None)
    ranks = [
        MemoryBar(
            f"\u2514 rank {rank}, measured",
            "measured",
            account_segments(m.account),
            None if budget is None else m.peak_bytes <= budget,
        )
        for rank, m in sorted(measured.items())
        if m.peak_bytes is not None
    ]
    bars = []
    for c in plan.candidates:
        label = f"{c.name} x{c.world_size}"
        bars.append(MemoryBar(label, "predicted", account_segments(c.memory.account), c.fits))
        if label == ran_as:
            bars += ranks
            ranks = []
    return bars + ranks


def run_bars(
    measured: Mapping[int, StepMemory], prediction: MemoryEstimate | None = None, name: str = "predicted"
) -> list[MemoryBar]:
    """The prediction and each rank's measured peak, side by side in the same account."""
    bars = []
    if prediction is not None:
        bars.append(MemoryBar(f"{name} (predicted)", "predicted", account_segments(prediction.account)))
    for rank, m in sorted(measured.items()):
        if m.peak_bytes is None:
            continue
        bars.append(MemoryBar(f"rank {rank} (measured, {m.source})", "measured", account_segments(m.account)))
    return bars


#: pixels kept right of the plot for a bar's total
_VALUE_ROOM = 76


def _text_px(text: str) -> float:
    """Width of ``text`` at the bars' 11 px sans-serif, generously (6.4 px a character: digits and lower case are
    narrower)."""
    return 6.4 * len(text)


def _value_x(bar_end: float, text: str, budget_x: float | None) -> float:
    """Where a bar's total starts: just right of the bar, or just right of the budget line when the line would
    run through it (a bar ending a little short of the budget read "1.0 MiB" struck through)."""
    x = bar_end + 4
    if budget_x is not None and x - _LINE_CLEARANCE < budget_x < x + _text_px(text) + _LINE_CLEARANCE:
        x = budget_x + _LINE_CLEARANCE + 1
    return x


#: pixels kept clear between the budget line (2 px wide) and a value label
_LINE_CLEARANCE = 3


def bars_svg(bars: Sequence[MemoryBar], budget: int | None = None, *, width: int = 640) -> str:
    """Horizontal stacked bars on one scale, the budget as a vertical line, a legend of the categories shown."""
    if not bars:
        return ""
    label_w, bar_h, gap, top = 190, 18, 8, 22
    scale_max = max([b.total for b in bars] + [budget or 0]) or 1
    # room right of the longest bar for its total ("1023.9 MiB": ~62 px at 11 px): a 20 px margin cut "849.1 KiB"
    # to "849"
    plot_w = width - label_w - _VALUE_ROOM
    bx = label_w + budget / scale_max * plot_w if budget else None
    height = top + len(bars) * (bar_h + gap) + 30
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='tv-memory-bars' width='{width}' height='{height}'"
        f" viewBox='0 0 {width} {height}' font-family='sans-serif' font-size='11'>"
    ]
    for i, bar in enumerate(bars):
        y = top + i * (bar_h + gap)
        mark = "" if bar.fits is None else (" \u2713" if bar.fits else " \u2717")
        parts.append(f"<text x='0' y='{y + 13}'>{escape(bar.label + mark)}</text>")
        x = float(label_w)
        for category, n in bar.segments:
            w = n / scale_max * plot_w
            parts.append(
                f"<rect class='tv-memseg' data-category='{escape(category)}' x='{x:.1f}' y='{y}' width='{w:.1f}'"
                f" height='{bar_h}' fill='{COLORS.get(category, '#999')}'><title>{escape(category)}:"
                f" {escape(format_bytes(n))}</title></rect>"
            )
            x += w
        value = format_bytes(bar.total)
        parts.append(f"<text x='{_value_x(x, value, bx):.1f}' y='{y + 13}'>{escape(value)}</text>")
    if budget and bx is not None:
        said = f"budget {format_bytes(budget)}"
        y1 = top + len(bars) * (bar_h + gap)
        parts.append(
            f"<line class='tv-budget' x1='{bx:.1f}' x2='{bx:.1f}' y1='{top - 6}' y2='{y1}' stroke='#b3261e'"
            f" stroke-width='2' stroke-dasharray='4 3'/>"
            # right of the line, or left of it where the text would run off the picture ("budget 1")
            + (
                f"<text x='{bx + 3:.1f}' y='{top - 8}' fill='#b3261e'>{escape(said)}</text>"
                if bx + 3 + _text_px(said) <= width
                else f"<text x='{bx - 3:.1f}' y='{top - 8}' fill='#b3261e' text-anchor='end'>{escape(said)}</text>"
            )
        )
    used = {c for b in bars for c, _ in b.segments}
    shown = [c for c in (*ACCOUNT, "total") if c in used]
    lx, ly = 0, height - 10
    for category in shown:
        parts.append(f"<rect x='{lx}' y='{ly - 9}' width='10' height='10' fill='{COLORS.get(category, '#999')}'/>")
        said = LEGEND.get(category, category)
        parts.append(f"<text x='{lx + 13}' y='{ly}'>{escape(said)}</text>")
        lx += 18 + 6 * len(said)
    parts.append("</svg>")
    return "".join(parts)


def plan_html(plan: Any) -> str:
    """A ``Plan`` as a page fragment: the bars, then the numbers (recommended candidate marked)."""
    pick = plan.recommended
    budget = plan.memory_per_rank
    head = (
        f"<h4>Memory plan: {escape(plan.model)} on {escape(plan.device)}</h4><p>Per-rank peak of one steady-state"
        f" step, predicted ({escape(plan.how)}); budget per rank: {escape(format_bytes(budget) if budget else 'none')};"
        f" recommended: <b>{escape(f'{pick.name} x{pick.world_size}' if pick else 'none fits')}</b>.</p>"
    )
    rows = [
        [
            ("\u2192 " if c is pick else "") + c.name,
            c.world_size,
            format_bytes(c.peak_bytes),
            "yes" if c.fits else "no",
            c.memory.phase,
            format_bytes(c.comm_bytes),
            c.collectives,
            f"{c.comm_seconds * 1000:.1f} ms",
        ]
        for c in plan.candidates
    ]
    headers = [
        "candidate",
        "ranks",
        "peak per rank",
        "fits",
        "peak during",
        "sent per step",
        "collectives",
        "communicating",
    ]
    return f"<div class='thunderviz-plan'>{head}{bars_svg(plan_bars(plan), budget)}{table(headers, rows)}</div>"


def run_memory_html(
    measured: Mapping[int, StepMemory],
    rss: Mapping[int, Mapping[str, Any]] | None = None,
    prediction: MemoryEstimate | None = None,
    prediction_name: str = "",
    plan: Any = None,
) -> str:
    """A run report's memory section: each rank's measured step peak (torch's accounting), the prediction next to
    it with the groups that differ by more than 10%, and the process RSS last (not tensor memory).

    With the ``plan`` the prediction came from (``--plan``), the bars are the plan's: every candidate against its
    budget line, the ones that do not fit included, with this run's ranks under the candidate it ran as."""
    if not measured and not rss and plan is None:
        return ""
    ranks = sorted(set(measured) | set(rss or {}))
    # why nothing was measured is usually the same sentence on every rank: said once under the table, not per row
    notes = {m.note for m in measured.values() if not m.measured and m.note}
    shared = next(iter(notes)) if len(notes) == 1 and all(not m.measured for m in measured.values()) else ""
    rows = []
    for r in ranks:
        m = measured.get(r)
        peak = format_bytes(m.peak_bytes, unknown="-") if m is not None else "-"
        unmeasured = "see below" if shared else (m.note if m is not None else "")
        source = _measured_with(m) if m is not None and m.measured else unmeasured
        cmp = compare(prediction, m) if prediction is not None and m is not None else None
        rows.append(
            [
                str(r),
                peak,
                source,
                format_bytes(prediction.peak_bytes) if prediction is not None else "-",
                cmp.summary() if cmp is not None else "",
                format_bytes((rss or {}).get(r, {}).get("rss_bytes"), unknown="-"),
            ]
        )
    what = f" against the plan's {escape(prediction_name)}" if prediction is not None else ""
    headers = [
        "rank",
        "step peak, measured",
        "measured with",
        "step peak, predicted",
        "predicted vs measured",
        "process RSS (not tensor memory)",
    ]
    if plan is not None:
        bars = _plan_head(plan, prediction_name) + bars_svg(
            plan_run_bars(plan, measured, prediction_name), plan.memory_per_rank
        )
    else:
        bars = bars_svg(run_bars(measured, prediction, prediction_name or "predicted"))
    note = f"<p class='note'>Every rank: {escape(shared)}</p>" if shared else ""
    return f"<h4>Memory per rank{what}</h4>{bars}{table(headers, rows)}{note}{peak_note_html()}"


def _measured_with(m: StepMemory) -> str:
    """``memtracker, steps 6-7``: how a rank's peak was measured and on which steps of the cell."""
    steps = steps_text(m.steps)
    return f"{m.source or '-'}, {steps}" if steps else (m.source or "-")


def _plan_head(plan: Any, ran_as: str) -> str:
    """What the plan's bars in a run report show, in one sentence."""
    pick = plan.recommended
    budget = plan.memory_per_rank
    misfits = [f"{c.name} x{c.world_size}" for c in plan.candidates if not c.fits]
    over = f" ({', '.join(misfits)} over it)" if misfits else ""
    return (
        f"<p>The plan for {escape(plan.model)}: each candidate's predicted peak per rank against the budget of"
        f" {escape(format_bytes(budget) if budget else 'none')}{escape(over)}, recommended"
        f" <b>{escape(f'{pick.name} x{pick.world_size}' if pick else 'none (nothing fits)')}</b>; this run's ranks,"
        f" measured, under {escape(ran_as or 'the candidates')}.</p>"
    )


def saved_html(forward: TraceSnapshot, *, top: int = 12) -> str:
    """What forward saves for backward, per collapsed-graph group and per source line (largest first)."""
    if not forward.saved_for_backward:
        return ""
    groups = [[r.key, r.tensors, format_bytes(r.bytes)] for r in saved_by_group(forward)[:top]]
    lines = [[r.key, r.code, r.tensors, format_bytes(r.bytes)] for r in saved_by_line(forward)[:top]]
    return (
        f"<h4>{escape(TRACE_SAVED[:1].upper() + TRACE_SAVED[1:])}</h4><p class='note'>{escape(TRACE_SAVED_NOTE)}</p>"
        + table(["group", "tensors", "bytes"], groups)
        + table(["source line", "code", "tensors", "bytes"], lines)
    )


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_bytes(abs(n))


def saved_comparison_html(comparison: SavedComparison, *, top: int = 12) -> str:
    """Thunder against eager PyTorch, line by line: where thunder saves more first."""
    rows = [
        [c.line, c.code, format_bytes(c.thunder_bytes), format_bytes(c.eager_bytes), _signed(c.extra)]
        for c in comparison.lines[:top]
    ]
    return f"<h4>Saved tensors: thunder vs eager</h4><p>{escape(comparison.summary())}</p>" + table(
        ["source line", "code", "thunder", "eager", "thunder extra"], rows
    )
