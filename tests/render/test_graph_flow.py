"""The collapsed graph follows the data flow: communication sits in its bucket's node, forward reads
input -> embeddings -> blocks -> norm -> head, backward the reverse; on the tutorial's model and a litgpt GPT, from
real 2-rank FSDP ZERO3 traces with the default BLOCK buckets. And with thunder's torchcompile executor (ZERO2), each
fusion region sits where its ops belong, or is named for the modules it spans, and every module stays findable."""

from __future__ import annotations

import pytest

from tests.helpers.bucketed_traces import bucketed_trace_files
from thunderviz.render.graph import dot_available, graph_view, render_dot
from thunderviz.render.graph_groups import group_holding
from thunderviz.render.graph_nodes import INPUT_NODE
from thunderviz.trace.file import load

pytestmark = pytest.mark.timeout(900)

TINY = ["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"]
LITGPT = ["transformer.wte", *(f"transformer.h.{i}" for i in range(4)), "transformer.ln_f", "lm_head"]
#: the fused run's model: the tutorial's with 2 blocks (``bucketed_traces.RUNS``)
FUSED = ["wte", "wpe", "blocks.0", "blocks.1", "ln_f", "lm_head"]


@pytest.fixture(scope="module")
def bundles():
    files = bucketed_trace_files()
    return {run: load(files[run][0])[0] for run in ("zero3", "litgpt", "fused")}


def _module_order(view) -> list[str]:
    """The model's blocks in graph order; litgpt's root-level RoPE buffers (``(root)``: their few shared views)
    are checked apart."""
    return [g.name for g in view.groups if g.bucket is None and g.name != "(root)"]


@pytest.mark.parametrize(("run", "order"), [("zero3", TINY), ("litgpt", LITGPT)])
@pytest.mark.parametrize("label", ["forward", "backward"])
def test_modules_follow_the_data_flow_and_communication_sits_in_bucket_nodes(bundles, run, order, label):
    snap = bundles[run].traces()[label]
    view = graph_view(snap)
    want = order if label == "forward" else order[::-1]
    assert _module_order(view) == want
    root = [g for g in view.groups if g.name == "(root)"]
    assert len(root) <= 1 and all(len(g.compute) <= 8 for g in root), [(g.name, len(g.ops)) for g in root]
    # Every collective and wait, and every pack/unpack of a bucket, is drawn by the bucket's own node.
    buckets = {b.group for b in snap.buckets if len(b.params) > 1}
    assert buckets and {g.name for g in view.groups if g.bucket is not None} == buckets
    for g in view.groups:
        comm = [op for op in g.ops if op.collective is not None or "pack" in op.op]
        assert not comm or g.bucket is not None, (g.name, [op.op for op in comm])
    # Edges between module blocks only go forward in that order (no block feeds an earlier one).
    rank = {g.id: want.index(g.name) for g in view.groups if g.name in want}
    for line in view.dot.splitlines():
        if "->" in line:
            a, b = line.split("[")[0].replace(" ", "").split("->")
            if a in rank and b in rank:
                assert rank[a] < rank[b], (line, view.groups)
    if label == "forward":  # the batch enters at the top, into the embedding
        assert view.nodes[INPUT_NODE]["kind"] == "input"
        first = next(g.id for g in view.groups if g.name == want[0])
        assert f"{INPUT_NODE} -> {first} " in view.dot


@pytest.mark.skipif(not dot_available(), reason="needs the Graphviz `dot` binary")
@pytest.mark.parametrize("run", ["zero3", "litgpt"])
def test_the_laid_out_graph_reads_top_to_bottom_in_data_flow_order(bundles, run):
    """What a person sees: Graphviz puts each block below the one it reads from (forward), and above the one its
    gradient flows to (backward)."""
    for label in ("forward", "backward"):
        view = graph_view(bundles[run].traces()[label])
        plain = render_dot(view.dot, "plain").decode()
        y = {p[1]: float(p[3]) for p in (line.split() for line in plain.splitlines()) if p and p[0] == "node"}
        heights = [y[g.id] for g in view.groups if g.bucket is None and g.name != "(root)"]
        assert heights == sorted(heights, reverse=True), (label, list(zip(_module_order(view), heights, strict=True)))


@pytest.mark.parametrize("label", ["forward", "backward"])
def test_a_bucket_node_says_when_it_is_waited_for_as_the_ledger_does(bundles, label):
    """``wait N ops later`` on a bucket node is the ledger's collective-to-wait distance, not one less."""
    import re

    from thunderviz.trace.ledger import ledger_from_bundle

    bundle = bundles["zero3"]
    snap = bundle.traces()[label]
    view = graph_view(snap)
    distances = {
        (e.kind, e.bucket): e.distance
        for e in ledger_from_bundle(bundle).entries
        if e.trace == label and e.distance is not None
    }
    drawn = {}
    for line in view.dot.splitlines():
        found = re.search(r'label="([^"]*?)\\n[^"]*?\\nwait (\d+) ops? later"', line)
        if found:
            drawn[found.group(1)] = int(found.group(2))
    assert drawn and len(drawn) == len(snap.buckets), (drawn, view.dot[:2000])
    for b in snap.buckets:
        assert drawn[b.group] == distances[(b.kind, b.label)], (b.group, drawn, distances)


