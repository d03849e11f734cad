"""The trace file format: round trips, and every kind of bad file refused with the file and the field named."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from tests.helpers import trace_fixtures as tf
from tests.helpers.trace_scenarios import SMALL_TRACE_FILES
from thunderviz.errors import TraceFormatError
from thunderviz.trace.file import MAX_FILE_BYTES_ENV, bundle_from_dict, bundle_to_dict, load, save
from thunderviz.trace.model import TraceSnapshot
from thunderviz.trace.validate import Invalid


def test_bundle_round_trips_through_pickle_dict_and_file(tmp_path):
    b = tf.gpt().bundle
    assert pickle.loads(pickle.dumps(b)) == b
    assert bundle_from_dict(json.loads(json.dumps(bundle_to_dict(b)))) == b
    path = save([b, tf.function().bundle], tmp_path / "t.json")
    back = load(path)
    assert back == [b, tf.function().bundle]
    assert isinstance(back[0].forward, TraceSnapshot)
    assert not (tmp_path / "t.json.tmp").exists()  # written next to it, then renamed


def test_files_written_earlier_still_open():
    """The kept small files (``python -m tests.helpers.trace_scenarios`` rewrites them) load and say what they are."""
    for rank, path in enumerate(SMALL_TRACE_FILES):
        fsdp, ddp = load(path)
        assert (fsdp.name, ddp.name, fsdp.rank, fsdp.world_size) == ("net-fsdp", "net-ddp", rank, 2)
        assert {op.collective for op in fsdp.backward.ops} >= {"reduce_scatter", "wait"} and fsdp.stages
        assert {op.collective for op in ddp.backward.ops} >= {"all_reduce", "wait"}


def _doc() -> dict:
    return json.loads(SMALL_TRACE_FILES[0].read_text(encoding="utf-8"))


def _edit(doc: dict, path: str, value: object) -> dict:
    """Set ``path`` (``bundles.0.forward.ops.3.index``) in a copy of ``doc``; ``...`` deletes the key."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return doc


# (where to edit, the new value, the field the error must name, words the error must contain)
FIELD_ERRORS = [
    ("bundles.0.rank", -1, "bundles[0].rank", "below the minimum of 0"),
    ("bundles.0.rank", 2, "bundles[0].rank", "outside a world of 2"),
    ("bundles.0.rank", True, "bundles[0].rank", "expected an integer, found true"),
    ("bundles.0.world_size", 0, "bundles[0].world_size", "below the minimum of 1"),
    ("bundles.0.name", ..., "bundles[0]", "the field 'name' is missing"),
    ("bundles.0.name", ["a"], "bundles[0].name", "expected a string, found a list of 1"),
    ("bundles.0.forward", "x", "bundles[0].forward", "expected an object"),
    ("bundles.0.forward.ops", {}, "bundles[0].forward.ops", "expected a list"),
    ("bundles.0.forward.ops.3.index", 4, "bundles[0].forward.ops[3].index", "index = position"),
    ("bundles.0.forward.ops.3.index", 3.0, "bundles[0].forward.ops[3].index", "found the number 3.0"),
    ("bundles.0.forward.ops.12.inputs.0.shape", ["8"], "bundles[0].forward.ops[12].inputs[0].shape[0]", "an integer"),
    ("bundles.0.forward.ops.12.inputs.0.shape", [-1], "bundles[0].forward.ops[12].inputs[0].shape[0]", "minimum"),
    ("bundles.0.forward.ops.12.inputs.0.shape", [2**40] * 3, "bundles[0].forward.ops[12].inputs[0].shape", "elements"),
    ("bundles.0.forward.ops.12.inputs.0.shape", [1] * 65, "bundles[0].forward.ops[12].inputs[0].shape", "limit of 64"),
    ("bundles.0.forward.ops.12.inputs.0.kind", "tensr", "bundles[0].forward.ops[12].inputs[0].kind", "not one of"),
    ("bundles.0.forward.ops.12.inputs.0", 5, "bundles[0].forward.ops[12].inputs[0]", "expected an object"),
    ("bundles.0.forward.ops.2.collective", "all_to_all", "bundles[0].forward.ops[2].collective", "not one of"),
    ("bundles.0.forward.ops.2.group_size", 0, "bundles[0].forward.ops[2].group_size", "below the minimum of 1"),
    ("bundles.0.forward.ops.2.module", {"a": 1}, "bundles[0].forward.ops[2].module", "expected a string"),
    (
        "bundles.0.forward.ops.2.source",
        {"file": "m.py", "line": "7"},
        "bundles[0].forward.ops[2].source.line",
        "expected an integer",
    ),
    ("bundles.0.forward.ops.2.python", "x" * (2**20 + 1), "bundles[0].forward.ops[2].python", "over the limit"),
    ("bundles.0.forward.edges.0", [0, 999, "t"], "bundles[0].forward.edges[0][1]", "above the maximum of 32"),
    ("bundles.0.forward.edges.0", [0, 1], "bundles[0].forward.edges[0]", "found a list of 2"),
    ("bundles.0.forward.param_names", {"t_w": 3}, "bundles[0].forward.param_names.t_w", "expected a string"),
    ("bundles.0.forward.param_names", {"a.b": None}, "bundles[0].forward.param_names['a.b']", "expected a string"),
    ("bundles.0.forward.peak_memory_bytes", -5, "bundles[0].forward.peak_memory_bytes", "below the minimum"),
    ("bundles.0.forward.return_names", [1], "bundles[0].forward.return_names[0]", "expected a string"),
    (
        "bundles.0.backward.ops.0.outputs.0.name",
        None,
        "bundles[0].backward.ops[0].outputs[0].name",
        "expected a string, found null",
    ),
    ("bundles.0.stages.1.ops.0.op", 7, "bundles[0].stages[1].ops[0].op", "expected a string"),
    ("bundles.0.versions", {"torch": 2}, "bundles[0].versions.torch", "expected a string"),
    ("bundles.1", [], "bundles[1]", "expected an object"),
    ("bundles", {}, "bundles", "expected a list, found an object with 0 keys"),
    ("version", 99, "version", "trace format version 99"),
    ("version", "1", "version", "version of another type"),
    ("version", True, "version", "version of another type"),
]


