"""The collapsed graph follows the data flow (issue 19): communication sits in its bucket's node, forward reads
input -> embeddings -> blocks -> norm -> head, backward the reverse; on the tutorial's model and a litgpt GPT, from
real 2-rank FSDP ZERO3 traces with the default BLOCK buckets."""

from __future__ import annotations

import pytest

from tests.helpers.bucketed_traces import bucketed_trace_files
from thunderviz.render.graph import INPUT_NODE, dot_available, graph_view, render_dot
from thunderviz.trace.file import load

pytestmark = pytest.mark.timeout(900)

TINY = ["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"]
LITGPT = ["transformer.wte", *(f"transformer.h.{i}" for i in range(4)), "transformer.ln_f", "lm_head"]


@pytest.fixture(scope="module")
def bundles():
    files = bucketed_trace_files()
    return {run: load(files[run][0])[0] for run in ("zero3", "litgpt")}


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
    """``wait N ops later`` on a bucket node is the ledger's collective-to-wait distance, not one less (issue 30)."""
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
