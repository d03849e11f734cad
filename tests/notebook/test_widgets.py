"""The trace widgets from plain Python: real traces in, synced state out, no browser.

Traces are real: a 2-rank thunder FSDP and DDP run of a 1-block GPT (``tests.helpers.trace_scenarios``,
shared with the trace-model tests) and single-process jitted models (``tests.helpers.trace_fixtures``), including
one whose source line and name carry markup. The comm is the real ``comm`` package's base class with
``publish_msg`` recording what would go over the wire: the transport seam, not a mock of the widget.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import traitlets

from tests.helpers import trace_fixtures as tf
from tests.helpers.bucketed_traces import bucketed_trace_files, run_report
from tests.helpers.trace_scenarios import two_rank_run
from thunderviz.cell.protocol import StrategySpec
from thunderviz.notebook import viewdata as vd
from thunderviz.notebook.compare import compare
from thunderviz.notebook.subject import subject_of, trace_names
from thunderviz.notebook.widgets import CompareView, RankStatus, TraceView
from thunderviz.parallel.decisions import Action, Case, Decision
from thunderviz.render.graph import dot_available
from thunderviz.render.graph_groups import group_ops
from thunderviz.render.graph_nodes import INPUT_NODE
from thunderviz.trace.diff import diff_traces, memory_changes
from thunderviz.trace.ledger import ledger_from_bundle
from thunderviz.trace.model import TraceBundle

pytestmark = pytest.mark.timeout(600)


# ---------------------------------------------------------------------------------------------- fixtures


class RecordingComm:
    """Stand-in for the kernel's comm: records every message a widget publishes."""

    def __init__(self, **kwargs: Any) -> None:
        import comm.base_comm

        class _Comm(comm.base_comm.BaseComm):
            def publish_msg(
                inner, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any
            ) -> None:
                self.sent.append((msg_type, data))

        self.sent: list[tuple[str, Any]] = []
        self.comm = _Comm(**kwargs)

    def updates(self) -> list[dict[str, Any]]:
        return [d["state"] for t, d in self.sent if t == "comm_msg" and d and d.get("method") == "update"]


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> list[RecordingComm]:
    import comm

    made: list[RecordingComm] = []

    def create(**kwargs: Any) -> Any:
        rec = RecordingComm(**kwargs)
        made.append(rec)
        return rec.comm

    monkeypatch.setattr(comm, "create_comm", create)
    return made


@pytest.fixture(scope="module")
def ranks() -> list[Any]:
    return two_rank_run()


@pytest.fixture(scope="module")
def fsdp(ranks: list[Any]) -> list[TraceBundle]:
    return [r.fsdp for r in ranks]


@pytest.fixture(scope="module")
def ddp(ranks: list[Any]) -> list[TraceBundle]:
    return [r.ddp for r in ranks]


def _from_browser(w: Any, **state: Any) -> None:
    """Apply a state update exactly as ipywidgets does when the front end sends one."""
    w._handle_msg({"content": {"data": {"method": "update", "state": state, "buffer_paths": []}}, "buffers": []})


# ---------------------------------------------------------------------------------------------- trace view


def test_trace_view_state_from_per_rank_bundles(fsdp: list[TraceBundle]) -> None:
    w = TraceView(fsdp)
    fwd = fsdp[0].forward
    assert w.trace == "forward" and w.traces[:2] == ["forward", "backward"]
    pane = w.panes[0]
    assert pane["n_ops"] == len(fwd.ops)
    assert pane["n_collectives"] == sum(1 for op in fwd.ops if op.is_collective) > 0
    groups = group_ops(fwd)
    assert [g["name"] for g in pane["groups"]] == [g.name for g in groups]
    # Collapsed: one node per group, plus one collectives node per module group that communicates (a bucket is a
    # collectives node itself), and the forward's input node.
    modules = [g for g in groups if g.bucket is None]
    expect_nodes = {g.id for g in groups} | {f"{g.id}c" for g in modules if g.collectives or g.waits} | {INPUT_NODE}
    assert set(pane["nodes"]) == expect_nodes
    for nid in expect_nodes:
        assert f'{nid} [id="{nid}"' in pane["dot"]
    led = w.panels["ledger"]
    assert led["ranks"] == [0, 1] and led["mismatches"] == [] and led["bad"] == []
    assert len(led["rows"]) == len(ledger_from_bundle(fsdp[0]).collectives())
    json.dumps(w.get_state(), allow_nan=False)  # what goes over the comm must be plain JSON


