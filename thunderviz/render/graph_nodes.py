"""The nodes of a trace graph, as DOT lines and as the details a click shows: ops, collapsed blocks, buckets.

``render.graph`` decides which nodes a view draws (``render.graph_groups``) and joins them with edges; here each is
written: its label (short op names and shapes, what a block's ops are, what a bucket carries), its tooltip, its
style, and its JSON details (``nodes``). Everything that comes from user code goes through ``dot_escape`` into a
quoted DOT string, so a module named ``<script>`` is text to Graphviz, which escapes it again in SVG.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from thunderviz.render.graph_groups import Group, op_summary
from thunderviz.render.markup import counted
from thunderviz.trace.attribution import region_modules, top_group
from thunderviz.trace.buckets import Bucket
from thunderviz.trace.diff import sent_bytes
from thunderviz.trace.model import OpRecord, TensorRef, TraceSnapshot, short_op_name
from thunderviz.trace.units import format_bytes

__all__ = ["INPUT_NODE", "RECOMPUTED_MARK", "NodeDrawing", "clip_label", "dot_escape", "fused_summary", "inner_node"]

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


#: The node id of the forward trace's inputs (the batch): where a forward graph starts reading.
INPUT_NODE = "in"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def dot_escape(text: str) -> str:
    """Make ``text`` safe inside a double-quoted DOT string (also neutralises Graphviz's ``\\N``-style escapes).

    Control characters other than newline and tab are dropped: Graphviz rejects some of them, and they are never
    part of a name a person should read.
    """
    text = _CONTROL.sub("", text)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def clip_label(text: str, n: int = _MAX_LABEL) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def inner_node(region: OpRecord, k: int) -> str:
    """The node id of a fusion region's ``k``-th op, drawn when its group is open."""
    return f"op{region.index}_{k}"


def _op_label(op: OpRecord, param_names: dict[str, str], bucket: Bucket | None = None) -> str:
    out = op.outputs[0].short() if op.outputs else ""
    more = f" +{len(op.outputs) - 1}" if len(op.outputs) > 1 else ""
    label = short_op_name(op.op) + (f" {RECOMPUTED_MARK} recomputed" if op.recomputed else "")
    if op.fused:
        label += f"\n{fused_summary(op)}"
    elif op.is_collective and bucket is not None and len(bucket.params) > 1:
        label += f"\n{clip_label(bucket.summary, 32)}"
    elif op.is_collective and op.inputs:
        # A parameter's name when the collective reads one (forward all_gather), else the module whose
        # gradient it carries (backward reduce_scatter): proxy names like t3853 tell a person nothing.
        name = param_names.get(op.inputs[0].name) or op.module or op.inputs[0].name
        label += "\n" + clip_label(name, 28)
    return f"{label}\n{out}{more}" if out else label


def fused_summary(op: OpRecord, limit: int = 4) -> str:
    """``fuses 7 ops: linear, div, erf, mul +1``: what a fusion region runs as one kernel call, by distinct op."""
    names = list(dict.fromkeys(short_op_name(n) for n in op.fused))
    shown = ", ".join(names[:limit]) + (f" +{len(names) - limit}" if len(names) > limit else "")
    return clip_label(f"fuses {len(op.fused)} op{'s' if len(op.fused) != 1 else ''}: {shown}", 44)


def _op_tooltip(op: OpRecord) -> str:
    lines = [op.python or op.op]
    if op.module:
        lines.append(f"module: {op.module}")
    if op.source is not None:
        lines.append(f"{op.source.short()}: {op.source.code}")
    return clip_label("\n".join(lines), 600)


def _coll_summary(g: Group, buckets: dict[int, Bucket]) -> tuple[str, int]:
    kinds = Counter(short_op_name(op.collective or "") for op in g.collectives)
    nbytes = sum(sent_bytes(op, buckets) for op in g.collectives)
    parts = [f"{n}\u00d7 {k}" for k, n in kinds.items()]
    if g.waits:
        parts.append(f"{len(g.waits)}\u00d7 wait")
    # Buckets (thunderviz's communication pass): what each packed collective carries, by its short name.
    named = [b for op in g.collectives if (b := buckets.get(op.index)) is not None and len(b.params) > 1]
    for b in named[:3]:
        parts.append(clip_label(b.short_name, 44))
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
    return clip_label("\n".join(lines), 600)


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


class NodeDrawing:
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
        text = "input\n" + "\n".join(clip_label(x) for x in lines)
        return (
            f'  {INPUT_NODE} [id="{self.prefix}{INPUT_NODE}", label="{dot_escape(text)}", tooltip="the trace\'s '
            f'inputs", {_INPUT_STYLE}];'
        )

    def open_group(self, g: Group) -> list[str]:
        """An expanded group: a cluster with one node per op."""
        lines = [
            f"  subgraph cluster_{g.id} {{",
            f'    label="{dot_escape(clip_label(g.name))}"; style="rounded,filled"; fillcolor="#f3f7fb"; '
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
        title = clip_label(region.op) + "\n" + fused_summary(region)
        lines = [
            f"    subgraph cluster_{rid} {{",
            f'      label="{dot_escape(title)}"; style="rounded,dashed"; '
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
                    f'      subgraph cluster_{rid}m{n} {{ label="{dot_escape(clip_label(module))}"; style="rounded"; '
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
        label = f"{clip_label(g.name)}\n{counted(len(work), 'op')}"
        if g.regions:  # "71 ops in 1 fusion region" when the regions are all it runs
            alone = all(op.fused for op in g.compute)
            label += f"{' in' if alone else ','} {counted(len(g.regions), 'fusion region')}"
        top = op_summary(work)[:3]
        if top:
            label += "\n" + ", ".join(f"{n} {k}" for k, n in top)
        if g.spans:
            label += "\n" + clip_label("spans " + ", ".join(g.spans), 44)
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
        text = f"{clip_label(b.group)}\n{b.summary.split(' (', 1)[1].rstrip(')')}{gap}"
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
