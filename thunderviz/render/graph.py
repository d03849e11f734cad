"""DOT for a trace that a person can read: one box per module block, collectives set apart, details on demand.

``thunder.examine.make_trace_dot`` draws every bound symbol with its full Python line: 1,451 nodes for the
backward of a 4-block GPT, which ``dot`` takes many minutes to lay out and no screen can show. Here the default
view has one node per block (``blocks.0``, ``lm_head``, ...) plus one node per block for its collectives, with
data-flow edges between them; any block can be expanded into its ops (short labels: op and output shape).
Bookkeeping ops (``python_del``, unpacks) are hidden. Node ids are stable (``g3``, ``op120``), so a widget can
map clicks to ``node_metadata`` and ask for another ``to_dot(..., expand={...})``.

Everything that comes from user code goes into quoted DOT strings with ``\\`` and ``"`` escaped, so a module
named ``<script>alert(1)</script>`` is text to Graphviz, which escapes it again in SVG.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from thunderviz.render.markup import counted
from thunderviz.trace.attribution import SPAN, region_modules, top_group
from thunderviz.trace.buckets import Bucket
from thunderviz.trace.diff import sent_bytes
from thunderviz.trace.model import OpRecord, TensorRef, TraceSnapshot, short_op_name
from thunderviz.trace.units import format_bytes

__all__ = [
    "INPUT_NODE",
    "RECOMPUTED_MARK",
    "GraphView",
    "Group",
    "dot_available",
    "dot_escape",
    "format_bytes",
    "fused_summary",
    "graph_view",
    "group_holding",
    "group_ops",
    "inner_node",
    "node_metadata",
    "op_importance",
    "op_summary",
    "render_dot",
    "short_op_name",
    "to_dot",
    "to_svg",
]

_COLLECTIVE_STYLE = 'shape=hexagon, style="filled,bold", fillcolor="#f4a261", color="#9c4a00"'
_WAIT_STYLE = 'shape=octagon, style="filled,dashed", fillcolor="#ffe08a", color="#8a6d00"'
_OP_STYLE = 'shape=box, style="filled,rounded", fillcolor="#ffffff", color="#8aa1b8"'
_INPUT_STYLE = 'shape=box, style="filled,rounded,dashed", fillcolor="#f4f7fa", color="#5b6b7c"'
_GROUP_STYLE = 'shape=box, style="filled,rounded,bold", fillcolor="#dbe9f6", color="#3d6e9e"'
#: ops backward recomputes (activation checkpointing, ZERO3) and the groups holding them: dashed, violet
_RECOMPUTED_OP_STYLE = 'shape=box, style="filled,rounded,dashed", fillcolor="#f1e8fb", color="#6a3d9a"'
_RECOMPUTED_GROUP_STYLE = 'shape=box, style="filled,rounded,bold,dashed", fillcolor="#ece1f7", color="#6a3d9a"'
#: how a label marks recomputation (graph nodes, the HTML report)
RECOMPUTED_MARK = "\u21bb"
_MAX_LABEL = 40

# What a block's summary names first: the ops that cost (matmul, attention, embedding), then norms, softmax and
# reductions, then elementwise math; views and reshapes last (a block's commonest ops, and the least telling).
_HEAVY = ("linear", "matmul", "mm", "bmm", "addmm", "attention", "sdpa", "flash", "conv", "embedding")
_NORMS = (
    "norm",
    "var_mean",
    "rsqrt",
    "softmax",
    "gelu",
    "erf",
    "relu",
    "silu",
    "tanh",
    "entropy",
    "nll",
    "sum",
    "mean",
    "exp",
    "log",
)
_VIEWS = (
    "unsqueeze",
    "squeeze",
    "expand",
    "reshape",
    "view",
    "permute",
    "transpose",
    "shallow_copy",
    "broadcast",
    "slice",
    "split",
    "contiguous",
    "cat",
    "getitem",
    "flatten",
    "stride",
    "convert_element_type",
    "clone",
)


@dataclass
class Group:
    """The ops of one collapsed block, in trace order; ``bucket`` is set for a bucket's communication (its pack,
    collective, wait and unpack: one node of its own, see ``trace.attribution``)."""

    id: str
    name: str
    ops: list[OpRecord] = field(default_factory=list)
    bucket: Bucket | None = None

    @property
    def collectives(self) -> list[OpRecord]:
        return [op for op in self.ops if op.is_collective]

    @property
    def waits(self) -> list[OpRecord]:
        return [op for op in self.ops if op.is_wait]

    @property
    def compute(self) -> list[OpRecord]:
        return [op for op in self.ops if op.collective is None]

    @property
    def recomputed(self) -> list[OpRecord]:
        """Ops that recompute forward values in backward (activation checkpointing, ZERO3): drawn dashed."""
        return [op for op in self.ops if op.recomputed]

    @property
    def work(self) -> list[OpRecord]:
        """The compute ops as a person counts them: each fusion region whose ops were captured as those ops."""
        return [i for op in self.compute for i in ([x for x in op.inner if not x.is_bookkeeping] or [op])]

    @property
    def regions(self) -> list[OpRecord]:
        return [op for op in self.ops if op.fused]

    @property
    def spans(self) -> list[str]:
        """The modules this group's fusion regions run (several for a region named ``blocks.3 -> lm_head``), in order;
        [] for a group of one module's ops."""
        mods = dict.fromkeys(m for op in self.regions for m in region_modules(op))
        return list(mods) if SPAN in self.name or len(mods) > 1 else []


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


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def dot_escape(text: str) -> str:
    """Make ``text`` safe inside a double-quoted DOT string (also neutralises Graphviz's ``\\N``-style escapes).

    Control characters other than newline and tab are dropped: Graphviz rejects some of them, and they are never
    part of a name a person should read.
    """
    text = _CONTROL.sub("", text)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def op_importance(name: str) -> int:
    """0 for the ops that cost (matmul, attention, ...), 1 norms and reductions, 2 elementwise, 3 views/reshapes."""
    if any(k in name for k in _HEAVY):
        return 0
    if any(name == k or name.startswith(k) for k in _VIEWS):
        return 3
    return 1 if any(k in name for k in _NORMS) else 2


