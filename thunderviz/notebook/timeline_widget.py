"""``TimelineView``: the measured per-rank timeline as an interactive widget (anywidget, one static ES module).

The kernel computes everything a person reads (lanes, the straggler analysis, ledger rows, arrival tables; see
``timeline.analysis``) and sends it once as plain numbers and strings; the browser (``static/timeline.js``)
only draws, zooms, pans and shows details, so the view is fast and the same facts are testable from Python
(``select``, ``details``, ``show_group``). No CDN, no network.

Like the trace widgets, its display bundle also carries a static picture (SVG and tables from
``render.timeline_svg``), so nbconvert, GitHub and a notebook opened without a kernel still show the timeline,
and a stable ``text/plain`` for nbval.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import anywidget
import traitlets as t

from thunderviz.gc_pause import no_gc_pauses
from thunderviz.render.style import wrap
from thunderviz.render.timeline_svg import COLOURS, group_colour, timeline_html
from thunderviz.timeline.analysis import STRAGGLER_RULE, close_gaps, idle_intervals, union
from thunderviz.timeline.model import Timeline
from thunderviz.trace.units import format_bytes

__all__ = ["TimelineView", "common_span_ms", "view_data"]

_STATIC = Path(__file__).parent / "static"


@cache
def _static(name: str) -> str:
    return (_STATIC / name).read_text(encoding="utf-8")


#: The shortest idle interval the widget receives (microseconds).
_IDLE_MIN_US = 20.0


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def common_span_ms(*timelines: Any) -> float:
    """The longest of several runs' timelines (``Timeline`` or a ``--timeline`` cell's report), in milliseconds:
    ``TimelineView(run, span_ms=common_span_ms(a, b))`` for each draws them on one scale."""
    tls = [t.timeline if not isinstance(t, Timeline) and hasattr(t, "timeline_requested") else t for t in timelines]
    return max((t.duration for t in tls), default=0.0) / 1000 or 1.0


def view_data(timeline: Timeline, *, span_us: float | None = None) -> dict[str, Any]:
    """The front end's data: per rank, compact rows of numbers (indices into shared string tables); ``span_us`` the
    time axis' extent when several runs share one scale."""
    groups: list[str] = []
    gid: dict[str, int] = {}

    def g(name: str) -> int:
        if name not in gid:
            gid[name] = len(groups)
            groups.append(name)
        return gid[name]

    ledger_rows: list[dict[str, Any]] = []
    row_ids: dict[tuple[Any, ...], int] = {}  # the same collective repeats every step: one row for all of them
    ranks = []
    for rank, tl in sorted(timeline.ranks.items()):
        coll = []
        for i, c in enumerate(tl.collectives):
            row = {
                "kind": c.kind,
                "tensor": c.tensor,
                "shape": None if c.shape is None else list(c.shape),
                "dtype": c.dtype,
                "bytes": format_bytes(c.bytes, unknown=""),  # as every view prints a size (it read 221952)
                "group size": c.group_size,
                "trace": c.trace,
                "ledger position": c.ledger_position,
                "trace op": c.op_index,
                "module group": c.group,
                "region": c.region,
                "async": not c.sync,
            }
            key = tuple(str(v) for v in row.values())
            if key not in row_ids:
                row_ids[key] = len(ledger_rows)
                ledger_rows.append(row)
            coll.append(
                [
                    i,
                    c.step,
                    c.index,
                    c.kind,
                    c.tensor,
                    _r(c.issue_start),
                    _r(c.issue_end),
                    _r(c.start),
                    _r(c.end),
                    _r(c.wait_start),
                    _r(c.wait_end),
                    c.group,
                    c.sync,
                    row_ids[key],
                ]
            )
        busy = [[_r(a), _r(b)] for a, b in close_gaps(union(tl.ops.intervals(0)), 2.0)]
        # idle: drawn, not left blank (a rank's one-second sleep read as nothing); gaps under
        # _IDLE_MIN_US between ops are Python's own overhead, too many and too short to draw
        idle = [[_r(a), _r(b)] for a, b in idle_intervals(tl) if b - a >= _IDLE_MIN_US]
        unc = tl.clock.uncertainty
        ranks.append(
            {
                "rank": rank,
                "clock_us": None if unc == float("inf") else round(unc, 1),
                "steps": [[_r(s.start), _r(s.end), s.step] for s in tl.steps],
                "regions": [[r.kind, _r(r.start), _r(r.end), r.step, r.name] for r in tl.regions],
                "segments": [[_r(s.start), _r(s.end), g(s.group), s.trace, s.share] for s in tl.segments],
                "busy": busy,
                "idle": idle,
                "coll": coll,
            }
        )
    analysis = timeline.analysis()
    waits = {}
    worst = None
    for w in analysis.collectives():
        key = f"{w.step}:{w.index}"
        # int rank keys become strings in JSON; JavaScript's obj[1] reads obj["1"], so both sides agree.
        waits[key] = {
            "last": w.last_rank,
            "first": w.first_rank,
            "message": w.message,
            "waited": {r: round(v, 1) for r, v in w.waited.items()},
        }
        if worst is None and w.worst_wait > 0:
            worst = key
    return {
        "duration": round(timeline.duration, 1),
        "span": round(span_us, 1) if span_us else None,
        "ranks": ranks,
        "groups": groups,
        "group_colours": [group_colour(name) for name in groups],
        "ledger": ledger_rows,
        "waits": waits,
        "worst": worst,
        "colours": dict(COLOURS),
    }


