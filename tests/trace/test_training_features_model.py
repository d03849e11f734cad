"""What activation checkpointing and no_backward_sync add to the trace model, on synthetic trace-model data: recomputed
backward ops and accumulated gradient buckets, through the file format, the diff, the ledger, the graph and the
report (the 2-rank runs in ``tests/strategies/test_features_2rank.py`` produce them from real traces)."""

from __future__ import annotations

import json

import pytest

from thunderviz.errors import TraceFormatError
from thunderviz.render.graph import graph_view, node_metadata, to_dot
from thunderviz.render.html import render_report_body
from thunderviz.trace.buckets import Bucket
from thunderviz.trace.diff import collective_changes, diff_traces, memory_changes
from thunderviz.trace.file import bundle_from_dict, bundle_to_dict, load, save
from thunderviz.trace.ledger import ledger_from_bundle
from thunderviz.trace.model import OpRecord, TensorRef, TraceBundle, TraceSnapshot


def _t(name: str, n: int = 4) -> TensorRef:
    return TensorRef(name, shape=(n, 8), dtype="float32")


def _op(i: int, op: str, ins: list[str], outs: list[str], module: str = "blocks.0", **kw) -> OpRecord:
    return OpRecord(i, op, op, inputs=tuple(map(_t, ins)), outputs=tuple(map(_t, outs)), module=module, **kw)


def _backward(recomputed: bool, accumulate: bool = False) -> TraceSnapshot:
    """A backward that (when ``recomputed``) first recomputes two forward ops, then computes a gradient and either
    reduce_scatters it or (``accumulate``) adds it to the no_backward_sync accumulator."""
    ops = [
        _op(0, "unpack_sequence", [], ["x", "g"], module=None),
        _op(1, "layer_norm", ["x"], ["h"], recomputed=recomputed),
        _op(2, "gelu", ["h"], ["a"], recomputed=recomputed),
        _op(3, "mul", ["a", "g"], ["dw"]),
    ]
    buckets, accumulated = [], []
    if accumulate:
        ops.append(_op(4, "thunderviz_accumulate_unsharded_grads", ["dw"], ["k"]))
        accumulated.append(Bucket("accumulate", "backward", "blocks.0", ["blocks.0.w"], 128, "float32", 4, 4))
    else:
        ops.append(
            OpRecord(4, "reduce_scatter", "rs", (_t("dw"),), (TensorRef("f", "future"),), collective="reduce_scatter")
        )
        ops.append(OpRecord(5, "wait", "wait", (TensorRef("f", "future"),), (_t("r", 2),), collective="wait"))
        buckets.append(Bucket("reduce_scatter", "backward", "blocks.0", ["blocks.0.w"], 128, "float32", 4, 5))
    ops.append(_op(len(ops), "python_return", ["r" if not accumulate else "dw"], [], module=None))
    edges = [(0, 1, "x"), (1, 2, "h"), (2, 3, "a"), (0, 3, "g"), (3, 4, "dw")]
    return TraceSnapshot("backward", ops, edges=edges, buckets=buckets, accumulated=accumulated)


def _bundle(saved: int, recomputed: bool, accumulate: bool = False) -> TraceBundle:
    forward = TraceSnapshot(
        "forward",
        [_op(0, "layer_norm", ["x"], ["h"]), _op(1, "gelu", ["h"], ["a"])],
        edges=[(0, 1, "h")],
        saved_for_backward=[_t(f"s{i}") for i in range(saved)],
    )
    return TraceBundle("tower", 0, 2, forward, _backward(recomputed, accumulate))


PLAIN, CHECKPOINTED, ACCUMULATING = _bundle(3, False), _bundle(1, True), _bundle(3, False, accumulate=True)