@pytest.mark.parametrize(
    ("where", "value", "field", "words"), FIELD_ERRORS, ids=[f"{e[0]}={e[1]!s:.12}" for e in FIELD_ERRORS]
)
def test_a_bad_field_is_named_with_the_file(tmp_path, where, value, field, words):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(_edit(_doc(), where, value)), encoding="utf-8")
    with pytest.raises(TraceFormatError) as info:
        load(path)
    e = info.value
    assert (e.file, e.field) == (str(path), field), str(e)
    assert str(e).startswith(f"load({str(path)!r}): {field}: ") and words in str(e), str(e)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        pytest.param(b"not json {", "not JSON (Expecting value at line 1, column 1)", id="not-json"),
        pytest.param(b"\xff\xfe{}", "not UTF-8 text (invalid byte at offset 0)", id="binary"),
        pytest.param(b"", "not JSON", id="empty"),
        pytest.param(json.dumps({"some": "thing"}).encode(), 'without "format"', id="foreign-json"),
        pytest.param(b"[]", 'without "format"', id="list"),
        pytest.param(b'{"format": "thunderviz.traces", "format": "x"}', "appears twice", id="duplicate-key"),
        pytest.param(
            b'{"format": "thunderviz.traces", "version": 1, "bundles": [NaN]}', "NaN is not a JSON number", id="nan"
        ),
        pytest.param(b'{"format": "thunderviz.traces", "version": 1e999}', "too large to represent", id="inf"),
        pytest.param(
            b'{"format": "thunderviz.traces", "version": ' + b"9" * 5000 + b"}", "not readable JSON", id="5000-digits"
        ),
        pytest.param(
            b'{"format": "thunderviz.traces", "version": 1, "bundles": ' + b"[" * 30 + b"]" * 30 + b"}",
            "nested deeper than 24 levels",
            id="deep",
        ),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "nested deeper than 24 levels", id="very-deep"),
        pytest.param(
            b'{"format": "thunderviz.traces", "version": 1, "bundles": ["\\ud800"]}',
            "lone surrogate",
            id="lone-surrogate",
        ),
        pytest.param(
            b'{"format": "thunderviz.traces", "version": 1, "bundles": [' + b"9" * 25 + b"]}",
            "out of range",
            id="big-int",
        ),
    ],
)
def test_a_bad_file_is_refused_with_the_reason(tmp_path, content, words):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=r"bad\.json") as info:
        load(path)
    assert words in str(info.value), str(info.value)


def test_size_cap_can_be_raised_by_argument_or_environment(tmp_path, monkeypatch):
    path = save([], tmp_path / "t.json")
    size = path.stat().st_size
    too_big = f"larger than the limit of {size - 1} bytes.*max_bytes=N.*{MAX_FILE_BYTES_ENV}"
    with pytest.raises(TraceFormatError, match=too_big):
        load(path, max_bytes=size - 1)
    assert load(path, max_bytes=size) == []
    monkeypatch.setenv(MAX_FILE_BYTES_ENV, str(size - 1))
    with pytest.raises(TraceFormatError, match="larger than the limit"):
        load(path)
    monkeypatch.setenv(MAX_FILE_BYTES_ENV, "lots")
    with pytest.raises(TraceFormatError, match=f"{MAX_FILE_BYTES_ENV}='lots': expected a positive number"):
        load(path)


