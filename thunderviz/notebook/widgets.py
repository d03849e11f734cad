"""Interactive trace widgets for JupyterLab: a trace view, a side-by-side comparison and a per-rank status line.

Built on anywidget: all state is traitlets with ``sync=True`` and the front end is one ES module
(``static/trace_view.js``) with a ``render({model, el})`` function. The kernel computes everything a person
reads (DOT, node details, ledger rows, search hits, diff marks; see ``viewdata``) so it works, and is tested,
from plain Python; the browser lays the DOT out with a vendored Graphviz WASM build (no ``dot`` binary, no CDN),
and handles zoom, pan, clicks and the panels.

Every widget also carries a static HTML picture (SVG from the ``dot`` binary when installed, otherwise the DOT
source) in its display bundle, so nbconvert, GitHub and a notebook opened without a kernel still show the graph.
JupyterLab prefers the live widget view over it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import anywidget
import traitlets as t

from thunderviz.cell.status import PHASES
from thunderviz.notebook import viewdata as vd
from thunderviz.notebook.memory_tab import MemoryColumn, memory_panel, memory_rows, memory_view
from thunderviz.notebook.subject import Subject, distinct_labels, snapshot_of, subject_of, trace_choices, trace_names
from thunderviz.parallel.decisions import Decision
from thunderviz.render.graph import dot_available, to_svg
from thunderviz.render.markup import decisions_table
from thunderviz.render.markup import escape as _e
from thunderviz.render.markup import table as _table
from thunderviz.render.style import wrap
from thunderviz.trace.units import format_bytes

__all__ = ["CompareView", "RankStatus", "TraceView"]

_STATIC = Path(__file__).parent / "static"


@cache
def _static(name: str) -> str:
    return (_STATIC / name).read_text(encoding="utf-8")


class _GraphWidget(anywidget.AnyWidget):
    """One or two graph panes over the same trace label, with search, expansion, selection and panels."""

    _esm = t.Unicode().tag(sync=True)
    _css = t.Unicode().tag(sync=True)
    #: The vendored @hpcc-js/wasm-graphviz module; the front end imports it once per page (cached on globalThis).
    _graphviz_js = t.Unicode().tag(sync=True)

    mode = t.Unicode("trace").tag(sync=True)
    title = t.Unicode("").tag(sync=True)
    summary = t.Unicode("").tag(sync=True)
    #: a comparison's one-sentence verdict (``viewdata.compare_verdict``): bytes per step, why, one memory change
    verdict = t.Unicode("").tag(sync=True)
    #: a comparison's two run names, for its legend and the details of a changed block
    runs = t.List(t.Unicode()).tag(sync=True)
    traces = t.List(t.Unicode()).tag(sync=True)
    #: label -> what the trace menu says (``subject.trace_names``)
    trace_names = t.Dict().tag(sync=True)
    trace = t.Unicode("").tag(sync=True)
    expanded = t.List(t.Unicode()).tag(sync=True)
    panes = t.List(t.Dict()).tag(sync=True)
    search = t.Unicode("").tag(sync=True)
    matches = t.List(t.Dict()).tag(sync=True)
    match_total = t.Int(0).tag(sync=True)
    #: the query ``matches`` answer (set with them, so the browser redraws even when no hit changed: "no matches")
    searched = t.Unicode("").tag(sync=True)
    selected = t.Dict().tag(sync=True)
    panels = t.Dict().tag(sync=True)
    height = t.Int(520).tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            _esm=_static("trace_view.js"),
            _css=_static("trace_view.css"),
            _graphviz_js=_static("graphviz-wasm.js"),
            **kwargs,
        )

    # ------------------------------------------------------------------ subclasses fill these in

    def _pane_specs(self) -> list[tuple[Subject, dict[int, str] | None]]:
        raise NotImplementedError

    def _on_trace_changed(self) -> None:
        """Hook for state that depends on the trace label (the comparison's summary)."""

    def _pane_heading(self, index: int, subject: Subject) -> str:
        """What a pane's title says it shows (run, configuration, object)."""
        return subject.heading

    def _pane_compare(self, index: int) -> dict[str, Any]:
        """A comparison's extra ``viewdata.pane_data`` arguments for pane ``index`` (group changes, run names)."""
        return {}

    # ------------------------------------------------------------------ state

    @t.validate("trace")
    def _check_trace(self, proposal: dict[str, Any]) -> str:
        value = proposal["value"]
        if self.traces and value not in self.traces:
            raise t.TraitError(f"trace={value!r}: this view has {self.traces!r}")
        return value

    @t.observe("trace")
    def _trace_changed(self, _change: dict[str, Any]) -> None:
        self.selected = {}
        self._on_trace_changed()
        self._refresh()

    @t.observe("expanded")
    def _expanded_changed(self, _change: dict[str, Any]) -> None:
        self._refresh()

    @t.observe("search")
    def _search_changed(self, _change: dict[str, Any]) -> None:
        self._run_search()

    def _refresh(self) -> None:
        panes = []
        specs = self._pane_specs()
        for i, (subject, marks) in enumerate(specs):
            snap = snapshot_of(subject.primary, self.trace)
            ledger = subject.ledgers.get(subject.primary.rank)
            prefix = f"p{i}-" if len(specs) > 1 else ""
            panes.append(
                vd.pane_data(
                    snap,
                    expanded=self.expanded,
                    ledger=ledger,
                    title=f"{self._pane_heading(i, subject)} \u00b7 {self.trace}",
                    id_prefix=prefix,
                    marks=marks,
                    **self._pane_compare(i),
                )
            )
        self.panes = panes
        self._run_search()

    def _run_search(self) -> None:
        hits: list[dict[str, Any]] = []
        total = 0
        for i, (subject, _marks) in enumerate(self._pane_specs()):
            found, n = vd.search_ops(snapshot_of(subject.primary, self.trace), self.search, expanded=self.expanded)
            hits.extend({**h, "pane": i} for h in found)
            total += n
        with self.hold_sync():  # one message, so the browser never shows a new list with an old count
            self.match_total = total
            self.matches = hits[: vd.MAX_MATCHES]
            self.searched = self.search

    # ------------------------------------------------------------------ Python API

    def expand(self, *groups: str) -> None:
        """Open groups (by name, e.g. ``"blocks.0"``) into their ops, as a double-click in the graph does."""
        known = {g["name"] for p in self.panes for g in p["groups"]}
        # a module a fusion region runs opens that region's group (``ln_f`` opens ``blocks.3 -> lm_head``)
        held = {g: next((h for p in self.panes if (h := p["holding"].get(g))), g) for g in groups}
        unknown = [g for g, h in held.items() if h not in known]
        if unknown:
            raise ValueError(f"expand({', '.join(map(repr, unknown))}): no such group; groups: {sorted(known)!r}")
        self.expanded = list(dict.fromkeys([*self.expanded, *held.values()]))

    def collapse(self, *groups: str) -> None:
        """Close groups again; with no argument, close all."""
        self.expanded = [] if not groups else [g for g in self.expanded if g not in groups]

    def select(self, node: str, pane: int = 0) -> dict[str, Any]:
        """Select a node as a click does; returns its details."""
        if not 0 <= pane < len(self.panes) or node not in self.panes[pane]["nodes"]:
            ids = sorted(self.panes[pane]["nodes"]) if 0 <= pane < len(self.panes) else []
            raise ValueError(f"select({node!r}, pane={pane}): no such node; nodes: {ids[:20]!r}")
        self.selected = {"pane": pane, "node": node}
        return self.details

    @property
    def details(self) -> dict[str, Any]:
        """What the details box shows for the selected node (empty when nothing is selected)."""
        sel = self.selected
        if not sel:
            return {}
        return self.panes[sel["pane"]]["nodes"].get(sel["node"], {})

    def _decision_log(self) -> list[Decision]:
        """The decisions the static picture lists (a comparison shows none)."""
        return []

    def _static_memory(self) -> str:
        """The Memory view's static picture (a trace view has one; a comparison shows none)."""
        return ""

    # ------------------------------------------------------------------ display

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return _with_static_picture(self, super()._repr_mimebundle_(**kwargs), self.to_html())

    def to_html(self) -> str:
        """The static picture: title, summary, each pane's graph (SVG, or DOT without Graphviz) and the panels."""
        parts = [f"<div class='thunderviz-static'><h4>{_e(self.title)}</h4>"]
        if self.verdict:
            parts.append(f"<p class='tv-verdict'>{_e(self.verdict)}</p>")
        if self.summary:
            parts.append(f"<p><b>{_e(self.summary)}</b></p>")
        use_svg = dot_available()
        cells = []
        for p in self.panes:
            cells.append(
                f"<td style='vertical-align:top'><div><b>{_e(p['title'])}</b> ({p['n_ops']} ops, "
                f"{p['n_collectives']} collectives)</div>{_graph_html(p['dot'], use_svg)}</td>"
            )
        parts.append(f"<table><tr>{''.join(cells)}</tr></table>")
        parts.append(_panels_html(self.panels, self._decision_log()))
        parts.append(self._static_memory())
        parts.append(
            "<p style='color:#5b6b7c'>Static picture from when the cell ran; open the notebook in "
            "JupyterLab with a kernel for zoom, search, details and expanding blocks.</p></div>"
        )
        return wrap("\n".join(parts))


def _graph_html(dot: str, use_svg: bool) -> str:
    if use_svg:
        try:
            return f"<div style='max-width:100%;overflow:auto'>{to_svg(dot, timeout=30)}</div>"
        except RuntimeError as e:
            return f"<p>(no SVG: {_e(e)})</p><pre>{_e(dot)}</pre>"
    return (
        "<p>Graphviz <code>dot</code> is not installed here, so the static picture is the DOT source:</p>"
        f"<pre style='max-height:300px;overflow:auto'>{_e(dot)}</pre>"
    )


def _panels_html(panels: vd.Panels, decisions: Sequence[Decision]) -> str:
    out = []
    ledger = panels.get("ledger")
    if ledger:
        for msg in ledger.get("mismatches", []):
            out.append(f"<p style='color:#b3261e'><b>{_e(msg)}</b></p>")
        rows = [
            [r, ", ".join(f"{n} {k}" for k, n in ledger["counts"][r].items()), ledger["bytes"][r]]
            for r in ledger["ranks"]
        ]
        out.append("<h5>Collectives per rank</h5>" + _table(["rank", "collectives", "bytes sent"], rows))
    if decisions:
        out.append("<h5>Decisions</h5>" + decisions_table(decisions))
    memory = panels.get("memory")
    if memory and memory["rows"]:
        cols = memory["columns"]
        rows = [[r["rank"], *(_memory_cell(r.get(c["key"]), c["unit"]) for c in cols)] for r in memory["rows"]]
        out.append(
            "<h5>Memory per rank</h5>"
            + _table(["rank", *(c["title"] for c in cols)], rows)
            + f"<p style='color:#5b6b7c'>{_e(memory['note'])}</p>"
        )
    if panels.get("diff"):
        rows = [[r["tag"], r["a"], r["b"]] for r in panels["diff"]["rows"][:60]]
        out.append("<h5>Structural diff (first rows)</h5>" + _table(["", "a", "b"], rows))
    return "\n".join(out)


def _memory_cell(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    return format_bytes(int(value)) if unit == "bytes" else str(value)


class TraceView(_GraphWidget):
    """One jitted object's trace as a collapsed, clickable graph, with its ledger, decisions and memory panels.

    Args:
        source: a ``TraceBundle``, a list of per-rank bundles, a saved trace file's path, a ``TraceSnapshot``,
            a ``render.html.Report`` or the rank engine's ``RunReport`` (see ``subject.subject_of``).
        name: which jitted object, when ``source`` holds several.
        trace: ``"forward"`` (default), ``"backward"`` or a stage label.
        decisions: the strategy's decision log (``strategy.decisions``) when ``source`` does not carry it (saved
            trace files do not; the rank engine's report does).
        plan: a ``thunderviz.plan(...)`` result: the Memory tab draws each candidate's predicted peak as a stacked
            bar against the budget, with the ranks' measured peaks under the candidate they ran as (a report run
            with ``--plan`` carries its plan: the default).
        saved_vs_eager: a ``thunderviz.thunder.memory.saved_compare.compare_saved(module, batch)`` result: the Memory
        tab
            lists, line by line, what thunder saves for backward against eager PyTorch.
    """

    def __init__(
        self,
        source: Any,
        *,
        name: str | None = None,
        trace: str = "forward",
        decisions: Iterable[Decision] | None = None,
        plan: Any = None,
        saved_vs_eager: Any = None,
        **kwargs: Any,
    ) -> None:
        self._subject = subject_of(source, name)
        if decisions is not None:
            self._subject.decisions = list(decisions)
        if plan is None:  # a report run with --plan carries its plan
            plan = getattr(source, "plan", None)
        choices = trace_choices(self._subject.primary)
        if trace not in choices:
            raise ValueError(f"TraceView(trace={trace!r}): {self._subject.title!r} has {choices!r}")
        super().__init__(**kwargs)
        b = self._subject.primary
        with self.hold_trait_notifications():
            self.title = f"{self._subject.heading}: rank {b.rank} of {b.world_size}"
            self.traces = choices
            self.trace_names = trace_names(b)
            self.panels = vd.Panels(
                ledger=vd.ledger_table(self._subject),
                decisions=[vd.DecisionRow(**d.to_dict()) for d in self._subject.decisions],
                memory=memory_panel(memory_rows(self._subject)),
                memory_view=memory_view(self._subject, plan, saved_vs_eager),
            )
        self._plan = plan
        self._saved_vs_eager = saved_vs_eager
        self.trace = trace

    @property
    def subject(self) -> Subject:
        return self._subject

    def _decision_log(self) -> list[Decision]:
        return self._subject.decisions

    def _static_memory(self) -> str:
        from thunderviz.render import memory_view as mv

        subject = self._subject
        plan = self._plan
        # the run's prediction is one of the plan's candidates (--plan): one picture, the ranks under their candidate
        planned = mv.plan_predicted(plan, subject.prediction)
        parts = [mv.plan_html(plan)] if plan is not None and not planned else []
        if subject.step_memory or planned:
            parts.append(
                mv.run_memory_html(
                    subject.step_memory, None, subject.prediction, subject.prediction_name, plan if planned else None
                )
            )
        parts.append(mv.saved_html(subject.primary.forward))
        if self._saved_vs_eager is not None:
            parts.append(mv.saved_comparison_html(self._saved_vs_eager))
        return "\n".join(p for p in parts if p)

    def _pane_specs(self) -> list[tuple[Subject, dict[int, str] | None]]:
        return [(self._subject, None)]

    def __repr__(self) -> str:
        p = self.panes[0] if self.panes else {"n_ops": 0, "n_collectives": 0}
        return (
            f"TraceView({self._subject.title!r}, trace={self.trace!r}: {p['n_ops']} ops, "
            f"{p['n_collectives']} collectives, {len(self._subject.bundles)} rank(s))"
        )


class CompareView(_GraphWidget):
    """Two traces over the same label on one scale, synced zoom, the structural diff outlined on both graphs.

    Outlines (``viewdata.pane_data``): ``added`` only on what the first run has nothing of (a bucket ZERO3 adds),
    ``removed`` the reverse, ``changed`` on a block both runs have whose ops differ (clicking it says which ops,
    collectives and bytes sent: ``changes``). On top, the verdict (``viewdata.compare_verdict``: bytes sent per step,
    why, one memory difference), then the summary (``TraceDiff.summary``). The panes sit side by side when both
    graphs fit their half with readable text, else one above the other. Build it with
    ``thunderviz.notebook.compare.compare``.
    """

    def __init__(self, a: Subject, b: Subject, *, trace: str | None = None, **kwargs: Any) -> None:
        self._a, self._b = a, b
        shared = [x for x in trace_choices(a.primary) if x in trace_choices(b.primary)]
        if not shared:
            raise ValueError(f"compare: {a.title!r} and {b.title!r} share no trace label to compare")
        trace = trace or shared[0]
        if trace not in shared:
            raise ValueError(f"compare(trace={trace!r}): both sides have {shared!r}")
        self._diffs: dict[str, Any] = {}
        self._marks: tuple[dict[int, str], dict[int, str]] = ({}, {})
        self._changes: dict[str, Any] = {}
        super().__init__(mode="compare", **kwargs)
        with self.hold_trait_notifications():
            la, lb = distinct_labels(a, b)
            self.title = f"{la} vs {lb}"
            self.runs = list(vd.run_names(a, b))
            self.verdict = vd.compare_verdict(a, b)
            self.traces = shared
            self.trace_names = {k: v for k, v in trace_names(a.primary).items() if k in shared}
        self.trace = trace
        if not self.panes:
            self._trace_changed({})

    @property
    def diff(self) -> Any:
        """The ``trace.diff.TraceDiff`` for the current trace label."""
        return self._diff_for(self.trace)

    def _diff_for(self, label: str) -> Any:
        if label not in self._diffs:
            self._diffs[label] = vd.diff_for(self._a, self._b, label)
        return self._diffs[label]

    def _on_trace_changed(self) -> None:
        d = self._diff_for(self.trace)
        self._marks = vd.diff_marks(d)
        self._changes = vd.changes_for(self._a, self._b, self.trace, d)
        self.summary = vd.compare_header(self._a, self._b, self.trace, d)
        rows = [
            {
                "tag": r.tag,
                "a": d.describe(r.a, "a") if r.a is not None else "",
                "b": d.describe(r.b, "b") if r.b is not None else "",
            }
            for r in d.rows
            if r.tag != "="
        ]
        self.panels = vd.Panels(
            diff=vd.DiffPanel(rows=rows[:500], total=len(rows), delta=d.collective_delta(), unchanged=d.unchanged),
            memory=memory_panel(
                [
                    {"side": side, **m}
                    for s, side in zip((self._a, self._b), distinct_labels(self._a, self._b), strict=True)
                    for m in memory_rows(s)
                ],
                lead=[MemoryColumn(key="side", title="run", unit="", source="")],
            ),
        )

    def _pane_specs(self) -> list[tuple[Subject, dict[int, str] | None]]:
        return [(self._a, self._marks[0]), (self._b, self._marks[1])]

    def _pane_compare(self, index: int) -> dict[str, Any]:
        return {"changes": self._changes, "runs": tuple(self.runs)}

    @property
    def changes(self) -> dict[str, Any]:
        """Group name -> ``trace.diff.GroupChange`` for the current trace: what each outline and click says."""
        return dict(self._changes)

    def _pane_heading(self, index: int, subject: Subject) -> str:
        label = distinct_labels(self._a, self._b)[index]
        return label if label == subject.title else f"{label} \u00b7 {subject.title}"

    def __repr__(self) -> str:
        la, lb = distinct_labels(self._a, self._b)
        summary = self.summary.split(f"({self.trace}): ", 1)[-1]
        return f"CompareView({la!r} vs {lb!r}, trace={self.trace!r}: {summary})"


class RankStatus(anywidget.AnyWidget):
    """Live per-rank status of a running cell: one chip per rank in one of the rank engine's phases
    (``thunderviz.cell.status.PHASES``: starting, importing, waiting, configuring, running, collecting, done, failed,
    interrupted, stopped) with the seconds since the widget was made when it got there.

    Trait updates are sent on IOPub as they happen, so a cell that is still running (the rank engine's magics)
    can call ``update`` and the chips change while it runs. ``static_bundle`` is the same line without the widget
    (text/plain and HTML), which the magics leave in the output when the cell ends.
    """

    _esm = t.Unicode().tag(sync=True)
    _css = t.Unicode().tag(sync=True)
    ranks = t.List(t.Dict()).tag(sync=True)
    label = t.Unicode("").tag(sync=True)

    #: the states a chip can show (the engine's phases; "waiting" is a rank ready for a cell)
    STATES = PHASES

    def __init__(self, world_size: int, label: str = "", **kwargs: Any) -> None:
        if world_size < 1:
            raise ValueError(f"RankStatus(world_size={world_size}): need at least one rank")
        super().__init__(_esm=_static("rank_status.js"), _css=_static("trace_view.css"), label=label, **kwargs)
        self._t0 = time.monotonic()
        self.ranks = [self._row(r, "waiting") for r in range(world_size)]
        #: set when the cell ends: what its time was spent on, as its report's header says it (``cell_seconds``)
        self.timing = ""

    def elapsed(self) -> float:
        """Seconds since the widget was made: the clock every chip's time is on."""
        return time.monotonic() - self._t0

    def _row(self, rank: int, state: str, detail: str = "") -> dict[str, Any]:
        return {"rank": rank, "state": state, "detail": detail, "seconds": round(time.monotonic() - self._t0, 2)}

    def update(self, phases: Mapping[int, str]) -> None:
        """Set several ranks at once; the signature of the rank engine's ``on_status`` callback, so
        ``engine.on_status = status.update`` drives the chips while a cell runs."""
        for rank, phase in sorted(phases.items()):
            if self.ranks[rank]["state"] != phase:
                self.set_status(rank, phase)

    def show(self, phases: Mapping[int, str]) -> None:
        """Show exactly these ranks (the pool may turn out larger or smaller than first drawn), one message."""
        self._check_states(phases.values())
        if not phases or sorted(phases) != list(range(len(phases))):
            raise ValueError(f"show({dict(phases)!r}): give every rank 0..N-1 a phase")
        old = {r["rank"]: r for r in self.ranks}
        rows = [
            old[r] if r in old and old[r]["state"] == phases[r] else self._row(r, phases[r]) for r in sorted(phases)
        ]
        if rows != self.ranks:
            self.ranks = rows

    def set_status(self, rank: int, state: str, detail: str = "") -> None:
        """Update one rank; ``state`` is one of ``STATES``."""
        self._check_states([state])
        if not 0 <= rank < len(self.ranks):
            raise ValueError(f"set_status(rank={rank}): ranks are 0..{len(self.ranks) - 1}")
        rows = [dict(r) for r in self.ranks]
        rows[rank] = self._row(rank, state, detail)
        self.ranks = rows

    def _check_states(self, states: Iterable[str]) -> None:
        for state in states:
            if state not in self.STATES:
                raise ValueError(f"set_status(state={state!r}): use one of {self.STATES!r}")

    def __repr__(self) -> str:
        states = ", ".join(f"{r['rank']}:{r['state']}" for r in self.ranks)
        return f"RankStatus({states})"

    def to_text(self) -> str:
        """One line, e.g. ``ranks: 0:done  1:failed`` (what nbval and a text export read)."""
        return "ranks: " + "  ".join(f"{r['rank']}:{r['state']}" for r in self.ranks)

    def to_html(self) -> str:
        """The chips as static HTML with inline colours (no script, no stylesheet needed)."""
        colours = {"failed": "#fbd5d2", "done": "#dff3e4", "interrupted": "#eee", "stopped": "#eee", "waiting": "#fff"}
        chips = []
        for r in self.ranks:
            detail = f" \u2014 {r['detail']}" if r["detail"] else ""
            chips.append(
                f"<span data-state='{_e(r['state'])}' style='padding:2px 8px;border-radius:10px;"
                f"border:1px solid #b8c4d0;background:{colours.get(r['state'], '#fff4cc')}'>"
                f"rank {_e(r['rank'])}: {_e(r['state'])}{_e(detail)} at {float(r['seconds']):.1f} s</span>"
            )
        label = f"<span>{_e(self.label)}</span> " if self.label else ""
        # the chips count from the cell's start (pool start included); the report's header splits the same time
        timing = f" <span class='timing'>{_e(self.timing)}</span>" if self.timing else ""
        return f"<div class='thunderviz-status' style='display:flex;gap:6px'>{label}{' '.join(chips)}{timing}</div>"

    def static_bundle(self) -> dict[str, str]:
        """The status without the widget: what a notebook keeps after the cell (see ``to_text``/``to_html``)."""
        return {"text/plain": self.to_text(), "text/html": self.to_html()}

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return _with_static_picture(self, super()._repr_mimebundle_(**kwargs), self.to_html())


def _with_static_picture(widget: Any, data: Any, html_text: str) -> dict[str, Any]:
    """The live widget's bundle plus a stable ``text/plain`` (nbval) and a ``text/html`` picture (no kernel)."""
    if isinstance(data, tuple):
        data = data[0]
    data = dict(data or {})
    data["text/plain"] = repr(widget)
    data["text/html"] = html_text
    return data