def test_trace_switch_recomputes_and_rejects_unknown(fsdp: list[TraceBundle]) -> None:
    w = TraceView(fsdp, trace="forward")
    fwd_dot = w.panes[0]["dot"]
    w.trace = "backward"
    assert w.panes[0]["n_ops"] == len(fsdp[0].backward.ops)
    assert w.panes[0]["dot"] != fwd_dot and "backward" in w.panes[0]["title"]
    stages = fsdp[0].stages
    # every pass of the forward pipeline, in order; a label thunder uses twice ("Delete Last Used") is numbered, not
    # dropped (the menu skipped the last pass)
    assert stages and len(w.traces[2:]) == len(stages) and w.traces[2] == stages[0].label
    assert [st.label for st in stages].count("Delete Last Used") == 2 and w.traces[-1] == "Delete Last Used (2)"
    assert (
        trace_names(fsdp[0])["Delete Last Used (2)"] == f"forward pass {len(stages)} of {len(stages)}: Delete Last Used"
    )
    w.trace = "Delete Last Used (2)"
    assert w.panes[0]["n_ops"] == len(stages[-1].ops)
    w.trace = stages[0].label  # a stage of the forward pipeline, before the distributed passes
    assert w.panes[0]["n_ops"] == len(stages[0].ops) and stages[0].label in w.panes[0]["title"]
    with pytest.raises(traitlets.TraitError, match="this view has"):
        w.trace = "sideways"
    with pytest.raises(ValueError, match="has \\['forward', 'backward'"):
        TraceView(fsdp, trace="sideways")


def test_expand_from_browser_syncs_new_graph_back(fsdp: list[TraceBundle], wire: list[RecordingComm]) -> None:
    w = TraceView(fsdp, trace="backward")
    rec = wire[-1]
    block = next(g for g in group_ops(fsdp[0].backward) if g.name.startswith("blocks."))
    rec.sent.clear()
    _from_browser(w, expanded=[block.name])
    assert w.expanded == [block.name]
    pane = w.panes[0]
    assert {g["name"] for g in pane["groups"] if g["expanded"]} == {block.name}
    assert {f"op{op.index}" for op in block.ops} <= set(pane["nodes"])
    assert f"cluster_{block.id}" in pane["dot"]
    # The recomputed panes went back to the browser, and not the expansion it sent us (it has that already).
    sent = rec.updates()
    assert any("panes" in s and s["panes"][0]["dot"] == pane["dot"] for s in sent)
    assert not any("expanded" in s for s in sent)
    w.collapse()
    assert w.expanded == [] and not any(g["expanded"] for g in w.panes[0]["groups"])
    with pytest.raises(ValueError, match="no such group"):
        w.expand("blocks.99")


def test_search_finds_a_parameters_all_gather(fsdp: list[TraceBundle], wire: list[RecordingComm]) -> None:
    w = TraceView(fsdp, trace="forward")
    fwd = fsdp[0].forward
    param = "blocks.0.mlp_fc.weight"
    assert param in fwd.param_names.values()
    _from_browser(w, search=param)
    ag = [m for m in w.matches if m["op"] == "all_gather"]
    assert len(ag) == 1 and param in ag[0]["label"]
    op = fwd.ops[ag[0]["index"]]
    assert op.collective == "all_gather" and fwd.param_names[op.inputs[0].name] == param
    gid = next(g.id for g in group_ops(fwd) if any(o.index == op.index for o in g.ops))
    assert ag[0]["node"] == f"{gid}c"  # collapsed: the block's collectives node holds it
    assert json.loads(json.dumps(wire[-1].updates()[-1]))["matches"] == w.matches
    w.expand(ag[0]["group"])
    assert next(m for m in w.matches if m["op"] == "all_gather")["node"] == f"op{op.index}"
    w.search = ""
    assert w.matches == [] and w.match_total == 0
    w.trace = "backward"
    w.search = "reduce_scatter"
    assert w.match_total == sum(1 for o in fsdp[0].backward.ops if o.collective == "reduce_scatter") > 0


