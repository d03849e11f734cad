"""One self-contained HTML file for a set of captured traces: opens offline, with no server and no CDN.

The page holds, per jitted object: a summary per rank (ops, estimated peak memory, collectives), whether the
ranks' collectives line up (and the first mismatch if not), the collapsed graph of forward and backward (inline
SVG when the Graphviz ``dot`` binary exists, the DOT source otherwise), every group's ops as a table (the "full
text on demand"), each rank's collectives ledger, and the structural diff between consecutive objects
(DDP then FSDP, ZERO2 then ZERO3). Clicking a block in the SVG opens its table (a few lines of inline script;
without script the tables are still there).

Everything from user code passes through ``html.escape`` (text and attributes); the only script is our own
constant click handler, and nothing is loaded from elsewhere.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thunderviz.render.graph import dot_available, graph_view, short_op_name, to_svg
from thunderviz.render.graph_groups import Group
from thunderviz.render.graph_nodes import RECOMPUTED_MARK
from thunderviz.render.markup import counted, decisions_table
from thunderviz.render.markup import escape as _e
from thunderviz.render.markup import page as _markup_page
from thunderviz.render.style import PAGE_CSS, wrap
from thunderviz.render.timeline_svg import timeline_html
from thunderviz.timeline.model import Timeline
from thunderviz.trace.diff import TraceDiff, diff_traces
from thunderviz.trace.ledger import Ledger, find_mismatches, ledger_from_bundle
from thunderviz.trace.model import OpRecord, TraceBundle, TraceSnapshot
from thunderviz.trace.saved import TRACE_SAVED_NOTE
from thunderviz.trace.units import format_bytes

if TYPE_CHECKING:
    from thunderviz.parallel.decisions import Decision

__all__ = ["Report", "render_html", "render_report_body"]

_JS = """
document.addEventListener('click', function (ev) {
  var node = ev.target.closest && ev.target.closest('g.node');
  if (!node || !node.id) return;
  var d = document.getElementById('details-' + node.id.replace(/c$/, ''));
  if (d) { d.open = true; d.scrollIntoView({behavior: 'smooth', block: 'start'}); ev.preventDefault(); }
});
"""


def _shape(s: Any) -> str:
    return "" if s is None else "[" + ", ".join(str(d) for d in s) + "]"


@dataclass
class Report:
    """An HTML report over captured bundles; shows itself in a notebook and saves to one offline file.

    Args:
        bundles: from ``capture`` or ``load`` (any mix of ranks and objects).
        decisions: the strategies' jit decisions (``parallel.decisions.Decision``), optional.
        title: page title.
        svg: inline SVG graphs (None: when the ``dot`` binary exists).
        diff: add the structural diff between consecutive jitted objects.
        timeline: a measured ``timeline.model.Timeline`` to show after the traces (``timeline.load`` of the
            files ``record_timeline`` saved on each rank).
    """

    bundles: Sequence[TraceBundle]
    decisions: Sequence[Decision] | None = None
    title: str = "thunderviz report"
    svg: bool | None = None
    diff: bool = True
    timeline: Any = None
    _body: str | None = field(default=None, init=False, repr=False, compare=False)

    def body(self) -> str:
        if self._body is None:
            self._body = render_report_body(
                self.bundles, decisions=self.decisions, svg=self.svg, diff=self.diff, timeline=self.timeline
            )
        return self._body

    def html(self) -> str:
        """The complete standalone page."""
        return _page(self.title, self.body())

    def save(self, path: str) -> str:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html())
        return path

    def _repr_html_(self) -> str:
        return wrap(self.body())


def render_html(
    bundles: Sequence[TraceBundle],
    *,
    decisions: Sequence[Decision] | None = None,
    title: str = "thunderviz report",
    svg: bool | None = None,
    diff: bool = True,
    timeline: Any = None,
) -> str:
    """A complete, self-contained HTML page for ``bundles`` and, optionally, a measured ``timeline`` (see
    ``Report``)."""
    return Report(list(bundles), decisions=decisions, title=title, svg=svg, diff=diff, timeline=timeline).html()


def _page(title: str, body: str) -> str:
    return _markup_page(title, wrap(body, style=False), style=PAGE_CSS, script=_JS)


def render_report_body(
    bundles: Sequence[TraceBundle],
    *,
    decisions: Sequence[Decision] | None = None,
    svg: bool | None = None,
    diff: bool = True,
    timeline: Any = None,
) -> str:
    """The report without ``<html>``/``<head>``: for embedding in a notebook output or another page."""
    bundles = list(bundles)
    if timeline is not None and not isinstance(timeline, Timeline):
        raise TypeError(
            "render_html(timeline=...): expected a thunderviz Timeline (thunderviz.timeline.load), got "
            f"{type(timeline).__name__}"
        )
    for b in bundles:
        if not isinstance(b, TraceBundle):
            raise TypeError(f"render_html: expected TraceBundle objects (capture() or load()), got {type(b).__name__}")
    use_svg = dot_available() if svg is None else svg
    if use_svg and not dot_available():
        raise RuntimeError("render_html(svg=True): the Graphviz `dot` binary is not installed; pass svg=None or False.")
    by_name: OrderedDict[str, list[TraceBundle]] = OrderedDict()
    for b in bundles:
        by_name.setdefault(b.name, []).append(b)
    for lst in by_name.values():
        lst.sort(key=lambda b: b.rank)

    out: list[str] = []
    if not bundles and timeline is None:
        out.append("<p class='note'>No traces.</p>")
    if bundles or timeline is None:
        out.append(_overview(by_name))
    if decisions:
        out.append("<h2>Decisions</h2>" + decisions_table(decisions))
    for i, (name, ranks) in enumerate(by_name.items()):
        out.append(_bundle_section(i, name, ranks, use_svg))
    if diff and len(by_name) > 1:
        out.append(_diff_section(by_name))
    if timeline is not None:
        out.append("<h2>Timeline</h2>" + timeline_html(timeline))
    if not use_svg:
        out.append(
            "<p class='note'>Graphs are given as DOT source: the Graphviz <code>dot</code> binary was not found when "
            "this report was made. Install Graphviz and render again for inline SVG, or paste the DOT into any "
            "Graphviz viewer.</p>"
        )
    return "\n".join(out)


def _overview(by_name: Mapping[str, list[TraceBundle]]) -> str:
    rows = []
    for name, ranks in by_name.items():
        for b in ranks:
            counts = ledger_from_bundle(b).counts()
            coll = ", ".join(f"{n} {k}" for k, n in counts.items()) or "none"
            rows.append(
                f"<tr><td>{_e(name)}</td><td class='num'>{b.rank}</td><td class='num'>{b.world_size}</td>"
                f"<td class='num'>{len(b.forward)}</td>"
                f"<td class='num'>{'' if b.backward is None else len(b.backward)}</td>"
                f"<td class='num'>{format_bytes(b.forward.peak_memory_bytes)}</td>"
                f"<td class='num'>{'' if b.backward is None else format_bytes(b.backward.peak_memory_bytes)}</td>"
                f"<td class='num'>{_saved(b)}</td>"
                f"<td>{_e(coll)}</td></tr>"
            )
    return (
        "<h2>Overview</h2><table><tr><th>jitted object</th><th>rank</th><th>world</th><th>forward ops</th>"
        "<th>backward ops</th><th>trace estimate fwd</th><th>trace estimate bwd</th><th>saved tensors (trace)</th>"
        "<th>collectives</th></tr>"
        + "".join(rows)
        + "</table><p class='note'>Trace estimate: thunder's estimate of one trace's peak "
        "(<code>get_alloc_memory</code>), per rank: that trace's intermediates, not the step peak of the memory "
        "section (which counts parameters, gradients, optimizer state and everything alive at once). "
        f"{_e(TRACE_SAVED_NOTE)} "
        f"{RECOMPUTED_MARK} counts the backward ops that recompute forward values instead (activation checkpointing, "
        "ZERO3). Kept for accumulation: the unsharded gradients a <code>no_backward_sync</code> backward holds until "
        "the next synchronizing one (one full copy of the sharded parameters' gradients per rank).</p>"
    )


def _saved(b: TraceBundle) -> str:
    """``4.1 KiB (21)``, ``; ↻ 58`` recomputed, ``; kept for accumulation 2.6 KiB``: memory between fwd and bwd."""
    saved = b.saved_for_backward
    text = f"{format_bytes(saved['bytes'])} ({saved['tensors']})" if saved["tensors"] else ""
    if b.backward is not None and b.backward.recomputed_ops:
        text += f"; {RECOMPUTED_MARK} {b.backward.recomputed_ops} recomputed"
    kept = b.accumulated_gradients
    if kept["bytes"]:
        text += f"; kept for accumulation {format_bytes(kept['bytes'])} ({kept['buckets']} buckets, no reduction)"
    return _e(text)


def _bundle_section(i: int, name: str, ranks: list[TraceBundle], use_svg: bool) -> str:
    out = [f"<h2>{_e(name)}</h2>"]
    ledgers = {b.rank: ledger_from_bundle(b) for b in ranks}
    out.append(_agreement(ledgers))
    ref = ranks[0]
    for b in ranks:
        same = b is not ref and _same_structure(ref, b)
        out.append(f"<h3>rank {b.rank}</h3>")
        if same:
            out.append(
                f"<p class='note'>Forward and backward have the same structure as rank {ref.rank}'s "
                "(ops, shapes, collectives); see there.</p>"
            )
        else:
            for label, snap in b.traces().items():
                out.append(_trace_block(f"b{i}r{b.rank}{label[0]}-", f"{name}, rank {b.rank}, {label}", snap, use_svg))
            if b.stages:
                out.append(_stages_table(b.stages))
        out.append(_ledger_table(ledgers[b.rank]))
    return "\n".join(out)


def _same_structure(a: TraceBundle, b: TraceBundle) -> bool:
    for x, y in ((a.forward, b.forward), (a.backward, b.backward)):
        if (x is None) != (y is None):
            return False
        if x is not None and y is not None:
            d = diff_traces(x, y)
            if d.added or d.removed or d.changed:
                return False
    return True


def _agreement(ledgers: Mapping[int, Ledger]) -> str:
    if len(ledgers) < 2:
        return "<p class='note'>One rank captured: nothing to line up.</p>"
    mism = find_mismatches(ledgers)
    if not mism:
        n = len(next(iter(ledgers.values())).collectives())
        ranks = ", ".join(map(str, sorted(ledgers)))
        return f"<p class='ok'>Ranks {ranks} issue the same {n} collectives in the same order.</p>"
    return "".join(f"<p class='bad'>{_e(m.message)}</p>" for m in mism)


def _trace_block(prefix: str, title: str, snap: TraceSnapshot, use_svg: bool) -> str:
    view = graph_view(snap, title=title, id_prefix=prefix)
    parts = [f"<h4>{_e(title)}: {len(snap)} bound symbols, {len(view.groups)} groups</h4>"]
    if use_svg:
        try:
            parts.append(f"<div class='graph'>{to_svg(view.dot)}</div>")
        except RuntimeError as e:
            parts.append(f"<p class='bad'>{_e(e)}</p>")
    parts.append(f"<details><summary>DOT source</summary><pre>{_e(view.dot)}</pre></details>")
    parts.append("<p class='note'>Groups (click one, or a block in the graph, for its ops):</p>")
    for g in view.groups:
        parts.append(_group_details(prefix, g, snap))
    return "\n".join(parts)


def _group_details(prefix: str, g: Group, snap: TraceSnapshot) -> str:
    pn = snap.param_names
    rows = []
    for op in g.ops:
        rows.append(_op_row(op, pn, str(op.index)))
        # a fusion region's own ops, each with its module: every module the region spans is listed
        rows += [_op_row(i, pn, f"{op.index}.{k}") for k, i in enumerate(op.inner) if not i.is_bookkeeping]
    n_coll = len(g.collectives)
    extra = f", {counted(n_coll, 'collective')}" if n_coll else ""
    if g.recomputed:
        extra += f", {RECOMPUTED_MARK} {len(g.recomputed)} recomputed"
    if g.regions:
        extra += f", {counted(len(g.regions), 'fusion region')}"
    if g.spans:
        extra += f" spanning {', '.join(g.spans)}"
    return (
        f"<details id='details-{prefix}{g.id}'><summary><b>{_e(g.name)}</b>: "
        f"{counted(len(g.work), 'op')}{extra}</summary>"
        "<table><tr><th>#</th><th>op</th><th>outputs</th><th>inputs</th><th>module</th><th>source</th></tr>"
        + "".join(rows)
        + "</table></details>"
    )


def _op_row(op: OpRecord, pn: dict[str, str], where: str) -> str:
    """One op of a group's table (``where``: its index, ``12.3`` for a fusion region's fourth op)."""
    cls = " class='coll'" if op.is_collective else " class='wait'" if op.is_wait else ""
    mark = f" {RECOMPUTED_MARK}" if op.recomputed else ""
    outs = ", ".join(f"{t.name}: {t.short()}" for t in op.outputs)
    ins = ", ".join(pn.get(t.name, t.name) for t in op.inputs)
    src = "" if op.source is None else f"{op.source.short()}: {op.source.code}"
    return (
        f"<tr{cls}><td class='num'>{where}</td>"
        f"<td class='mono' title='{_e(op.python)}'>{_e(short_op_name(op.op) + mark)}"
        f"</td><td class='mono'>{_e(outs)}</td><td class='mono'>{_e(ins)}</td><td>{_e(op.module or '')}</td>"
        f"<td class='mono'>{_e(src)}</td></tr>"
    )


def _stages_table(stages: Sequence[TraceSnapshot]) -> str:
    rows = "".join(
        f"<tr><td class='num'>{i}</td><td>{_e(s.label)}</td><td class='num'>{len(s)}</td>"
        f"<td class='num'>{len(s.collectives)}</td></tr>"
        for i, s in enumerate(stages)
    )
    return (
        "<details><summary>Forward stages (thunder.last_traces)</summary><table><tr><th>#</th><th>stage</th>"
        f"<th>bound symbols</th><th>collectives + waits</th></tr>{rows}</table></details>"
    )


def _ledger_table(ledger: Ledger) -> str:
    rows = []
    for e in ledger.entries:
        cls = " class='wait'" if e.kind == "wait" else " class='coll'"
        rows.append(
            f"<tr{cls}><td class='num'>{e.position}</td><td>{_e(e.trace)}</td><td>{_e(e.kind)}</td>"
            f"<td class='mono'>{_e(e.tensor)}</td><td class='mono'>{_e(_shape(e.shape))}</td>"
            f"<td>{_e(e.dtype or '')}</td>"
            f"<td class='num'>{format_bytes(e.bytes) if e.bytes is not None else ''}</td>"
            f"<td class='num'>{'' if e.group_size is None else e.group_size}</td>"
            f"<td class='num'>{'' if e.distance is None else e.distance}</td></tr>"
        )
    counts = ", ".join(f"{n} {k}" for k, n in ledger.counts().items()) or "no collectives"
    return (
        f"<details><summary>Collectives ledger, rank {ledger.rank}: {_e(counts)}, "
        f"{format_bytes(ledger.sent_bytes())} sent per step</summary>"
        "<table><tr><th>#</th><th>trace</th><th>kind</th><th>tensor</th><th>shape</th><th>dtype</th><th>bytes</th>"
        "<th>group</th><th>ops to wait</th></tr>" + "".join(rows) + "</table></details>"
    )


def _diff_section(by_name: Mapping[str, list[TraceBundle]]) -> str:
    names = list(by_name)
    out = ["<h2>Differences between jitted objects</h2>"]
    for a_name, b_name in itertools.pairwise(names):
        a, b = by_name[a_name][0], by_name[b_name][0]
        for label, sa in a.traces().items():
            sb = b.traces().get(label)
            if sb is None:
                continue
            d: TraceDiff = diff_traces(sa, sb)
            out.append(
                f"<h3>{_e(a_name)} \u2192 {_e(b_name)} ({_e(label)}, rank {a.rank})</h3><p><b>{_e(d.summary)}</b></p>"
                f"<details><summary>aligned view</summary><pre>{_e(d.to_text())}</pre></details>"
            )
    return "\n".join(out)
