"""A static SVG picture of a ``Timeline``: one lane per rank, for nbconvert, GitHub and the offline HTML report.

No script: each rank's lane has three labelled rows (steps and their forward/backward/optimizer regions; the main
thread, with the time it was blocked by a collective; the backend's communication work), step markers, a
millisecond axis (a common one for several runs with ``span_us``), and a ``<title>`` on every collective wide
enough to point at, so a hover names it. Blocked time that outlasts the collective's work (the backend finished,
the waiting thread had not yet run again: ranks sharing CPUs) is drawn apart, hatched, and said so.
Collectives use the colours of the trace graph (``render.graph_nodes``: collectives orange, waits yellow, module
blocks blue), so a collective looks the same in both pictures. Every name from user code is escaped.

Busy time on the main thread is drawn as merged intervals at the picture's resolution (a 20-step GPT timeline
has ~100k ops; the picture needs a few hundred rectangles to show where the thread was busy).
"""

from __future__ import annotations

import hashlib
import html
import re
from typing import Any

from thunderviz.render.markup import counted
from thunderviz.timeline.analysis import STRAGGLER_RULE, TimelineAnalysis, close_gaps, idle_intervals, union
from thunderviz.timeline.model import CollectiveEvent, RankTimeline, Timeline
from thunderviz.trace.units import format_us

__all__ = [
    "COLOURS",
    "ROW_LABELS",
    "common_span_us",
    "graph_colours",
    "group_colour",
    "split_blocked",
    "timeline_html",
    "timeline_svg",
]


def graph_colours() -> dict[str, str]:
    """Fill and border colours of the trace graph's node styles, read from ``render.graph_nodes`` (one source)."""
    from thunderviz.render import graph_nodes

    def pick(style: str, key: str, default: str) -> str:
        m = re.search(rf'(?<![a-z]){key}="(#[0-9a-fA-F]{{6}})"', style)
        return m.group(1) if m else default

    coll = getattr(graph_nodes, "_COLLECTIVE_STYLE", "")
    wait = getattr(graph_nodes, "_WAIT_STYLE", "")
    group = getattr(graph_nodes, "_GROUP_STYLE", "")
    op = getattr(graph_nodes, "_OP_STYLE", "")
    return {
        "collective": pick(coll, "fillcolor", "#f4a261"),
        "collective_border": pick(coll, "color", "#9c4a00"),
        "wait": pick(wait, "fillcolor", "#ffe08a"),
        "wait_border": pick(wait, "color", "#8a6d00"),
        "group": pick(group, "fillcolor", "#dbe9f6"),
        "group_border": pick(group, "color", "#3d6e9e"),
        "op": pick(op, "color", "#8aa1b8"),
    }


#: Colours of the timeline views (SVG and widget): the graph's, plus one per region kind (three hues a person tells
#: apart at a glance: blue, purple, green).
COLOURS: dict[str, str] = {
    **graph_colours(),
    "forward": "#90caf9",
    "backward": "#b39ddb",
    "optimizer": "#a5d6a7",
    "after_work": "#fff8dc",
    "step": "#5b6b7c",
    "idle": "#eef1f4",
    "idle_dot": "#8a96a3",
    "highlight": "#7b2cbf",
    "text": "#1d2733",
    "muted": "#5b6b7c",
}


def group_colour(name: str) -> str:
    """A pastel per module group, the same wherever the group appears (every rank, a redraw, two runs compared).

    Numbered siblings (``blocks.0``, ``blocks.1``, ...) share a base hue from their stem and step a golden angle
    (137.5 degrees) apart, so neighbouring blocks never look alike: a run once drew ``blocks.0``-``blocks.3`` in one
    colour when the hue came from a hash of the whole name (names one character apart, hues one degree apart).
    """
    m = re.match(r"^(.*?)(\d+)$", name)
    stem, n = (m.group(1), int(m.group(2))) if m else (name, 0)
    base = int.from_bytes(hashlib.blake2s(stem.encode(), digest_size=4).digest(), "big") % 360
    return f"hsl({(base + n * 137.508) % 360:.0f}, 60%, 76%)"