@pytest.mark.parametrize("label", ["forward", "backward"])
def test_fusion_regions_sit_in_their_module_or_are_named_for_the_modules_they_span(bundles, label):
    """It drew the ZERO2 forward's last region, which runs the last block's MLP, ln_f and lm_head, as "lm_head · 1 op"
    beside no node of that block, ln_f or wte; and the backward's first (212 ops) as "blocks.3 · 1 op"."""
    snap = bundles["fused"].traces()[label]
    regions = snap.fusion_regions
    assert regions and all(op.inner and len(op.inner) == len(op.fused) for op in regions)
    view = graph_view(snap)
    spans = {g.name: g.spans for g in view.groups if g.spans}
    last = "blocks.1 -> lm_head" if label == "forward" else "lm_head -> blocks.1"
    assert spans[last] == (["blocks.1", "ln_f", "lm_head"] if label == "forward" else ["lm_head", "ln_f", "blocks.1"])
    if label == "backward":  # a region of one block's gradients is drawn as that block
        assert [g.name for g in view.groups if g.name.startswith("blocks.") and not g.spans] == ["blocks.0"]
    # every module of the model is findable: drawn as a group, or named by the region that runs it
    for module in FUSED:
        assert group_holding(view.groups, module) is not None, (module, [g.name for g in view.groups])
    assert group_holding(view.groups, "ln_f") == last
    # the region counts the ops it runs, not itself ("1 op · 1 TorchCompile5"), and says what it spans
    node = next(line for line in view.dot.splitlines() if f'label="{last}\\n' in line)
    assert "1 op" not in node and "in 1 fusion region" in node and "spans " in node and "ln_f" in node, node
    order = [g.name for g in view.groups if g.bucket is None]
    assert order[-1 if label == "forward" else 0] == last  # in data-flow order like any block


@pytest.mark.parametrize("label", ["forward", "backward"])
def test_a_fusion_region_opens_to_its_ops_in_place(bundles, label):
    """Opening a region's group (or naming a module it runs: ``ln_f``) draws the region as a frame around its ops,
    one frame per module inside it; edges enter and leave at the ops that read and compute each tensor."""
    snap = bundles["fused"].traces()[label]
    view = graph_view(snap, ["ln_f"])
    (opened,) = [g for g in view.groups if g.id in view.expanded]
    (region,) = opened.regions
    rid = f"op{region.index}"
    assert f"subgraph cluster_{rid} {{" in view.dot and view.nodes[rid]["kind"] == "region"
    assert view.nodes[rid]["modules"] == opened.spans
    for module in opened.spans:  # the modules it spans, each framed inside it
        assert f'label="{module}"; style="rounded"' in view.dot, module
    inner = [n for n in view.nodes if n.startswith(f"{rid}_")]
    assert len(inner) == sum(not op.is_bookkeeping for op in region.inner)
    assert {view.nodes[n]["module"] for n in inner} >= {"ln_f", "lm_head"}
    edges = [line.split("[")[0].split("->") for line in view.dot.splitlines() if "->" in line]
    ends = {e.strip() for pair in edges for e in pair}
    assert rid not in ends and any(e.startswith(f"{rid}_") for e in ends)  # no edge to the frame itself
    if dot_available():
        assert render_dot(view.dot, "plain")  # Graphviz lays it out


def test_search_finds_a_module_inside_a_fusion_region(bundles):
    from thunderviz.notebook.viewdata import search_ops

    snap = bundles["fused"].forward
    hits, total = search_ops(snap, "ln_f")
    region = [h for h in hits if h["group"] == "blocks.1 -> lm_head"]
    assert total >= 10 and region and all(h["node"] == region[0]["node"] for h in region)
    hits, _ = search_ops(snap, "ln_f", expanded=["blocks.1 -> lm_head"])
    inside = [h for h in hits if h["group"] == "blocks.1 -> lm_head" and "_" in h["node"]]
    assert len({h["node"] for h in inside}) > 5  # each op of ln_f its own node once the region is open


def test_the_widget_opens_the_region_that_runs_a_module_asked_for_by_name(bundles):
    from tests.helpers.bucketed_traces import run_report
    from thunderviz.notebook.widgets import TraceView

    view = TraceView(run_report("fused", bucketed_trace_files()["fused"]), trace="forward")
    assert view.panes[0]["holding"]["ln_f"] == "blocks.1 -> lm_head"
    assert {"blocks.1", "ln_f", "lm_head"} <= {m for g in view.panes[0]["groups"] for m in g["spans"]}
    view.expand("ln_f")
    assert view.expanded == ["blocks.1 -> lm_head"]
    assert any(m.get("kind") == "region" for m in view.panes[0]["nodes"].values())