def test_selected_collective_details_carry_ledger_rows(fsdp: list[TraceBundle]) -> None:
    w = TraceView(fsdp, trace="backward")
    nid = next(k for k, m in w.panes[0]["nodes"].items() if m["kind"] == "collectives")
    _from_browser(w, selected={"pane": 0, "node": nid})
    d = w.details
    assert d["kind"] == "collectives" and d["ops"]
    ledger = {(e.trace, e.op_index): e for e in ledger_from_bundle(fsdp[0]).entries}
    for m in d["ops"]:
        e = ledger[("backward", m["index"])]
        assert m["ledger"]["kind"] == e.kind and m["ledger"]["bytes"] == e.bytes
        if m["kind"] == "collective":
            assert m["ledger"]["group_size"] == 2 and m["ledger"]["tensor"].startswith("grad of ")
            assert isinstance(m["ledger"]["distance"], int)
        assert m["python"]  # the full trace line
    first = group_ops(fsdp[0].backward)[0]
    g = w.select(first.id)
    assert g["kind"] == "group" and g["name"] == first.name and g["n_ops"] == len(first.ops)
    assert w.selected == {"pane": 0, "node": first.id}
    with pytest.raises(ValueError, match="no such node"):
        w.select("nope")


def test_forward_op_details_have_source_line() -> None:
    w = TraceView(tf.gpt().bundle)
    name = w.panes[0]["groups"][0]["name"]
    w.expand(name)
    ops = [m for m in w.panes[0]["nodes"].values() if m["kind"] == "op" and m["source"]]
    assert ops, "forward ops carry the user's source line"
    assert all(m["source"]["file"].endswith(".py") and m["source"]["line"] > 0 for m in ops)
    assert any(m["outputs"] and m["outputs"][0]["shape"] for m in ops)


def test_ledger_panel_shows_cross_rank_mismatch(fsdp: list[TraceBundle], ddp: list[TraceBundle]) -> None:
    # Rank 1 ran DDP while rank 0 ran FSDP: real traces, really different collectives.
    r1 = dataclasses.replace(ddp[1], name=fsdp[0].name)
    w = TraceView([fsdp[0], r1])
    led = w.panels["ledger"]
    assert len(led["mismatches"]) == 1 and "Ranks 0 and 1 disagree at collective 1" in led["mismatches"][0]
    assert led["bad"] == [0]
    assert "Ranks 0 and 1 disagree" in w.to_html()


# ---------------------------------------------------------------------------------------------- comparison


def test_compare_ddp_vs_fsdp_summary_marks_and_sync(ddp: list[TraceBundle], fsdp: list[TraceBundle]) -> None:
    c = compare(ddp, fsdp)
    assert isinstance(c, CompareView) and c.trace == "forward"
    d = diff_traces(ddp[0].forward, fsdp[0].forward)
    n_params = len(fsdp[0].forward.param_names)
    assert d.collective_delta()["all_gather"] == n_params > 0
    memory = memory_changes(ddp[0], fsdp[0], "forward")
    assert memory and memory[0].startswith("trace estimate forward ")  # what sharding does to forward's peak
    assert c.summary == f"{ddp[0].name} \u2192 {fsdp[0].name} (forward): {'; '.join(d.summary_parts() + memory)}"
    assert "\u22120" not in c.summary and "~0" not in c.summary  # no empty terms
    left, right = c.panes
    assert sum(m["+"] for m in right["marks"].values()) == len(d.added)
    assert sum(m["-"] for m in left["marks"].values()) == len(d.removed)
    assert sum(m["~"] for m in right["marks"].values()) == sum(m["~"] for m in left["marks"].values()) == len(d.changed)
    assert left["prefix"] == "p0-" and right["prefix"] == "p1-" and 'id="p1-g0"' in right["dot"]
    page = c._repr_mimebundle_()["text/html"]  # the static picture: summary on top, both graphs
    assert (
        page.index(d.summary.split(";")[0])
        < page.index(f"<b>{left['title']}</b>")
        < page.index(f"<b>{right['title']}</b>")
    )
    assert page.count("<svg") == 2 if dot_available() else page.count("digraph trace") == 2
    c.trace = "backward"
    assert "reduce_scatter" in c.summary and "all_reduce" in c.summary
    assert c.diff.collective_delta().get("reduce_scatter", 0) > 0
    assert c.panels["diff"]["total"] == sum(1 for r in c.diff.rows if r.tag != "=")
    # One expansion list opens the same block on both sides.
    name = next(g["name"] for g in right["groups"] if g["name"].startswith("blocks."))
    c.expand(name)
    assert all(any(g["expanded"] for g in p["groups"] if g["name"] == name) for p in c.panes)