_LABEL_W = 150
_ROW_H = 20
_RANK_H = 3 * _ROW_H + 6  # three rows and a margin
_GAP = 14
_TOP = 34  # the axis, then the step labels
#: The rows of a lane, top to bottom, as their labels read.
ROW_LABELS = ("steps", "main thread", "collectives")


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def timeline_svg(timeline: Timeline, *, width: int = 1200, t0: float | None = None, t1: float | None = None) -> str:
    """SVG text for ``timeline`` between ``t0`` and ``t1`` microseconds (default: all recorded steps; pass the same
    ``t1`` to several runs, e.g. ``common_span_us``, to draw them on one scale)."""
    lo = 0.0 if t0 is None else t0
    hi = (timeline.duration or 1.0) if t1 is None else t1
    height = _TOP + len(timeline.ranks) * (_RANK_H + _GAP) + 6
    plot = _Plot(lo, hi, width - _LABEL_W - 10)
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="thunderviz-timeline" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">'
        ),
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        _HATCH,
    ]
    parts += _axis(plot, height)
    parts += _step_markers(plot, timeline, height)
    y = float(_TOP)
    first_rank = min(timeline.ranks, default=0)
    for rank, t in sorted(timeline.ranks.items()):
        parts += _rank_lane(plot, rank, t, y, first=rank == first_rank)
        y += _RANK_H + _GAP
    parts.append("</svg>")
    return "".join(p for p in parts if p)


def common_span_us(*timelines: Timeline) -> float:
    """The longest of ``timelines``: draw each with ``t1=`` this (``timeline_html(span_us=...)``) to compare runs on
    one scale."""
    return max((t.duration for t in timelines), default=0.0) or 1.0


_HATCH = (
    '<defs><pattern id="tv-after-work" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff8dc"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#c9a400" stroke-width="2"/></pattern>'
    f'<pattern id="tv-idle" width="5" height="5" patternUnits="userSpaceOnUse"><rect width="5" height="5" '
    f'fill="{COLOURS["idle"]}"/><circle cx="2.5" cy="2.5" r="0.9" fill="{COLOURS["idle_dot"]}"/></pattern></defs>'
)


#: About the widest a character of a step label draws (12 px bold): whether "step 12" fits before the next step.
_STEP_CHAR_PX = 7.5


class _Plot:
    """The time axis of one picture: microseconds ``lo..hi`` drawn over ``plot_w`` pixels right of the labels."""

    def __init__(self, lo: float, hi: float, plot_w: int) -> None:
        self.lo, self.hi, self.plot_w = lo, hi, plot_w
        self.span = max(hi - lo, 1e-9)
        self.res = self.span / plot_w  # microseconds per pixel

    def x(self, t: float) -> float:
        return _LABEL_W + (min(max(t, self.lo), self.hi) - self.lo) / self.span * self.plot_w

    def rect(
        self, a: float, b: float, y: float, h: float, fill: str, stroke: str = "none", title: str = "", extra: str = ""
    ) -> str:
        """A rectangle for ``a..b`` (at least 0.6 px wide, so nothing vanishes); ``""`` when it is out of view."""
        if b < self.lo or a > self.hi:
            return ""
        xa, xb = self.x(a), self.x(b)
        w = max(xb - xa, 0.6)
        t = f"<title>{_e(title)}</title>" if title else ""
        return (
            f'<rect x="{xa:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="0.5"{extra}>{t}</rect>'
        )


# ------------------------------------------------------------------------------------------------------- axis


