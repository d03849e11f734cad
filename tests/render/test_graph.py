"""DOT for real traces: readable defaults, expansion, metadata, collectives set apart, escaping."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import trace_fixtures as tf
from tests.helpers.trace_fixtures import hostile_bundle
from tests.helpers.trace_scenarios import two_rank_run
from thunderviz.render.graph import dot_available, format_bytes, graph_view, short_op_name, to_dot, to_svg
from thunderviz.render.graph_nodes import dot_escape

EVIL = tf.EVIL
needs_dot = pytest.mark.skipif(not dot_available(), reason="Graphviz `dot` binary not installed")


def _node_ids(dot: str) -> set[str]:
    return set(re.findall(r"^\s+(\w+) \[id=", dot, flags=re.M))


def test_collapsed_view_has_one_node_per_block_and_is_short():
    snap = tf.gpt().bundle.backward
    view = graph_view(snap)
    names = [g.name for g in view.groups]
    # Backward runs the model in reverse; the embeddings' gradients come last, in either order.
    assert names[:4] == ["lm_head", "ln_f", "blocks.1", "blocks.0"] and set(names[4:]) == {"wpe", "wte"}
    assert _node_ids(view.dot) == {g.id for g in view.groups}  # no collectives on one process
    assert len(snap.ops) > 500 and len(view.nodes) == len(view.groups)
    labels = re.findall(r'label="([^"]*)"', view.dot)
    assert max(len(line) for lab in labels for line in lab.split("\\n")) <= 45
    meta = view.nodes[view.groups[2].id]
    assert meta["name"] == "blocks.1" and meta["n_ops"] == len(view.groups[2].ops)
    json.dumps(view.nodes)  # JSON-able for a browser widget


def test_expanding_a_group_shows_its_ops_and_keeps_others_collapsed():
    snap = tf.gpt().bundle.forward
    collapsed = graph_view(snap)
    block = next(g for g in collapsed.groups if g.name == "blocks.0")
    view = graph_view(snap, expand={"blocks.0"})
    ids = _node_ids(view.dot)
    assert {f"op{op.index}" for op in block.ops} <= ids
    assert block.id not in ids and {g.id for g in collapsed.groups if g is not block} <= ids
    assert f"subgraph cluster_{block.id}" in view.dot
    assert all(view.node_of[op.index] == f"op{op.index}" for op in block.ops)
    other = next(g for g in collapsed.groups if g is not block)
    assert {view.node_of[op.index] for op in other.ops} == {other.id}
    op_meta = view.nodes[f"op{block.ops[0].index}"]
    assert op_meta["group"] == "blocks.0" and op_meta["python"]
    assert to_dot(snap, expand={block.id}) == view.dot  # ids work as well as names
    with pytest.raises(ValueError, match=r"no such group.*'blocks\.0'"):
        to_dot(snap, expand={"blocks.7"})


def test_bookkeeping_ops_hidden_by_default():
    snap = tf.gpt().bundle.backward
    hidden = sum(len(g.ops) for g in graph_view(snap).groups)
    shown = sum(len(g.ops) for g in graph_view(snap, include_bookkeeping=True).groups)
    assert shown == len(snap.ops) and hidden == sum(1 for op in snap.ops if not op.is_bookkeeping) < shown


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        ("torch_all_gather_prim_impl", "all_gather"),
        ("torch_wait_prim_impl", "wait"),
        ("torch.ops.aten.embedding_backward", "embedding_backward"),
        ("torch_prims_reshape_impl", "reshape"),
        ("linear", "linear"),
    ],
)
def test_short_op_names(raw, short):
    assert short_op_name(raw) == short


def test_dot_escape_neutralises_quotes_backslashes_newlines_and_control_characters():
    assert dot_escape('a"b\\N\nc') == 'a\\"b\\\\N\\nc'
    assert dot_escape("x\r\x00\x1b[31my\tz") == "x[31my\tz"


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "n/a"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (793_088, "774.5 KiB"),
        (3 * 2**30, "3.0 GiB"),
        (2**200, f"{2**160}.0 TiB"),
    ],
)
def test_format_bytes_is_exact_for_any_size(n, text):
    assert format_bytes(n) == text


def test_fsdp_graph_sets_collectives_apart_in_each_block():
    ranks = two_rank_run()
    view = graph_view(ranks[0].fsdp.forward)
    coll_nodes = [k for k, m in view.nodes.items() if m["kind"] == "collectives"]
    assert {view.nodes[k]["group"] for k in coll_nodes} == {g.name for g in view.groups if g.collectives}
    assert sum(len(view.nodes[k]["ops"]) for k in coll_nodes) == 2 * len(ranks[0].param_names)
    assert re.search(r'g\d+c \[id="g\d+c", label="\d+\u00d7 all_gather\\n\d+\u00d7 wait', view.dot)
    assert "shape=hexagon" in view.dot
    assert all(view.node_of[op.index] == f"{g.id}c" for g in view.groups for op in g.ops if op.collective)


def test_thunder_cannot_jit_a_module_named_like_markup():
    import thunder
    import torch

    m = torch.nn.Module()
    m.add_module(EVIL, torch.nn.Linear(2, 2))
    m.forward = lambda x: getattr(m, EVIL)(x)
    with pytest.raises(SyntaxError):
        thunder.jit(m)(torch.randn(1, 2))


def test_markup_in_user_code_is_text_in_dot(tmp_path):
    b = hostile_bundle(tmp_path)
    assert {g.name for g in graph_view(b.forward).groups} == {EVIL}
    for expand in (None, {EVIL}):
        dot = to_dot(b.forward, expand=expand, title=b.name)
        # Every quoted DOT string is well formed: no unescaped quote can end it early.
        for s in re.findall(r'"((?:[^"\\]|\\.)*)"', dot):
            assert '"' not in s.replace('\\"', "")
        assert EVIL in dot  # as label text, inside quotes


@needs_dot
def test_markup_in_user_code_is_escaped_in_svg(tmp_path):
    b = hostile_bundle(tmp_path)
    svg = to_svg(to_dot(b.forward, expand={EVIL}, title=b.name))
    assert "<script" not in svg
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in svg


def test_a_fusion_region_is_one_node_naming_what_it_fuses():
    from dataclasses import replace

    from tests.helpers.small_traces import fsdp_bundle
    from thunderviz.render.graph_nodes import fused_summary

    b = fsdp_bundle(0)
    ops = list(b.forward.ops)
    ops[2] = replace(ops[2], op="TorchCompile0", fused=("linear", "div", "erf", "mul", "add", "mul"))
    op = ops[2]
    assert fused_summary(op) == "fuses 6 ops: linear, div, erf, mul +1"
    dot = to_dot(replace(b.forward, ops=ops), expand=["proj"])
    # one node: its label names the region and what it fuses (the tooltip repeats the name)
    assert dot.count("TorchCompile0\\nfuses 6 ops: linear, div, erf, mul +1") == 1, dot