def test_compare_saved_files_by_name(ranks: list[Any]) -> None:
    path = ranks[0].path  # one file per rank, holding both the FSDP and the DDP bundle
    with pytest.raises(ValueError, match="pass name="):
        compare(path, path)
    c = compare([r.path for r in ranks], [r.path for r in ranks], name=("gpt-ddp", "gpt-fsdp"), trace="backward")
    assert c.title == "gpt-ddp vs gpt-fsdp"
    assert "+" in c.summary and "reduce_scatter" in c.summary
    with pytest.raises(ValueError, match="no traced object named 'nope'"):
        compare(path, path, name="nope")
    with pytest.raises(TypeError, match="thunderviz widgets show traces"):
        compare(object(), path)


def _statuses(pane: dict[str, Any]) -> dict[str, str]:
    """Drawn node -> its outline, nodes named by their group (a collectives node as ``<group> collectives``)."""
    out = {}
    for nid, mark in pane["marks"].items():
        meta = pane["nodes"][nid]
        name = meta.get("name") or (f"{meta['group']} collectives" if nid.endswith("c") else meta.get("group"))
        out[name if meta["kind"] != "op" else f"op{meta['index']}"] = mark["status"]
    return out


def test_compare_zero2_zero3_outlines_what_changed_and_says_a_verdict() -> None:
    """Both runs have blocks.0-3 and ln_f (ZERO3 adds unsqueeze/expand ops to them): outlined as changed,
    on both sides, with what changed on click; only ZERO3's re-gathering buckets are added; a verdict on top."""
    files = bucketed_trace_files()
    z2, z3 = run_report("zero2", files["zero2"]), run_report("zero3", files["zero3"])
    c = compare(z2, z3, trace="backward")
    assert c.runs == ["zero2", "zero3"]
    left, right = (_statuses(p) for p in c.panes)
    blocks = {f"blocks.{i}" for i in range(4)} | {"ln_f"}
    gathers = {f"all_gather blocks.{i}" for i in range(4)} | {"all_gather root"}
    assert left == dict.fromkeys(blocks, "changed")
    assert right == {**dict.fromkeys(blocks, "changed"), **dict.fromkeys(gathers, "added")}
    # clicking a changed block says what changed, by op name and count
    node = next(g["id"] for g in c.panes[1]["groups"] if g["name"] == "blocks.0")
    change = c.select(node, pane=1)["change"]
    assert change["status"] == "changed" and change["runs"] == ["zero2", "zero3"]
    assert change["ops_added"] == c.changes["blocks.0"].ops_added
    assert set(change["ops_added"]) == {"unsqueeze", "expand"}
    bucket = next(g["id"] for g in c.panes[1]["groups"] if g["name"] == "all_gather blocks.0")
    sent = c.select(bucket, pane=1)["change"]
    assert sent["status"] == "added" and sent["bytes_a"] == 0 < sent["bytes_b"]
    # the verdict: bytes per step, why, memory; in the static picture too
    assert c.verdict == vd.compare_verdict(c._a, c._b)
    assert c.verdict.startswith("zero3 sends ") and ": it gathers every block and root again in backward; " in c.verdict
    from thunderviz.render.markup import escape

    assert f"<p class='tv-verdict'>{escape(c.verdict)}</p>" in c.to_html()
    # an open block: its new ops added, its frame changed; zero2's side has nothing added
    c.expand("blocks.0")
    left, right = (_statuses(p) for p in c.panes)
    assert right["blocks.0"] == left["blocks.0"] == "changed"
    new_ops = {k for k, v in right.items() if k.startswith("op")}
    assert new_ops and {right[k] for k in new_ops} == {"added"}
    assert "added" not in left.values()
    # a measured step peak on both sides is the verdict's memory clause
    from thunderviz.trace.memory import StepMemory

    z2.step_memory = {0: StepMemory(3 * 2**20, "memtracker")}
    z3.step_memory = {0: StepMemory(2 * 2**20, "memtracker")}
    assert compare(z2, z3).verdict.endswith("; step peak (measured) \u22121.0 MiB")


# ---------------------------------------------------------------------------------------------- static view, safety


def test_static_html_and_text_repr_escape_user_markup() -> None:
    w = TraceView(tf.evil().bundle)
    w.expand(w.panes[0]["groups"][0]["name"])
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == repr(w) and "0x" not in repr(w)
    page = bundle["text/html"]
    assert tf.EVIL not in page and "<script" not in page.lower()
    assert "&lt;script&gt;" in page
    assert ("<svg" in page) == dot_available()
    assert ("<pre" in page) != dot_available()
    # The markup is data in the synced state; the front end only ever uses textContent for it.
    assert tf.EVIL in json.dumps(w.panes)