def _axis(plot: _Plot, height: int) -> list[str]:
    """A grid line and a millisecond label every ``_nice_step``."""
    parts = []
    step_ms = _nice_step(plot.span / 1000 / 10)
    tick = (plot.lo // (step_ms * 1000) + 1) * step_ms * 1000 if plot.lo > 0 else 0.0
    while tick <= plot.hi:
        xt = plot.x(tick)
        parts.append(f'<line x1="{xt:.1f}" y1="16" x2="{xt:.1f}" y2="{height - 4}" stroke="#e3e8ee" stroke-width="1"/>')
        parts.append(
            f'<text x="{xt:.1f}" y="13" text-anchor="middle" fill="{COLOURS["muted"]}">{tick / 1000:g} ms</text>'
        )
        tick += step_ms * 1000
    return parts


def _step_markers(plot: _Plot, timeline: Timeline, height: int) -> list[str]:
    """A dashed line where each step begins (on the first rank's clock, the common one) and its number."""
    ranks = sorted(timeline.ranks)
    if not ranks:
        return []
    parts = []
    shown = [s for s in timeline.ranks[ranks[0]].steps if plot.lo <= s.start <= plot.hi]
    for i, s in enumerate(shown):
        xs = plot.x(s.start)
        parts.append(
            f'<line class="step-marker" x1="{xs:.1f}" y1="18" x2="{xs:.1f}" y2="{height - 4}" '
            f'stroke="{COLOURS["step"]}" stroke-width="1" stroke-dasharray="4 3"><title>step {s.step}</title></line>'
        )
        # as the widget does: "step 5" where it fits before the next step, else "5", else the marker's tooltip alone
        room = (plot.x(shown[i + 1].start) if i + 1 < len(shown) else plot.x(plot.hi)) - xs - 6
        label = next((t for t in (f"step {s.step}", str(s.step)) if len(t) * _STEP_CHAR_PX <= room), None)
        if label:
            parts.append(f'<text x="{xs + 3:.1f}" y="29" font-weight="bold" fill="{COLOURS["text"]}">{label}</text>')
    return parts


# ------------------------------------------------------------------------------------------------- rank lanes


def _rank_lane(plot: _Plot, rank: int, t: RankTimeline, y: float, *, first: bool) -> list[str]:
    """One rank's ``<g>``: its label (and clock bound, except on the first rank, whose clock the others are
    aligned to) and each row's name, then its three rows."""
    c = COLOURS
    unc = t.clock.uncertainty
    clock = "" if first else f"\u00b1{format_us(unc)}" if unc != float("inf") else "clock ?"
    parts = [f'<g class="rank" data-rank="{rank}">']
    parts.append(
        f'<text x="4" y="{y + 14:.1f}" font-weight="bold" font-size="13" fill="{c["text"]}">rank {rank}</text>'
    )
    if clock:  # the clock bound under the name, short: the row labels fill the rest of the label column
        parts.append(
            f'<text x="4" y="{y + _ROW_H + 14:.1f}" font-size="11" fill="{c["muted"]}"><title>clock bound</title>'
            f"{_e(clock)}</text>"
        )
    for i, label in enumerate(ROW_LABELS):
        parts.append(
            f'<text class="row-label" x="{_LABEL_W - 6}" y="{y + i * _ROW_H + 14:.1f}" text-anchor="end" '
            f'font-size="11" fill="{c["muted"]}">{label}</text>'
        )
    parts += _region_row(plot, rank, t, y)
    parts += _main_thread_row(plot, rank, t, y + _ROW_H)
    parts += _communication_row(plot, rank, t, y + 2 * _ROW_H)
    parts.append("</g>")
    return parts


def _region_row(plot: _Plot, rank: int, t: RankTimeline, y: float) -> list[str]:
    """The step outlines (over the whole lane) and the forward/backward/optimizer regions."""
    c = COLOURS
    parts = [
        plot.rect(
            s.start, s.end, y, _RANK_H - 6, "none", c["step"], f"rank {rank} step {s.step}: {format_us(s.duration)}"
        )
        for s in t.steps
    ]
    for r in t.regions:
        title = f"rank {rank} step {r.step} {r.kind}{' ' + r.name if r.name else ''}: {format_us(r.duration)}"
        parts.append(plot.rect(r.start, r.end, y + 1, _ROW_H - 2, c.get(r.kind, c["group"]), c["group_border"], title))
    return parts


def _main_thread_row(plot: _Plot, rank: int, t: RankTimeline, row: float) -> list[str]:
    """The main thread: busy (merged at this resolution), collective blocking on top."""
    c = COLOURS
    busy = close_gaps(union(t.ops.intervals(0)), plot.res)
    parts = [plot.rect(a, b, row + 2, _ROW_H - 4, c["op"]) for a, b in busy]
    for a, b in idle_intervals(t):
        if b - a >= 2 * plot.res:  # a pause wide enough to see, drawn as idle rather than left blank
            title = (
                f"rank {rank} idle {format_us(b - a)}: no op ran and no collective blocked it (a sleep, data "
                "loading, Python)"
            )
            parts.append(plot.rect(a, b, row + 2, _ROW_H - 4, "url(#tv-idle)", c["idle_dot"], title, ' class="idle"'))
    for col in t.collectives:
        for a, b, after in split_blocked(col):
            if b - a < plot.res / 2:
                continue
            if after:
                title = (
                    f"rank {rank} still blocked {format_us(b - a)} after {col.label} (step {col.step}) finished its"
                    " work: "
                    "the backend completing, or the waiting thread not yet running again (ranks sharing CPUs)"
                )
                parts.append(plot.rect(a, b, row + 1, _ROW_H - 2, "url(#tv-after-work)", c["wait_border"], title))
            else:
                title = f"rank {rank} blocked by {col.label} (step {col.step}): {format_us(b - a)}"
                parts.append(plot.rect(a, b, row + 1, _ROW_H - 2, c["wait"], c["wait_border"], title))
    return parts


def split_blocked(col: CollectiveEvent) -> list[tuple[float, float, bool]]:
    """The collective's blocked intervals cut where its work ended: ``(start, end, after_work)``. Why: a wait can
    return long after the backend finished (the waiting thread must run again, and ranks sharing cores wait for
    one), and a yellow bar running past its collective read as a collective that took longer than it did."""
    out = []
    for a, b in col.blocked_intervals():
        cut = col.end if col.end is not None and a < col.end < b else None
        if cut is None:
            out.append((a, b, col.end is not None and a >= col.end and not col.sync))
        else:
            out += [(a, cut, False), (cut, b, True)]
    return out


def _communication_row(plot: _Plot, rank: int, t: RankTimeline, row: float) -> list[str]:
    """Communication work: where any was in flight (merged at this resolution, as the busy row), and on top each
    collective wide enough to point at, with its name; the longest first, so a short one is never hidden under a
    long one. (A 20-step GPT has thousands of sub-pixel collectives: one rectangle and one title each made a 1 MB
    picture.)"""
    c = COLOURS
    spans = [(k.start, k.end) for k in t.collectives if k.start is not None and k.end is not None]
    parts = [plot.rect(a, b, row + 3, _ROW_H - 6, c["collective"]) for a, b in close_gaps(union(spans), plot.res)]
    wide = [k for k in t.collectives if k.start is not None and k.end is not None and k.end - k.start >= 2 * plot.res]
    for col in sorted(wide, key=lambda k: -(k.end - k.start)):
        title = f"rank {rank} {col.label} (step {col.step}): {format_us(col.end - col.start)}"
        extra = f' data-step="{col.step}" data-index="{col.index}"'
        parts.append(
            plot.rect(col.start, col.end, row + 1, _ROW_H - 2, c["collective"], c["collective_border"], title, extra)
        )
    return parts


def _nice_step(ms: float) -> float:
    for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000):
        if s >= ms:
            return s
    return 10000.0