def op_summary(ops: list[OpRecord]) -> list[tuple[str, int]]:
    """``[("linear", 4), ("matmul", 2), ("softmax", 1), ...]``: counts by short op name, the ops that matter first
    (``op_importance``), then by count."""
    counts = Counter(short_op_name(op.op) for op in ops)
    return sorted(counts.items(), key=lambda kv: (op_importance(kv[0]), -kv[1], kv[0]))


def _clip(text: str, n: int = _MAX_LABEL) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def group_ops(snapshot: TraceSnapshot, *, include_bookkeeping: bool = False) -> list[Group]:
    """Split the trace's ops into collapsed groups, ordered by the median position of their compute ops.

    Not by their first op: FSDP issues every all_gather at the top of the forward trace, in parameter-name
    order, and thunder hoists a few cheap ops (a mask's ``arange``, a weight's ``unsqueeze``) far ahead of
    their block; the median is where the block's work actually happens.
    """
    by_name: dict[str, list[OpRecord]] = {}
    for op in snapshot.ops:
        if op.is_bookkeeping and not include_bookkeeping:
            continue
        by_name.setdefault(top_group(op.module), []).append(op)

    def position(ops: list[OpRecord]) -> float:
        idx = [op.index for op in ops if op.collective is None] or [op.index for op in ops]
        return idx[len(idx) // 2]

    names = sorted(by_name, key=lambda n: position(by_name[n]))
    buckets = {b.group: b for b in snapshot.buckets if len(b.params) > 1}
    return [Group(id=f"g{i}", name=n, ops=by_name[n], bucket=buckets.get(n)) for i, n in enumerate(names)]


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


def group_holding(groups: list[Group], name: str) -> str | None:
    """The group a module is drawn in: its own, else the group whose fusion regions run most of its ops (``ln_f`` is
    in ``blocks.3 -> lm_head``); None when no group holds it."""
    if any(g.name == name for g in groups):
        return name
    holding = {g.name: sum(top_group(i.module) == name for op in g.regions for i in op.inner) for g in groups}
    best = max(holding, key=lambda n: holding[n], default=None)
    return best if best is not None and holding[best] else None


def _op_label(op: OpRecord, param_names: dict[str, str], bucket: Bucket | None = None) -> str:
    out = op.outputs[0].short() if op.outputs else ""
    more = f" +{len(op.outputs) - 1}" if len(op.outputs) > 1 else ""
    label = short_op_name(op.op) + (f" {RECOMPUTED_MARK} recomputed" if op.recomputed else "")
    if op.fused:
        label += f"\n{fused_summary(op)}"
    elif op.is_collective and bucket is not None and len(bucket.params) > 1:
        label += f"\n{_clip(bucket.summary, 32)}"
    elif op.is_collective and op.inputs:
        # A parameter's name when the collective reads one (forward all_gather), else the module whose
        # gradient it carries (backward reduce_scatter): proxy names like t3853 tell a person nothing.
        name = param_names.get(op.inputs[0].name) or op.module or op.inputs[0].name
        label += "\n" + _clip(name, 28)
    return f"{label}\n{out}{more}" if out else label


def fused_summary(op: OpRecord, limit: int = 4) -> str:
    """``fuses 7 ops: linear, div, erf, mul +1``: what a fusion region runs as one kernel call, by distinct op."""
    names = list(dict.fromkeys(short_op_name(n) for n in op.fused))
    shown = ", ".join(names[:limit]) + (f" +{len(names) - limit}" if len(names) > limit else "")
    return _clip(f"fuses {len(op.fused)} op{'s' if len(op.fused) != 1 else ''}: {shown}", 44)


def _op_tooltip(op: OpRecord) -> str:
    lines = [op.python or op.op]
    if op.module:
        lines.append(f"module: {op.module}")
    if op.source is not None:
        lines.append(f"{op.source.short()}: {op.source.code}")
    return _clip("\n".join(lines), 600)


def _coll_summary(g: Group, buckets: dict[int, Bucket]) -> tuple[str, int]:
    kinds = Counter(short_op_name(op.collective or "") for op in g.collectives)
    nbytes = sum(sent_bytes(op, buckets) for op in g.collectives)
    parts = [f"{n}\u00d7 {k}" for k, n in kinds.items()]
    if g.waits:
        parts.append(f"{len(g.waits)}\u00d7 wait")
    # Buckets (thunderviz's communication pass): what each packed collective carries, by its short name.
    named = [b for op in g.collectives if (b := buckets.get(op.index)) is not None and len(b.params) > 1]
    for b in named[:3]:
        parts.append(_clip(b.short_name, 44))
    if len(named) > 3:
        parts.append(f"+{len(named) - 3} more buckets")
    return "\n".join(parts), nbytes


def _bucket_tooltip(g: Group, buckets: dict[int, Bucket]) -> str:
    """Short names only; the parameter lists are in the node's details (click)."""
    lines = [f"{g.name}: collectives (click for the parameters)"]
    for op in g.collectives:
        b = buckets.get(op.index)
        if b is not None:
            lines.append(b.short_name)
    return _clip("\n".join(lines), 600)


def _bucket_meta(b: Bucket | None) -> dict[str, Any] | None:
    if b is None:
        return None
    return {
        "label": b.label,
        "name": b.short_name,
        "kind": b.kind,
        "params": list(b.params),
        "bytes": b.bytes,
        "dtype": b.dtype,
    }


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
    draw = _Drawing(snapshot, id_prefix)
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


#: The node id of the forward trace's inputs (the batch): where a forward graph starts reading.
INPUT_NODE = "in"


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


def inner_node(region: OpRecord, k: int) -> str:
    """The node id of a fusion region's ``k``-th op, drawn when its group is open."""
    return f"op{region.index}_{k}"


def _header(snapshot: TraceSnapshot, title: str | None) -> list[str]:
    return [
        "digraph trace {",
        '  graph [rankdir=TB, nodesep=0.25, ranksep=0.35, fontname="Helvetica", fontsize=13, '
        f'labelloc=t, label="{dot_escape(_clip(title or snapshot.label, 80))}"];',
        '  node [fontname="Helvetica", fontsize=12, margin="0.08,0.03", height=0.3];',
        '  edge [color="#7f8c99", arrowsize=0.6];',
    ]


class _Drawing:
    """The node lines of one graph, and ``nodes`` (node id -> metadata) filled in as they are drawn."""

    def __init__(self, snapshot: TraceSnapshot, id_prefix: str) -> None:
        self.snapshot = snapshot
        self.prefix = id_prefix
        self.pn = snapshot.param_names
        self.buckets = snapshot.buckets_by_issue()
        self.nodes: dict[str, dict[str, Any]] = {}

    def input_node(self, inputs: dict[int, TensorRef]) -> str:
        """One node for the batch: ``input`` and each tensor's name, dtype and shape (the first three)."""
        tensors = list(inputs.values())
        lines = [f"{t.name}: {t.short()}" for t in tensors[:3]] + (
            [f"+{len(tensors) - 3} more"] if len(tensors) > 3 else []
        )
        self.nodes[INPUT_NODE] = {"kind": "input", "tensors": [_tensor_meta(t, self.pn) for t in tensors]}
        text = "input\n" + "\n".join(_clip(x) for x in lines)
        return (
            f'  {INPUT_NODE} [id="{self.prefix}{INPUT_NODE}", label="{dot_escape(text)}", tooltip="the trace\'s '
            f'inputs", {_INPUT_STYLE}];'
        )

    def open_group(self, g: Group) -> list[str]:
        """An expanded group: a cluster with one node per op."""
        lines = [
            f"  subgraph cluster_{g.id} {{",
            f'    label="{dot_escape(_clip(g.name))}"; style="rounded,filled"; fillcolor="#f3f7fb"; '
            f'color="#3d6e9e"; id="{self.prefix}{g.id}"; tooltip="{dot_escape(g.name)}";',
        ]
        for op in g.ops:
            if op.inner:
                lines += self._open_region(op, g)
                continue
            lines.append(self._op_node(op, g, f"op{op.index}", self.buckets.get(op.index)))
        lines.append("  }")
        return lines

    def _op_node(self, op: OpRecord, g: Group, nid: str, bucket: Bucket | None = None, indent: str = "    ") -> str:
        style = (
            _COLLECTIVE_STYLE
            if op.is_collective
            else _WAIT_STYLE
            if op.is_wait
            else _RECOMPUTED_OP_STYLE
            if op.recomputed
            else _OP_STYLE
        )
        label = _op_label(op, self.pn, bucket)
        self.nodes[nid] = _op_meta(op, g, self.pn, bucket)
        return (
            f'{indent}{nid} [id="{self.prefix}{nid}", label="{dot_escape(label)}", '
            f'tooltip="{dot_escape(_op_tooltip(op))}", {style}];'
        )

    def _open_region(self, region: OpRecord, g: Group) -> list[str]:
        """A fusion region opened in place: a frame named for it around its ops, which sit in a frame per module
        when it spans several (the region ``blocks.3 -> lm_head`` shows ``blocks.3``, ``ln_f`` and ``lm_head``)."""
        rid = f"op{region.index}"
        lines = [
            f"    subgraph cluster_{rid} {{",
            f'      label="{dot_escape(_clip(region.op) + chr(10) + fused_summary(region))}"; style="rounded,dashed"; '
            f'color="#8a6d00"; id="{self.prefix}{rid}"; tooltip="{dot_escape(_op_tooltip(region))}";',
        ]
        self.nodes[rid] = {**_op_meta(region, g, self.pn), "kind": "region", "modules": region_modules(region)}
        by_module: dict[str, list[tuple[int, OpRecord]]] = {}
        for k, op in enumerate(region.inner):
            if not op.is_bookkeeping:
                by_module.setdefault(top_group(op.module), []).append((k, op))
        framed = len(by_module) > 1
        for n, (module, ops) in enumerate(by_module.items()):
            if framed:
                lines.append(
                    f'      subgraph cluster_{rid}m{n} {{ label="{dot_escape(_clip(module))}"; style="rounded"; '
                    f'color="#3d6e9e";'
                )
            for k, op in ops:
                nid = inner_node(region, k)
                lines.append(self._op_node(op, g, nid, indent="        "))
                # the index is the region's (what diff marks and search key on); its place in the region: position
                self.nodes[nid] |= {"index": region.index, "in_region": region.op, "position": k}
            if framed:
                lines.append("      }")
        lines.append("    }")
        return lines

    def collapsed_group(self, g: Group) -> list[str]:
        """A collapsed group: one node for its compute (op count, commonest ops) and one for its collectives; a
        bucket's communication is one collective node."""
        if g.bucket is not None:
            return [self._bucket_node(g, g.bucket)]
        work = g.work
        label = f"{_clip(g.name)}\n{counted(len(work), 'op')}"
        if g.regions:  # "71 ops in 1 fusion region" when the regions are all it runs
            alone = all(op.fused for op in g.compute)
            label += f"{' in' if alone else ','} {counted(len(g.regions), 'fusion region')}"
        top = op_summary(work)[:3]
        if top:
            label += "\n" + ", ".join(f"{n} {k}" for k, n in top)
        if g.spans:
            label += "\n" + _clip("spans " + ", ".join(g.spans), 44)
        recomputed = g.recomputed
        if recomputed:
            label += f"\n{RECOMPUTED_MARK} {len(recomputed)} recomputed"
        style = _RECOMPUTED_GROUP_STYLE if recomputed else _GROUP_STYLE
        tip = (
            f" ({counted(len(recomputed), 'op')} recompute forward values instead of reading saved ones)"
            if recomputed
            else ""
        )
        spans = f" (one fusion region spanning {', '.join(g.spans)})" if g.spans else ""
        lines = [
            f'  {g.id} [id="{self.prefix}{g.id}", label="{dot_escape(label)}", tooltip="{dot_escape(g.name)}{spans}'
            f'{tip}: click to expand", {style}];'
        ]
        self.nodes[g.id] = _group_meta(g, self.snapshot)
        if g.collectives or g.waits:
            lines.append(self._collectives_node(g))
        return lines

    def _bucket_node(self, g: Group, b: Bucket) -> str:
        """``all_gather blocks.0`` / ``12 params, 97.6 KiB`` / ``wait 44 ops later``: its parameters on click."""
        waits = [op for op in g.ops if op.is_wait]
        between = (
            [op for op in self.snapshot.ops[b.issue_index + 1 : waits[0].index] if not op.is_bookkeeping]
            if (waits and b.issue_index >= 0)
            else None
        )
        # The wait is the (n+1)th op after the collective: the same distance the ledger prints.
        gap = "" if between is None else f"\nwait {counted(len(between) + 1, 'op')} later"
        text = f"{_clip(b.group)}\n{b.summary.split(' (', 1)[1].rstrip(')')}{gap}"
        self.nodes[g.id] = {
            "kind": "collectives",
            "group": g.name,
            "group_id": g.id,
            "bucket": _bucket_meta(b),
            "ops": [_op_meta(op, g, self.pn, self.buckets.get(op.index)) for op in g.ops if op.collective is not None],
        }
        tip = f"{b.short_name}: pack, {b.kind}, wait, unpack (click for its {len(b.params)} parameters)"
        return (
            f'  {g.id} [id="{self.prefix}{g.id}", label="{dot_escape(text)}", tooltip="{dot_escape(tip)}", '
            f"{_COLLECTIVE_STYLE}];"
        )

    def _collectives_node(self, g: Group) -> str:
        text, nbytes = _coll_summary(g, self.buckets)
        if nbytes:
            text += f"\n{format_bytes(nbytes)}"
        cid = f"{g.id}c"
        self.nodes[cid] = {
            "kind": "collectives",
            "group": g.name,
            "group_id": g.id,
            "ops": [_op_meta(op, g, self.pn, self.buckets.get(op.index)) for op in g.ops if op.collective is not None],
        }
        return (
            f'  {cid} [id="{self.prefix}{cid}", label="{dot_escape(text)}", '
            f'tooltip="{dot_escape(_bucket_tooltip(g, self.buckets))}", {_COLLECTIVE_STYLE}];'
        )


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


def _tensor_meta(t: Any, pn: dict[str, str]) -> dict[str, Any]:
    return {
        "name": pn.get(t.name, t.name),
        "shape": None if t.shape is None else list(t.shape),
        "dtype": t.dtype,
        "device": t.device,
        "kind": t.kind,
    }


def _op_meta(op: OpRecord, g: Group, pn: dict[str, str], bucket: Bucket | None = None) -> dict[str, Any]:
    return {
        "bucket": _bucket_meta(bucket),
        "kind": "collective" if op.is_collective else "wait" if op.is_wait else "op",
        "index": op.index,
        "op": op.op,
        "group": g.name,
        "module": op.module,
        "recomputed": op.recomputed,
        "python": op.python,
        "source": None if (src := op.source) is None else {"file": src.file, "line": src.line, "code": src.code},
        "inputs": [_tensor_meta(t, pn) for t in op.inputs],
        "outputs": [_tensor_meta(t, pn) for t in op.outputs],
    }


def _group_meta(g: Group, snap: TraceSnapshot) -> dict[str, Any]:
    modules = Counter(i.module for op in g.ops for i in (op.inner or (op,)) if i.module)
    sources = Counter(f"{op.source.short()}: {op.source.code}" for op in g.ops if op.source is not None)
    return {
        "kind": "group",
        "id": g.id,
        "name": g.name,
        "n_ops": len(g.ops) - len(g.compute) + len(g.work),
        "n_compute": len(g.work),  # a fusion region counts the ops it runs
        "n_recomputed": len(g.recomputed),
        "first_index": g.ops[0].index if g.ops else None,
        "last_index": g.ops[-1].index if g.ops else None,
        "op_counts": dict(op_summary(g.work)),
        "spans": g.spans,
        "regions": {op.op: len(op.fused) for op in g.regions},
        "collectives": dict(Counter(op.collective for op in g.ops if op.collective)),
        "modules": dict(modules.most_common()),
        "sources": [s for s, _ in sources.most_common(8)],
    }


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
