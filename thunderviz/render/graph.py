"""DOT for a trace that a person can read: one box per module block, collectives set apart, details on demand.

``thunder.examine.make_trace_dot`` draws every bound symbol with its full Python line: 1,451 nodes for the
backward of a 4-block GPT, which ``dot`` takes many minutes to lay out and no screen can show. Here the default
view has one node per block (``blocks.0``, ``lm_head``, ...) plus one node per block for its collectives, with
data-flow edges between them; any block can be expanded into its ops (short labels: op and output shape).
Bookkeeping ops (``python_del``, unpacks) are hidden. Node ids are stable (``g3``, ``op120``), so a widget can
map clicks to ``node_metadata`` and ask for another ``to_dot(..., expand={...})``.

Which ops each node stands for is ``render.graph_groups``'; how each node is written (label, tooltip, style, click
details, all user text escaped) is ``render.graph_nodes``'. Here: the view (which groups are open, which node draws
each op), the edges between nodes, and laying the DOT out with Graphviz.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from thunderviz.render.graph_groups import Group, group_holding, group_ops
from thunderviz.render.graph_nodes import INPUT_NODE, NodeDrawing, clip_label, dot_escape, inner_node
from thunderviz.trace.model import OpRecord, TensorRef, TraceSnapshot, short_op_name
from thunderviz.trace.units import format_bytes

# format_bytes and short_op_name stay importable from here, as before: what a graph prints for a size and an op.
__all__ = [
    "GraphView",
    "dot_available",
    "format_bytes",
    "graph_view",
    "node_metadata",
    "render_dot",
    "short_op_name",
    "to_dot",
    "to_svg",
]


@dataclass
class GraphView:
    """A DOT source plus what a front end needs to make its nodes clickable."""

    dot: str
    nodes: dict[str, dict[str, Any]]
    groups: list[Group]
    expanded: frozenset[str]
    #: op index -> id of the node that draws it (its own, its group's, or its group's collectives node), so a
    #: front end can mark diff results or ledger rows without re-deriving the layout rules.
    node_of: dict[int, str] = field(default_factory=dict)


def graph_view(
    snapshot: TraceSnapshot,
    expand: Collection[str] | None = None,
    *,
    include_bookkeeping: bool = False,
    title: str | None = None,
    id_prefix: str = "",
) -> GraphView:
    """Build the DOT and node metadata for ``snapshot`` with the groups in ``expand`` (names or ids) opened.

    ``id_prefix`` goes in front of the SVG element ids (not the DOT node names), so several graphs can share
    one HTML page; ``nodes`` is keyed by the un-prefixed ids.
    """
    groups = group_ops(snapshot, include_bookkeeping=include_bookkeeping)
    opened = _resolve_expand(groups, expand)
    node_of = _node_of(groups, opened)
    draw = NodeDrawing(snapshot, id_prefix)
    lines = _header(snapshot, title)
    inputs = _forward_inputs(snapshot) if not include_bookkeeping else {}
    if inputs:
        lines.append(draw.input_node(inputs))
        node_of = {**node_of, **dict.fromkeys(inputs, INPUT_NODE)}
    for g in groups:
        lines += draw.open_group(g) if g.id in opened else draw.collapsed_group(g)
    lines += _edges(snapshot, node_of, _opened_regions(groups, opened))
    lines.append("}")
    return GraphView(dot="\n".join(lines) + "\n", nodes=draw.nodes, groups=groups, expanded=opened, node_of=node_of)


def _forward_inputs(snapshot: TraceSnapshot) -> dict[int, TensorRef]:
    """The forward trace's tensor arguments that are not parameters (the batch), by the index of the hidden op
    that unpacks each: drawn as one input node, so the forward graph reads input -> embeddings -> ... -> head."""
    if snapshot.label != "forward":
        return {}
    wanted = set(snapshot.arg_names) - set(snapshot.param_names)
    out: dict[int, TensorRef] = {}
    for op in snapshot.ops:
        if op.is_bookkeeping and op.op.startswith("unpack"):
            for t in op.outputs:
                if t.name in wanted and t.kind == "tensor":
                    out[op.index] = t
    return out


def _node_of(groups: list[Group], opened: frozenset[str]) -> dict[int, str]:
    """Which node draws each op: its own node when its group is open, else the group's (or the group's
    collective node, so communication stays visible when collapsed)."""
    node_of: dict[int, str] = {}
    for g in groups:
        for op in g.ops:
            if g.id in opened:
                node_of[op.index] = f"op{op.index}"
            elif g.bucket is not None:  # a bucket's communication is one node
                node_of[op.index] = g.id
            elif op.collective is not None:
                node_of[op.index] = f"{g.id}c"
            else:
                node_of[op.index] = g.id
    return node_of


def _opened_regions(groups: list[Group], opened: frozenset[str]) -> dict[int, OpRecord]:
    """The fusion regions drawn as their ops: every captured region of an open group, by op index."""
    return {op.index: op for g in groups if g.id in opened for op in g.ops if op.inner}


def _resolve_expand(groups: list[Group], expand: Collection[str] | None) -> frozenset[str]:
    if not expand:
        return frozenset()
    wanted = {group_holding(groups, w) or w for w in expand}
    known = {g.id for g in groups} | {g.name for g in groups}
    unknown = wanted - known
    if unknown:
        names = ", ".join(repr(g.name) for g in groups)
        raise ValueError(
            f"to_dot(expand={sorted(unknown)!r}): no such group in this trace; pass group names or ids from: {names}"
        )
    return frozenset(g.id for g in groups if g.id in wanted or g.name in wanted)


def _header(snapshot: TraceSnapshot, title: str | None) -> list[str]:
    return [
        "digraph trace {",
        '  graph [rankdir=TB, nodesep=0.25, ranksep=0.35, fontname="Helvetica", fontsize=13, '
        f'labelloc=t, label="{dot_escape(clip_label(title or snapshot.label, 80))}"];',
        '  node [fontname="Helvetica", fontsize=12, margin="0.08,0.03", height=0.3];',
        '  edge [color="#7f8c99", arrowsize=0.6];',
    ]


def _edges(snapshot: TraceSnapshot, node_of: dict[int, str], regions: dict[int, OpRecord]) -> list[str]:
    """Edges between drawn nodes, merged: two collapsed groups get one edge however many tensors cross. An opened
    fusion region has no node of its own: a tensor enters at the region's ops that read it and leaves from the one
    that computed it, and its ops are joined as inside any trace."""
    produced = {
        r: {t.name: inner_node(op, k) for k, i in enumerate(op.inner) for t in i.outputs} for r, op in regions.items()
    }
    read: dict[int, dict[str, list[str]]] = {}
    for r, op in regions.items():
        for k, i in enumerate(op.inner):
            for t in i.inputs:
                read.setdefault(r, {}).setdefault(t.name, []).append(inner_node(op, k))
    edge_count: Counter[tuple[str, str]] = Counter()
    for src, dst, name in snapshot.edges:
        a = produced[src].get(name) if src in regions else node_of.get(src)
        bs = read.get(dst, {}).get(name, []) if dst in regions else [node_of.get(dst)]
        for b in bs:
            if a is not None and b is not None and a != b:
                edge_count[(a, b)] += 1
    for op in regions.values():
        inside: dict[str, str] = {}
        for k, i in enumerate(op.inner):
            for t in i.inputs:
                if t.name in inside and inside[t.name] != inner_node(op, k):
                    edge_count[(inside[t.name], inner_node(op, k))] += 1
            for t in i.outputs:
                inside[t.name] = inner_node(op, k)
    lines = []
    for (a, b), n in edge_count.items():
        width = 1.0 if n == 1 else min(4.0, 1.0 + n / 8)
        tip = f"{n} tensor{'s' if n != 1 else ''}"
        lines.append(f'  {a} -> {b} [penwidth={width:.1f}, tooltip="{tip}"];')
    return lines


def to_dot(
    snapshot: TraceSnapshot,
    expand: Collection[str] | None = None,
    *,
    include_bookkeeping: bool = False,
    title: str | None = None,
    id_prefix: str = "",
) -> str:
    """DOT source of ``snapshot``: collapsed by block, with the groups in ``expand`` (names or ids) opened."""
    return graph_view(snapshot, expand, include_bookkeeping=include_bookkeeping, title=title, id_prefix=id_prefix).dot


def node_metadata(
    snapshot: TraceSnapshot, expand: Collection[str] | None = None, *, include_bookkeeping: bool = False
) -> dict[str, dict[str, Any]]:
    """JSON-able details per DOT node id, for click-to-details in a browser."""
    return graph_view(snapshot, expand, include_bookkeeping=include_bookkeeping).nodes


def dot_available() -> bool:
    """Whether the Graphviz ``dot`` binary is on PATH (SVG output needs it; DOT output never does)."""
    return shutil.which("dot") is not None


def render_dot(dot: str, fmt: str = "svg", *, timeout: float = 60.0) -> bytes:
    """Lay out ``dot`` with the Graphviz binary.

    Raises:
        RuntimeError: no ``dot`` binary (install Graphviz, e.g. ``apt-get install graphviz``, or lay the DOT out
            in the browser), or it failed or ran past ``timeout``.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError(
            "render_dot: the Graphviz `dot` binary is not installed, so no SVG can be made here. Install it "
            "(apt-get install graphviz / conda install graphviz) or use the DOT source with a client-side Graphviz."
        )
    try:
        proc = subprocess.run([exe, f"-T{fmt}"], input=dot.encode("utf-8"), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"render_dot: `dot -T{fmt}` ran past {timeout:.0f} s; expand fewer groups.") from e
    if proc.returncode != 0:
        raise RuntimeError(f"render_dot: `dot -T{fmt}` failed: {proc.stderr.decode('utf-8', 'replace')[:500]}")
    return proc.stdout


def to_svg(dot: str, *, timeout: float = 60.0) -> str:
    """SVG text for ``dot`` (needs the ``dot`` binary; see ``dot_available``)."""
    svg = render_dot(dot, "svg", timeout=timeout).decode("utf-8")
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg
