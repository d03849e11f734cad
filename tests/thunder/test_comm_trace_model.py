"""Buckets and saved-for-backward in the trace model: captured data survives the file, reaches the ledger, the
collapsed graph and the run-to-run diff, and a file cannot point a bucket outside its trace. No thunder needed."""

from __future__ import annotations

import json

import pytest

from thunderviz.errors import TraceFormatError
from thunderviz.render.graph import graph_view
from thunderviz.trace import file as trace_file
from thunderviz.trace.buckets import Bucket
from thunderviz.trace.diff import collective_changes
from thunderviz.trace.ledger import ledger_from_bundle
from thunderviz.trace.model import OpRecord, TensorRef, TraceBundle, TraceSnapshot

EVIL = "<script>alert(1)</script>"


def _t(name: str, shape: tuple[int, ...], kind: str = "tensor") -> TensorRef:
    return TensorRef(name=name, kind=kind, shape=shape, dtype="float32", device="cpu")


def _snapshot(label: str, *, gather: bool, bucket_label: str = "blocks.0") -> TraceSnapshot:
    """pack -> all_gather -> wait -> unpack into two weights -> a matmul (module blocks.0), as the pass lays it out."""
    w_a, w_b, buf, fut, full = (
        _t("w_a", (2, 3)),
        _t("w_b", (2, 2)),
        _t("buf", (10,)),
        _t("fut", (20,), "future"),
        _t("full", (20,)),
    )
    a, b = _t("a", (4, 3)), _t("b", (4, 2))
    ops = [
        OpRecord(0, "unpack_trivial", "unpack_trivial", outputs=(w_a,)),
        OpRecord(1, "thunderviz_pack_for_all_gather", "pack", (w_a, w_b), (buf,), module="blocks.0"),
        OpRecord(
            2,
            "torch_all_gather_prim_impl",
            "ag",
            (buf,),
            (fut,),
            collective="all_gather",
            group_size=2,
            module="blocks.0",
        ),
        OpRecord(3, "torch_wait_prim_impl", "wait", (fut,), (full,), collective="wait", module="blocks.0"),
        OpRecord(4, "thunderviz_unpack_all_gather", "unpack", (full,), (a, b), module="blocks.0"),
        OpRecord(5, "matmul", "matmul", (a,), (_t("y", (4, 3)),), module="blocks.0"),
    ]
    edges = [(1, 2, "buf"), (2, 3, "fut"), (3, 4, "full"), (4, 5, "a")]
    buckets = []
    if gather:
        buckets.append(
            Bucket(
                "all_gather",
                label,
                bucket_label,
                ["blocks.0.a", "blocks.0.b"],
                40,
                "float32",
                issue_index=2,
                wait_index=3,
                sends=["w_a", "w_b"],
                results=["a", "b"],
                reshard_after_forward=True,
                future="fut",
            )
        )
    else:  # the same trace without the collective: what ZERO2's backward lacks
        ops = [ops[0], ops[5]]
        ops = [OpRecord(i, o.op, o.symbol_id, o.inputs, o.outputs, module=o.module) for i, o in enumerate(ops)]
        edges = []
    return TraceSnapshot(label=label, ops=ops, edges=edges, buckets=buckets)


def _bundle(name: str, *, backward_gather: bool, saved: int) -> TraceBundle:
    fwd = _snapshot("forward", gather=True)
    fwd.saved_for_backward = [_t(f"s{i}", (4, 4)) for i in range(saved)]
    return TraceBundle(
        name=name, rank=0, world_size=2, forward=fwd, backward=_snapshot("backward", gather=backward_gather)
    )


def test_buckets_and_saved_for_backward_survive_the_file(tmp_path):
    b = _bundle("zero3", backward_gather=True, saved=2)
    path = trace_file.save(b, tmp_path / "r0.json")
    (back,) = trace_file.load(path)
    assert back.forward.buckets == b.forward.buckets
    assert back.backward.buckets == b.backward.buckets
    assert back.forward.saved_for_backward == b.forward.saved_for_backward
    assert back.saved_for_backward == {"tensors": 2, "bytes": 2 * 16 * 4}
    assert back.forward.bucket_of(3).label == "blocks.0" and back.forward.bucket_of(5) is None


def test_files_without_buckets_still_load(tmp_path):
    doc = {
        "format": trace_file.FORMAT_NAME,
        "version": trace_file.FORMAT_VERSION,
        "bundles": [trace_file.bundle_to_dict(_bundle("old", backward_gather=False, saved=0))],
    }
    for snap in (doc["bundles"][0]["forward"], doc["bundles"][0]["backward"]):
        del snap["buckets"], snap["saved_for_backward"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    (back,) = trace_file.load(tmp_path / "old.json")
    assert back.forward.buckets == [] and back.saved_for_backward == {"tensors": 0, "bytes": 0}


@pytest.mark.parametrize(
    ("field", "value", "where", "says"),
    [
        ("issue_index", 99, "forward.buckets[0].issue_index", "above the maximum of 5"),
        ("kind", "gossip", "forward.buckets[0].kind", "gossip"),
        ("params", "blocks.0.a", "forward.buckets[0].params", "list"),
        ("reshard_after_forward", "yes", "forward.buckets[0].reshard_after_forward", "true or false"),
    ],
)
def test_a_file_cannot_point_a_bucket_outside_its_trace(tmp_path, field, value, where, says):
    doc = {
        "format": trace_file.FORMAT_NAME,
        "version": trace_file.FORMAT_VERSION,
        "bundles": [trace_file.bundle_to_dict(_bundle("x", backward_gather=True, saved=1))],
    }
    doc["bundles"][0]["forward"]["buckets"][0][field] = value
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError) as err:
        trace_file.load(tmp_path / "bad.json")
    assert err.value.field == f"bundles[0].{where}"
    assert says in str(err.value)


def test_the_ledger_has_one_row_per_bucket_naming_its_parameters_and_bytes():
    ledger = ledger_from_bundle(_bundle("zero3", backward_gather=True, saved=0))
    gathers = [e for e in ledger.entries if e.kind == "all_gather"]
    assert [(e.trace, e.tensor, e.bytes, e.bucket, e.params) for e in gathers] == [
        ("forward", "blocks.0 (2 params, 40 B)", 40, "blocks.0", ("blocks.0.a", "blocks.0.b")),
        ("backward", "blocks.0 (2 params, 40 B)", 40, "blocks.0", ("blocks.0.a", "blocks.0.b")),
    ]
    waits = [e for e in ledger.entries if e.kind == "wait"]
    assert all(w.bucket == "blocks.0" and w.tensor == gathers[0].tensor for w in waits)
    assert type(gathers[0]).from_dict(gathers[0].to_dict()) == gathers[0]


def test_the_collapsed_graph_shows_buckets_and_escapes_their_labels():
    snap = _snapshot("forward", gather=True, bucket_label=EVIL)
    view = graph_view(snap)
    (coll,) = [line for line in view.dot.splitlines() if "hexagon" in line]
    # one short name per bucket, clipped in the label, whole in the tooltip; the parameter list stays in the metadata
    assert "all_gather <script>alert(1)</script> (2 par\u2026" in coll
    assert '\\nall_gather <script>alert(1)</script> (2 params, 40 B)"' in coll and "blocks.0.a" not in coll
    node = next(v for v in view.nodes.values() if v["kind"] == "collectives")
    assert node["ops"][0]["bucket"] == {
        "label": EVIL,
        "name": f"all_gather {EVIL} (2 params, 40 B)",
        "kind": "all_gather",
        "params": ["blocks.0.a", "blocks.0.b"],
        "bytes": 40,
        "dtype": "float32",
    }
    opened = graph_view(snap, expand=["blocks.0"]).dot
    assert "<script>alert(1)</script> (2 pa\u2026" in opened


def test_zero2_to_zero3_reads_as_gathers_added_to_backward():
    zero2 = _bundle("zero2", backward_gather=False, saved=3)
    zero3 = _bundle("zero3", backward_gather=True, saved=2)
    assert collective_changes(zero2, zero3) == (
        "+1 all_gather (backward), +1 wait (backward); saved tensors (trace) 192 B -> 128 B"
    )
    assert collective_changes(zero2, zero2) == "the same collectives; saved tensors (trace) 192 B -> 192 B"
    with pytest.raises(TypeError, match="two TraceBundle objects"):
        collective_changes(zero2, zero2.forward)