def timeline_html(timeline: Timeline, *, width: int = 1200, worst: int = 8, span_us: float | None = None) -> str:
    """The static picture with its reading: the straggler verdict and the rule it follows, the SVG, a legend, the
    per-rank breakdown, the worst collectives (each once), and what could not be recorded. ``span_us``: draw up to
    that time (the same for several runs: one scale). No script; for nbconvert, GitHub and the HTML report."""
    a = timeline.analysis()
    name = f": {_e(timeline.name)}" if timeline.name else ""
    parts = [
        (
            f"<div class='thunderviz-timeline-static'><h4>Timeline{name} ({counted(len(timeline.ranks), 'rank')}, "
            f"{counted(len(timeline.steps), 'step')})</h4>"
        )
    ]
    if not timeline.ranks or not timeline.steps:
        parts.append("<p>No step was recorded.</p>")
    else:
        parts.append(f"<p><b>{_e(a.summary()[0])}</b></p>")
        parts.append(f"<p class='note' style='font-size:12px'>{_e(STRAGGLER_RULE)}</p>")
        parts.append(f"<div style='overflow-x:auto'>{timeline_svg(timeline, width=width, t1=span_us)}</div>")
        parts.append(_legend_html())
        parts += _breakdown_html(a)
        parts += _waits_html(a, worst)
    notes = list(timeline.problems) + [f"rank {r}: {n}" for r, t in sorted(timeline.ranks.items()) for n in t.notes]
    if notes:
        parts.append("<h5>Notes</h5><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    parts.append("</div>")
    return "\n".join(parts)


def _legend_html() -> str:
    c = COLOURS
    legend = [
        ("forward", c["forward"]),
        ("backward", c["backward"]),
        ("optimizer", c["optimizer"]),
        ("main thread busy", c["op"]),
        ("idle (dotted: no op, not blocked)", c["idle"]),
        ("blocked by a collective", c["wait"]),
        ("still blocked after its work ended (hatched)", c["after_work"]),
        ("collective in flight", c["collective"]),
    ]
    return (
        "<p style='font-size:12px'>"
        + " ".join(
            f"<span style='display:inline-block;width:12px;height:12px;background:{col};border:1px solid #8aa1b8;"
            f"vertical-align:middle'></span> {_e(name)}&nbsp;&nbsp;"
            for name, col in legend
        )
        + " &nbsp;dashed lines: where each step begins</p>"
    )


#: The breakdown's columns: ``RankBreakdown`` field -> its heading (times in ms, the mean over the drawn steps). The
#: drawn steps ran under torch.profiler, which slows every op: their length is not the run's step time (the report's
#: "step time", from steps timed without it), so the column says "profiled" and never plain "step time".
BREAKDOWN_COLUMNS = {
    "rank": "rank",
    "steps": "steps drawn",
    "step_time": "profiled step",
    "compute": "compute",
    "communication": "communication",
    "exposed": "communication exposed",
    "overlapped": "communication overlapped",
    "idle": "idle",
}


def _breakdown_html(a: TimelineAnalysis) -> list[str]:
    """The per-rank breakdown table: milliseconds per step, as every duration is printed (``units.format_us``:
    one decimal, two below 1 ms; it read ``step_time (ms)`` and 242.079 / 0.008)."""
    heads = [
        f"<th>{_e(title)}{'' if key in ('rank', 'steps') else ' (ms)'}</th>" for key, title in BREAKDOWN_COLUMNS.items()
    ]
    parts = [
        "<table class='thunderviz-breakdown'><caption>Per rank, the mean of each drawn step, timed under"
        " torch.profiler (which slows every op; the run's step time is timed without it)</caption><thead><tr>"
        + "".join(heads)
        + "</tr></thead><tbody>"
    ]
    for b in a.breakdown():
        cells = [str(b.rank), str(b.steps)]
        cells += [format_us(getattr(b, key)).removesuffix(" ms") for key in list(BREAKDOWN_COLUMNS)[2:]]
        parts.append("<tr>" + "".join(f"<td class='num'>{_e(c)}</td>" for c in cells) + "</tr>")
    parts.append("</tbody></table>")
    return parts


def _waits_html(a: TimelineAnalysis, worst: int) -> list[str]:
    """The ``worst`` collectives that made a rank wait, worst first (nothing when none did)."""
    waits = [w for w in a.collectives() if w.worst_wait > 0][:worst]
    if not waits:
        return []
    return [
        "<h5>Collectives that made ranks wait, worst first</h5><ol>",
        *(f"<li>{_e(w.message)}</li>" for w in waits),
        "</ol>",
    ]