def test_too_many_ops_in_one_file(tmp_path, monkeypatch):
    from thunderviz.trace import file as trace_file

    b0 = _doc()["bundles"][0]
    n = len(b0["forward"]["ops"]) + len(b0["backward"]["ops"])
    assert bundle_from_dict(b0, max_ops=n + sum(len(s["ops"]) for s in b0["stages"])).name == "net-fsdp"
    with pytest.raises(Invalid, match=f"more than {n:,} ops") as info:
        bundle_from_dict(b0, max_ops=n)
    assert info.value.path == "stages[0].ops"  # the list that went over
    monkeypatch.setattr(trace_file, "MAX_OPS", n)
    with pytest.raises(TraceFormatError, match=rf"bundles\[0\].stages\[0\].ops: more than {n:,} ops in the file"):
        load(SMALL_TRACE_FILES[0])


def test_missing_file_directory_and_wrong_argument(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot read the file"):
        load("/nonexistent/traces.json")
    with pytest.raises(TraceFormatError, match="cannot read the file"):
        load(tmp_path)
    with pytest.raises(TypeError, match="expected a file path"):
        load(3)  # an int would be opened as a file descriptor


def test_unknown_fields_are_ignored(tmp_path):
    """A newer thunderviz may add fields without a new version; this one reads what it knows."""
    doc = _edit(_doc(), "bundles.0.forward.ops.0.saved_for_backward", ["t0"])
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    assert load(path)[0].forward.ops[0] == load(SMALL_TRACE_FILES[0])[0].forward.ops[0]


def test_save_rejects_non_bundles(tmp_path):
    with pytest.raises(TypeError, match="TraceBundle"):
        save([{"name": "x"}], tmp_path / "x.json")


def test_the_dict_form_takes_what_python_hands_it():
    """Bundles sent between processes as dicts hold Python values, e.g. torch's version string (a str subclass)."""
    import torch

    d = bundle_to_dict(tf.function().bundle)
    assert bundle_from_dict({**d, "versions": {"torch": torch.__version__}}).versions == {"torch": torch.__version__}
    with pytest.raises(Invalid, match=r"^rank: expected an integer, found true$"):
        bundle_from_dict({**d, "rank": True})


def test_fusion_regions_round_trip_and_bad_indices_are_refused():
    """A fusion region (``OpRecord.fused``) survives a file; a region pointing outside its trace is refused."""
    from dataclasses import replace

    from tests.helpers.small_traces import fsdp_bundle

    b = fsdp_bundle(0)
    ops = list(b.forward.ops)
    ops[2] = replace(ops[2], op="TorchCompile0", fused=("linear", "div", "erf", "mul"))
    b = replace(b, forward=replace(b.forward, ops=ops))
    d = bundle_to_dict(b)
    assert d["forward"]["fused"] == {"2": ["linear", "div", "erf", "mul"]}
    back = bundle_from_dict(json.loads(json.dumps(d)))
    assert back == b and [op.index for op in back.forward.fusion_regions] == [2]
    d["forward"]["fused"] = {"9": ["linear"]}
    with pytest.raises(Invalid, match="fusion region '9' is not an op index"):
        bundle_from_dict(d)


def test_a_fusion_regions_own_ops_round_trip_and_must_belong_to_a_region():
    """``OpRecord.inner`` (what attribution and an opened region read) survives a file, module included; ops inside
    something that is no fusion region, or numbered out of order, are refused."""
    from dataclasses import replace

    from tests.helpers.small_traces import fsdp_bundle

    b = fsdp_bundle(0)
    ops = list(b.forward.ops)
    inner = tuple(replace(op, index=k, module="proj") for k, op in enumerate(ops[1:3]))
    ops[2] = replace(ops[2], op="TorchCompile0", fused=tuple(op.op for op in inner), inner=inner)
    b = replace(b, forward=replace(b.forward, ops=ops))
    d = json.loads(json.dumps(bundle_to_dict(b)))
    assert [o["module"] for o in d["forward"]["inner"]["2"]] == ["proj", "proj"]
    back = bundle_from_dict(d)
    assert back == b and back.forward.ops[2].inner == inner
    bad = json.loads(json.dumps(d))
    bad["forward"]["inner"] = {"1": bad["forward"]["inner"]["2"]}  # op 1 is no fusion region
    with pytest.raises(Invalid, match="'1' is not the op index of a fusion region"):
        bundle_from_dict(bad)
    bad = json.loads(json.dumps(d))
    bad["forward"]["inner"]["2"][1]["index"] = 0
    with pytest.raises(Invalid, match=r"forward\.inner\['2'\]\[1\]\.index: op at position 1 says index 0"):
        bundle_from_dict(bad)