def test_recomputed_ops_and_accumulated_buckets_survive_the_trace_file(tmp_path):
    for bundle in (CHECKPOINTED, ACCUMULATING):
        save([bundle], tmp_path / "t.json")
        (back,) = load(tmp_path / "t.json")
        assert back == bundle
    d = bundle_to_dict(CHECKPOINTED)
    assert d["backward"]["recomputed"] == [1, 2]  # one list of op indices per trace, not a flag on every op
    assert "recomputed" not in d["backward"]["ops"][1]
    assert CHECKPOINTED.backward.recomputed_ops == 2 and PLAIN.backward.recomputed_ops == 0
    assert ACCUMULATING.accumulated_gradients == {"buckets": 1, "params": 1, "bytes": 128}
    assert PLAIN.accumulated_gradients == {"buckets": 0, "params": 0, "bytes": 0}


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        (("backward", "recomputed"), [9], "bundles[0].backward.recomputed[0]"),
        (("backward", "accumulated"), [{**Bucket("all_gather", "b", "x", [], 0, "f", 0, 0).to_dict()}], "kind"),
    ],
)
def test_a_file_cannot_mark_ops_that_do_not_exist_or_accumulate_a_collective(tmp_path, where, value, field):
    doc = {"format": "thunderviz.traces", "version": 1, "bundles": [bundle_to_dict(CHECKPOINTED)]}
    doc["bundles"][0][where[0]][where[1]] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError) as err:
        load(path)
    assert field in str(err.value)
    with pytest.raises(Exception, match=field.rsplit(".", 1)[-1].split("[")[0]):
        bundle_from_dict(doc["bundles"][0])


def test_the_diff_and_collective_changes_say_what_checkpointing_traded():
    d = diff_traces(PLAIN.backward, CHECKPOINTED.backward)
    # The recomputed ops align with nothing or with ops a had too: counted over both sides whole.
    assert d.recomputed_delta() == 2 and d.summary_parts()[-1] == "+2 recomputed ops"
    assert diff_traces(CHECKPOINTED.backward, PLAIN.backward).summary_parts()[-1] == "-2 recomputed ops"
    assert "recomputed" not in diff_traces(PLAIN.backward, PLAIN.backward).summary
    # memory_changes is memory only: the recomputed ops are the trace's change (the diff's summary names them)
    assert memory_changes(PLAIN, CHECKPOINTED)[0] == "saved tensors (trace) 384 B -> 128 B"
    assert not any("recomputed" in c for c in memory_changes(PLAIN, CHECKPOINTED))
    assert (
        collective_changes(PLAIN, CHECKPOINTED)
        == "the same collectives; saved tensors (trace) 384 B -> 128 B; +2 recomputed ops"
    )


def test_an_accumulating_backward_shows_no_collective_and_what_it_keeps():
    assert [e.trace for e in ledger_from_bundle(ACCUMULATING).collectives()] == []
    assert ledger_from_bundle(PLAIN).counts() == {"reduce_scatter": 1, "wait": 1}
    assert collective_changes(PLAIN, ACCUMULATING) == (
        "-1 reduce_scatter (backward), -1 wait (backward); saved tensors (trace) 384 B -> 384 B;"
        " kept for accumulation 0 B -> 128 B"
    )


def test_the_graph_marks_recomputed_groups_and_ops():
    view = graph_view(CHECKPOINTED.backward)
    (group,) = [g for g in view.groups if g.name == "blocks.0"]
    assert [op.index for op in group.recomputed] == [1, 2]
    assert "\u21bb 2 recomputed" in view.dot and 'style="filled,rounded,bold,dashed"' in view.dot
    plain = graph_view(PLAIN.backward).dot
    assert "\u21bb" not in plain and "#6a3d9a" not in plain
    meta = node_metadata(CHECKPOINTED.backward)
    assert meta[group.id]["n_recomputed"] == 2
    opened = to_dot(CHECKPOINTED.backward, expand=["blocks.0"])
    assert "layer_norm \u21bb recomputed" in opened


def test_the_report_overview_shows_saved_recomputed_and_kept_memory():
    html = render_report_body([CHECKPOINTED], svg=False)
    assert "<th>saved tensors (trace)</th>" in html and "128 B (1); \u21bb 2 recomputed" in html
    html = render_report_body([ACCUMULATING], svg=False)
    assert "kept for accumulation 128 B (1 buckets, no reduction)" in html