class TimelineView(anywidget.AnyWidget):
    """A ``Timeline`` with one lane per rank: regions, compute by module group, the main thread (collective
    blocking in yellow) and communication in flight (orange, as in the trace graph).

    Args:
        timeline: a ``timeline.model.Timeline`` (``Timeline.from_ranks``, ``timeline.load``, or a report's
            ``timeline``), or the ``RunReport`` of a ``--timeline`` cell.
        span_ms: draw the time axis up to this many milliseconds: pass ``common_span_ms(a, b)`` to views of runs
            you compare, so equal lengths mean equal times (default: this run's own length).
    """

    _esm = t.Unicode().tag(sync=True)
    _css = t.Unicode().tag(sync=True)
    title = t.Unicode("").tag(sync=True)
    summary = t.List(t.Unicode()).tag(sync=True)
    #: the straggler rule the summary follows (``timeline.analysis.STRAGGLER_RULE``), shown under it
    note = t.Unicode(STRAGGLER_RULE).tag(sync=True)
    data = t.Dict().tag(sync=True)
    selected = t.Dict().tag(sync=True)
    highlight = t.Dict().tag(sync=True)
    view = t.List(t.Float()).tag(sync=True)

    def __init__(self, timeline: Any, *, span_ms: float | None = None, **kwargs: Any) -> None:
        if not isinstance(timeline, Timeline) and hasattr(timeline, "timeline_requested"):
            timeline = timeline.timeline  # a RunReport: NoTimelineError says why when it has none
        if not isinstance(timeline, Timeline):
            raise TypeError(
                f"TimelineView(timeline): expected a thunderviz Timeline or the report of a --timeline cell, got "
                f"{type(timeline).__name__}"
            )
        if span_ms is not None and span_ms <= 0:
            raise ValueError(f"TimelineView(span_ms={span_ms}): give the axis' length in milliseconds, > 0")
        self._timeline = timeline
        self._span_us = None if span_ms is None else max(span_ms * 1000, timeline.duration)
        super().__init__(_esm=_static("timeline.js"), _css=_static("timeline.css"), **kwargs)
        steps = timeline.steps
        with self.hold_sync(), no_gc_pauses():
            self.title = (
                f"{timeline.name + ': ' if timeline.name else ''}{len(timeline.ranks)} ranks, {len(steps)} step(s)"
            )
            self.summary = timeline.analysis().summary() if steps else ["No step was recorded."]
            self.data = view_data(timeline, span_us=self._span_us)

    @property
    def timeline(self) -> Timeline:
        return self._timeline

    # ------------------------------------------------------------------ Python API (same facts as a click)

    def select(self, step: int, index: int) -> dict[str, Any]:
        """Select collective ``index`` of ``step`` as a click does; returns its details."""
        key = f"{step}:{index}"
        if key not in self.data["waits"] and not self._timeline.collective(step, index):
            raise ValueError(f"select(step={step}, index={index}): no such collective; steps: {self._timeline.steps}")
        self.selected = {"key": key}
        return self.details

    @property
    def details(self) -> dict[str, Any]:
        """What the details panel shows: the label, the ledger row, and every rank's arrival and wait."""
        key = self.selected.get("key")
        if not key:
            return {}
        step, index = (int(x) for x in key.split(":"))
        evs = self._timeline.collective(step, index)
        if not evs:
            return {}
        first = next(iter(evs.values()))
        w = self.data["waits"].get(key, {})
        row = self.data["ledger"][self._row_index(first, evs)]
        t0 = min(c.arrival for c in evs.values())
        arrivals = [
            {
                "rank": r,
                "arrival_ms": round(c.arrival / 1000, 3),
                "after_first_ms": round((c.arrival - t0) / 1000, 3),
                "waited_ms": round(w.get("waited", {}).get(r, 0.0) / 1000, 3),
                "blocked_ms": round(c.blocked / 1000, 3),
                "last": w.get("last") == r,
            }
            for r, c in sorted(evs.items())
        ]
        return {
            "label": f"{first.label} (step {step})",
            "message": w.get("message", ""),
            "ledger": row,
            "arrivals": arrivals,
            "last_rank": w.get("last"),
        }

    def _row_index(self, first: Any, evs: dict[int, Any]) -> int:
        rank = next(iter(evs))
        lane = next(r for r in self.data["ranks"] if r["rank"] == rank)
        return lane["coll"][self._timeline.ranks[rank].collectives.index(first)][13]

    def select_worst(self) -> dict[str, Any]:
        """Select the collective that made a rank wait longest (what the "worst wait" button does)."""
        worst = self.data.get("worst")
        if not worst:
            return {}
        self.selected = {"key": worst}
        return self.details

    def show_group(self, group: str | None) -> dict[int, list[tuple[float, float, str]]]:
        """Outline a module group's spans (compute and collectives) on every rank; ``None`` clears."""
        if not group:
            self.highlight = {}
            return {}
        known = self._timeline.groups()
        if group not in known:
            raise ValueError(f"show_group({group!r}): no compute or collective was attributed to it; groups: {known!r}")
        spans = self._timeline.spans_of(group)
        self.highlight = {"group": group, "spans": {r: [[a, b] for a, b, _ in s] for r, s in spans.items()}}
        return spans

    def link(self, trace_view: Any) -> None:
        """Follow a ``TraceView``: selecting a graph node (a block, or an op or collective inside one) outlines
        that module group's spans here; a node of no group on this timeline clears the outline."""

        def follow(_change: dict[str, Any]) -> None:
            self.show_group(self.group_of_node(trace_view.details or {}))

        trace_view.observe(follow, names="selected")

    def group_of_node(self, details: dict[str, Any]) -> str | None:
        """The module group on this timeline that a graph node's details (``TraceView.details``) belong to."""
        name = details.get("name") if details.get("kind") in ("group", "cluster") else details.get("group")
        return name if name and name in self._timeline.groups() else None

    def zoom_to(self, t0_ms: float, t1_ms: float) -> None:
        """Show the window from ``t0_ms`` to ``t1_ms`` (milliseconds from the first recorded step)."""
        if t1_ms <= t0_ms:
            raise ValueError(f"zoom_to({t0_ms}, {t1_ms}): the end must be after the start")
        self.view = [t0_ms * 1000, t1_ms * 1000]

    # ------------------------------------------------------------------ display

    def __repr__(self) -> str:
        tl = self._timeline
        top = tl.analysis().straggler() if tl.steps else None
        who = f"straggler: rank {top.rank}" if top is not None else "no clear straggler"
        n = sum(len(r.collectives) for r in tl.ranks.values())
        return f"TimelineView({tl.name or 'run'}: {len(tl.ranks)} ranks, {len(tl.steps)} steps, {n} collectives; {who})"

    def to_html(self) -> str:
        """The static picture (SVG and tables, no script)."""
        return wrap(
            timeline_html(self._timeline, span_us=self._span_us)
            + "<p style='color:#5b6b7c'>Static picture from when the cell ran; open the notebook in JupyterLab with "
            "a kernel to zoom, pan and click collectives.</p>"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        data = super()._repr_mimebundle_(**kwargs)
        if isinstance(data, tuple):
            data = data[0]
        data = dict(data or {})
        data["text/plain"] = repr(self)
        data["text/html"] = self.to_html()
        return data