def test_front_end_never_injects_html() -> None:
    from thunderviz.notebook.widgets import _static

    for name in ("trace_view.js", "rank_status.js"):
        js = _static(name)
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in js, f"{name} uses {sink}"
        # the SVG namespace is a name, not an address: nothing is fetched from it
        urls = js.replace('"http://www.w3.org/2000/svg"', '""')
        assert "https://" not in urls and "http://" not in urls, f"{name} fetches something from the network"
        for fetch in ("fetch(", "XMLHttpRequest", "WebSocket"):  # (import() loads the vendored Graphviz we ship)
            assert fetch not in js, f"{name} uses {fetch}"
    assert "export{" in _static("graphviz-wasm.js")[-400:]  # the vendored module is the ES build
    import hashlib
    import re
    from pathlib import Path

    static = Path(__file__).resolve().parents[2] / "thunderviz" / "notebook" / "static"
    pinned = re.search(r"sha256 `([0-9a-f]{64})`", (static / "VENDORED.md").read_text()).group(1)
    assert hashlib.sha256((static / "graphviz-wasm.js").read_bytes()).hexdigest() == pinned


def test_repr_is_stable_for_nbval(fsdp: list[TraceBundle]) -> None:
    a, b = TraceView(fsdp), TraceView(fsdp)
    assert (
        repr(a)
        == repr(b)
        == (
            f"TraceView({fsdp[0].name!r}, trace='forward': {len(fsdp[0].forward.ops)} ops, "
            f"{a.panes[0]['n_collectives']} collectives, 2 rank(s))"
        )
    )


def test_rank_status_updates_and_validates(wire: list[RecordingComm]) -> None:
    s = RankStatus(2, label="cell 3")
    s.set_status(1, "running", "step 1")
    assert [r["state"] for r in s.ranks] == ["waiting", "running"]
    assert wire[-1].updates()[-1]["ranks"][1]["detail"] == "step 1"
    s.set_status(1, "failed", "<b>boom</b>")
    assert "&lt;b&gt;boom&lt;/b&gt;" in s._repr_mimebundle_()["text/html"]
    assert repr(s) == "RankStatus(0:waiting, 1:failed)"
    with pytest.raises(ValueError, match="use one of"):
        s.set_status(0, "sleeping")
    s.update({0: "collecting", 1: "done"})  # as the rank engine's on_status callback calls it
    assert [r["state"] for r in s.ranks] == ["collecting", "done"]
    with pytest.raises(ValueError, match=r"ranks are 0\.\.1"):
        s.set_status(2, "done")


def test_subject_of_rejects_and_accepts(fsdp: list[TraceBundle]) -> None:
    snap_subject = subject_of(fsdp[0].backward)
    assert snap_subject.primary.forward is fsdp[0].backward
    with pytest.raises(TypeError, match="expected TraceBundle"):
        subject_of([fsdp[0], 3])
    from thunderviz.render.html import Report

    decision = Decision("m", Case.RAW_MODULE, Action.JIT_AND_DISTRIBUTE, "r")
    subj = subject_of(Report(fsdp, decisions=[decision]))
    assert sorted(subj.bundles) == [0, 1] and subj.decisions == [decision]


def test_notebook_layer_data_code_needs_no_widget_libraries() -> None:
    from tests.helpers.fresh_interpreter import NOTEBOOK, light_paths, present

    assert present(light_paths().loaded["the notebook's view data"], NOTEBOOK) == []


