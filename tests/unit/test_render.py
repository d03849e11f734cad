"""Graph and HTML rendering on real traces: readable defaults, expansion, metadata, escaping, CLI."""

from __future__ import annotations

import json
import re

import pytest

from tests.unit import trace_fixtures as tf
from thunderviz.cli import main
from thunderviz.core.module_paths import assign_modules
from thunderviz.core.traces import TraceBundle, load, save
from thunderviz.render.graph import dot_available, dot_escape, graph_view, short_op_name, to_dot, to_svg
from thunderviz.render.html import Report, render_html

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
    with pytest.raises(ValueError, match="no such group.*'blocks.0'"):
        to_dot(snap, expand={"blocks.7"})


def test_bookkeeping_ops_hidden_by_default():
    snap = tf.gpt().bundle.backward
    hidden = sum(len(g.ops) for g in graph_view(snap).groups)
    shown = sum(len(g.ops) for g in graph_view(snap, include_bookkeeping=True).groups)
    assert shown == len(snap.ops) and hidden == sum(1 for op in snap.ops if not op.is_bookkeeping) < shown


@pytest.mark.parametrize(
    "raw, short",
    [("torch_all_gather_prim_impl", "all_gather"), ("torch_wait_prim_impl", "wait"),
     ("torch.ops.aten.embedding_backward", "embedding_backward"), ("torch_prims_reshape_impl", "reshape"),
     ("linear", "linear")],  # fmt: skip
)
def test_short_op_names(raw, short):
    assert short_op_name(raw) == short


def test_dot_escape_neutralises_quotes_backslashes_and_newlines():
    assert dot_escape('a"b\\N\nc') == 'a\\"b\\\\N\\nc'


def _hostile_bundle(tmp_path) -> TraceBundle:
    """A real capture saved to a file, then the file edited so its module is named like markup.

    thunder 0.2.6 itself cannot jit a module with such a name (its prologue puts the raw name into a Python
    identifier and fails with SyntaxError), but a trace file is input from elsewhere and may say anything.
    """
    b = tf.evil().bundle
    path = save(b, tmp_path / "evil.json")
    doc = json.loads(path.read_text())
    for snap in [doc["bundles"][0]["forward"], doc["bundles"][0]["backward"]]:
        snap["param_names"] = {k: v.replace("proj", EVIL) for k, v in snap["param_names"].items()}
    path.write_text(json.dumps(doc))
    (loaded,) = load(path)
    assign_modules(loaded.forward, loaded.backward)
    return loaded


def test_thunder_cannot_jit_a_module_named_like_markup():
    import thunder
    import torch

    m = torch.nn.Module()
    m.add_module(EVIL, torch.nn.Linear(2, 2))
    m.forward = lambda x: getattr(m, EVIL)(x)
    with pytest.raises(SyntaxError):
        thunder.jit(m)(torch.randn(1, 2))


def test_markup_in_user_code_is_text_in_dot(tmp_path):
    b = _hostile_bundle(tmp_path)
    assert {g.name for g in graph_view(b.forward).groups} == {EVIL}
    for expand in (None, {EVIL}):
        dot = to_dot(b.forward, expand=expand, title=b.name)
        # Every quoted DOT string is well formed: no unescaped quote can end it early.
        for s in re.findall(r'"((?:[^"\\]|\\.)*)"', dot):
            assert '"' not in s.replace('\\"', "")
        assert EVIL in dot  # as label text, inside quotes


@needs_dot
def test_markup_in_user_code_is_escaped_in_svg(tmp_path):
    b = _hostile_bundle(tmp_path)
    svg = to_svg(to_dot(b.forward, expand={EVIL}, title=b.name))
    assert "<script" not in svg
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in svg


@pytest.mark.parametrize("svg", [pytest.param(True, marks=needs_dot), False])
def test_markup_in_user_code_is_escaped_in_html(tmp_path, svg):
    b = _hostile_bundle(tmp_path)
    decisions = [{"target": EVIL, "case": "1", "action": "jit", "reason": "</td><script>x()</script>"}]
    page = render_html([b], decisions=decisions, svg=svg)
    assert "<script>alert" not in page and "<script>x()" not in page
    assert page.count("<script") == 1  # ours, at the end
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;/td&gt;&lt;script&gt;x()&lt;/script&gt;" in page
    assert "# &lt;script&gt;alert(1)&lt;/script&gt; &quot;quoted&quot;" in page  # the recorded source line


@pytest.mark.parametrize("svg", [pytest.param(True, marks=needs_dot), False])
def test_html_is_self_contained(svg):
    page = render_html([tf.gpt().bundle, tf.function().bundle], svg=svg)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    assert ("<svg" in page) is svg
    assert "tiny-gpt" in page and "_mlp_loss" in page and "blocks.1" in page
    assert "Differences between jitted objects" in page  # two objects: a diff section


def test_report_repr_html_is_a_fragment():
    r = Report([tf.gpt().bundle], svg=False)
    frag = r._repr_html_()
    assert "<html" not in frag and "Overview" in frag and "tiny-gpt" in frag


def test_cli_render_writes_a_report_and_reports_bad_input(tmp_path, capsys):
    path = save(tf.gpt().bundle, tmp_path / "rank0.json")
    out = tmp_path / "sub" / "report.html"
    assert main(["render", str(path), "--out", str(out), "--no-svg"]) == 0
    assert "tiny-gpt" in out.read_text() and "wrote" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["render", str(bad), "--out", str(tmp_path / "x.html")]) == 1
    err = capsys.readouterr().err
    assert "thunderviz render:" in err and "bad.json" in err and "thunderviz.core.traces.save" in err
    with pytest.raises(SystemExit):
        main(["render"])  # argparse: TRACES is required