def test_trace_view_of_a_rank_engine_report(fsdp: list[TraceBundle], ddp: list[TraceBundle]) -> None:
    import psutil

    from thunderviz.reports.run_report import RunReport

    # What the rank engine's bootstrap.collect returns per rank, built from real per-rank bundles.
    decision = Decision("TinyGPT", Case.RAW_MODULE, Action.JIT_AND_DISTRIBUTE, "a raw nn.Module")
    collected = {
        r: {
            "decisions": [decision],
            "bundles": {"gpt": fsdp[r]},  # every rank sends its bundles, as collect(keep_bundles=True) does
            "ledgers": {"gpt": ledger_from_bundle(fsdp[r])},
            "memory": {"rss_bytes": psutil.Process().memory_info().rss},
            "problems": [],
        }
        for r in (0, 1)
    }
    report = RunReport.from_ranks(
        collected,
        outputs={0: "", 1: ""},
        world_size=2,
        backend="gloo",
        strategy=StrategySpec("thunder_fsdp"),
        seconds=1.0,
    )
    w = TraceView(report, trace="backward")
    assert w.subject.title == "gpt" and sorted(w.subject.ledgers) == [0, 1]
    assert w.panels["decisions"] == [decision.to_dict()]
    memory = w.panels["memory"]
    assert [row["rank"] for row in memory["rows"]] == [0, 1]
    titles = [c["title"] for c in memory["columns"]]
    assert titles == ["trace estimate, forward", "trace estimate, backward", "saved tensors (trace)", "process RSS"], (
        titles
    )
    for row in memory["rows"]:  # every rank filled: its own bundle's estimates and its measured RSS
        assert row["est_peak_forward"] == fsdp[row["rank"]].forward.peak_memory_bytes > 0
        assert row["rss_bytes"] > 0
    assert {c["unit"] for c in memory["columns"]} == {"bytes"} and "estimate" in memory["note"]
    # Named like the cell, with the strategy's configuration: two runs of one model read apart.
    assert w.title == "FSDP ZERO2 BLOCK \u00b7 gpt: rank 0 of 2"
    report.name = "zero2"
    assert TraceView(report).title == "zero2: FSDP ZERO2 BLOCK \u00b7 gpt: rank 0 of 2"
    assert w.panels["ledger"]["mismatches"] == []
    # The Memory tab drew the cell's prediction twice (as the plan's candidate and again in MemTracker's
    # groups): once now, and every bar in the one account with its one colour.
    from tests.helpers.plans import synthetic_plan
    from thunderviz.trace.memory import ACCOUNT, COLORS, StepMemory

    plan = synthetic_plan({"ddp": 12_000, "fsdp-zero2-block": 10_000})
    report.prediction, report.prediction_name = plan.candidates[1].memory, "fsdp-zero2-block x2"
    parts = {
        "parameters": 2500,
        "gradients": 2500,
        "optimizer state": 0,
        "saved for backward": 4000,
        "temporaries": 900,
    }
    report.step_memory = {r: StepMemory(9_900, "memtracker", {"parameters": 2500}, (2, 3), parts=parts) for r in (0, 1)}
    bars = TraceView(report, plan=plan).panels["memory_view"]["bars"]
    assert [b["kind"] for b in bars] == ["predicted", "predicted", "measured", "measured"], bars
    report.plan = plan  # what --plan leaves on the report: the Memory tab draws it without plan=
    assert TraceView(report).panels["memory_view"]["bars"] == bars
    report.plan = None
    segments = [s for b in bars for s in b["segments"]]
    assert all(s["category"] in ACCOUNT and s["color"] == COLORS[s["category"]] for s in segments), segments
    assert [s["category"] for s in bars[2]["segments"]] == [
        "parameters",
        "gradients",
        "saved for backward",
        "temporaries",
    ]
    # Explicit decisions (saved trace files carry none) land in the same panel.
    w2 = TraceView(fsdp, decisions=[decision])
    assert w2.panels["decisions"] == [decision.to_dict()]
    # A RunReport on both sides of a comparison.
    c = compare(report, ddp, name=("gpt", None), trace="backward")
    assert c.title == "zero2: FSDP ZERO2 BLOCK vs gpt-ddp"
    assert [p["title"] for p in c.panes] == [
        "zero2: FSDP ZERO2 BLOCK \u00b7 gpt \u00b7 backward",
        "gpt-ddp \u00b7 backward",
    ]
    assert c.summary.startswith("zero2: FSDP ZERO2 BLOCK \u2192 gpt-ddp (backward): ")
    assert [r["side"] for r in c.panels["memory"]["rows"]] == ["zero2: FSDP ZERO2 BLOCK"] * 2 + ["gpt-ddp"] * 2
    same = compare(report, report, name="gpt")
    assert same.title == "zero2: FSDP ZERO2 BLOCK (left) vs zero2: FSDP ZERO2 BLOCK (right)"
    assert same.summary.endswith("(forward): no differences")
    assert c.diff.collective_delta() == {
        k: -v for k, v in compare(ddp, fsdp, trace="backward").diff.collective_delta().items()
    }


def test_public_compare_is_the_notebook_compare() -> None:
    import thunderviz
    from thunderviz.notebook import compare as compare_module

    assert thunderviz.compare is compare_module.compare
