"""The trace model against thunder's own trace objects, on small models jitted in this process."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest
import torch

from tests.unit import trace_fixtures as tf
from thunderviz.core.module_paths import top_group
from thunderviz.core.traces import TraceBundle, TraceSnapshot, capture, load, save
from thunderviz.errors import TraceCaptureError, TraceFormatError


def test_snapshot_matches_thunders_trace_objects():
    import thunder
    from thunder.core.utils import consumers
    from thunder.examine.memory_calculation import get_alloc_memory

    j = tf.gpt()
    fwd_trace = thunder.last_traces(j.jitted)[-1]
    bwd_trace = thunder.last_backward_traces(j.jitted)[-1]
    b = j.bundle
    assert [op.op for op in b.forward.ops] == [bs.sym.name for bs in fwd_trace.bound_symbols]
    assert [op.op for op in b.backward.ops] == [bs.sym.name for bs in bwd_trace.bound_symbols]
    assert b.memory == {"forward": get_alloc_memory(fwd_trace)[0], "backward": get_alloc_memory(bwd_trace)[0]}
    assert [s.label for s in b.stages][0] == "computation"
    assert len(b.stages) == len(thunder.last_traces(j.jitted))
    assert "Dead Code Elimination" in [s.label for s in b.stages]

    # Edges are thunder's consumers map, expressed as op indices.
    cons = consumers(fwd_trace)
    index_of = {id(bs): i for i, bs in enumerate(fwd_trace.bound_symbols)}
    linear = next(op for op in b.forward.ops if op.op == "linear")
    out = linear.outputs[0]
    proxy = fwd_trace.bound_symbols[linear.index].flat_proxy_outs[0]
    expected = sorted({index_of[id(c)] for c in cons.get(proxy, [])})
    assert expected and sorted({d for s, d, n in b.forward.edges if s == linear.index and n == out.name}) == expected

    # Inputs carry shape/dtype/device; ops from user code carry their source line.
    assert out.dtype == "float32" and out.device == "cpu" and out.shape[-1] in (32, 96)
    assert out.bytes == out.numel * 4
    arange = next(op for op in b.forward.ops if op.op == "arange")
    assert arange.source.file.endswith("models.py") and "torch.arange" in arange.source.code
    assert all(op.source is None for op in b.backward.ops)  # thunder records none for backward
    assert b.forward.param_names["t_blocks_1_attn_qkv_weight"] == "blocks.1.attn_qkv.weight"
    assert not any(op.is_collective or op.is_wait for op in b.forward.ops)


def test_ops_are_attributed_to_modules_in_forward_and_backward():
    b = tf.gpt().bundle
    expected = {"wte", "wpe", "blocks.0", "blocks.1", "ln_f", "lm_head"}
    for snap in (b.forward, b.backward):
        work = [op for op in snap.ops if not op.is_bookkeeping]
        assert {top_group(op.module) for op in work} == expected, snap.label
    # A layer norm's statistics are computed from the residual stream before its weight is read; they belong
    # to the block (or ln_f) whose norm it is, not to the block that produced the stream.
    var_means = [top_group(op.module) for op in b.forward.ops if op.op == "var_mean"]
    assert var_means == ["blocks.0", "blocks.0", "blocks.1", "blocks.1", "ln_f"]
    fwd_linears = [op for op in b.forward.ops if op.op == "linear"]
    reads = [b.forward.param_names.get(op.inputs[1].name, "") for op in fwd_linears]
    assert [op.module for op in fwd_linears] == [r.rsplit(".", 1)[0] for r in reads]
    # Backward: the ops producing each parameter's gradient belong to that parameter's module.
    grads = b.gradient_params()
    assert len(grads) == len(b.forward.param_names)
    producer = b.backward.producers()
    for grad_name, qual in grads.items():
        assert b.backward.ops[producer[grad_name]].module == qual.rsplit(".", 1)[0]
    # In backward the blocks come in reverse order.
    order = []
    for op in b.backward.ops:
        g = top_group(op.module)
        if not op.is_bookkeeping and g.startswith("blocks") and g not in order:
            order.append(g)
    assert order == ["blocks.1", "blocks.0"]


def test_function_without_module_is_grouped_by_source_line():
    b = tf.function().bundle
    assert b.name == "_mlp_loss" and b.forward.param_names == {}
    groups = {op.module for op in b.forward.ops if not op.is_bookkeeping}
    assert groups == {"@trace_fixtures.py:61", "@trace_fixtures.py:62"}
    assert b.backward is not None and all(op.module for op in b.backward.ops)


def test_bundle_round_trips_through_pickle_dict_and_file(tmp_path):
    b = tf.gpt().bundle
    assert pickle.loads(pickle.dumps(b)) == b
    assert TraceBundle.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    path = save([b, tf.function().bundle], tmp_path / "t.json")
    back = load(path)
    assert back == [b, tf.function().bundle]
    assert isinstance(back[0].forward, TraceSnapshot)


@pytest.mark.parametrize(
    "content, expected",
    [
        pytest.param("not json {", "not JSON", id="not-json"),
        pytest.param(json.dumps({"some": "thing"}), 'without "format"', id="foreign-json"),
        pytest.param(json.dumps({"format": "thunderviz.traces", "version": 99, "bundles": []}), "version 99", id="version"),
        pytest.param(json.dumps({"format": "thunderviz.traces", "version": 1, "bundles": {}}), "must be a list", id="bundles"),
        pytest.param(json.dumps({"format": "thunderviz.traces", "version": 1, "bundles": [{"name": "x"}]}),
                     "bundle 0 is malformed", id="malformed"),  # fmt: skip
    ],
)
def test_load_rejects_bad_files_with_the_fix(tmp_path, content, expected):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceFormatError, match=expected) as info:
        load(p)
    assert "bad.json" in str(info.value)


def test_load_missing_file():
    with pytest.raises(TraceFormatError, match="cannot read the file"):
        load("/nonexistent/traces.json")


def test_save_rejects_non_bundles(tmp_path):
    with pytest.raises(TypeError, match="TraceBundle"):
        save([{"name": "x"}], tmp_path / "x.json")


def test_capture_explains_what_to_do_when_not_jitted_or_not_run():
    import thunder

    with pytest.raises(TraceCaptureError, match=r"thunder\.jit"):
        capture(torch.nn.Linear(2, 2))
    fresh = thunder.jit(torch.nn.Linear(2, 2))
    with pytest.raises(TraceCaptureError, match="has not run yet.*Call it once"):
        capture(fresh)


def test_core_does_not_import_notebook_libraries():
    code = (
        "import sys\n"
        "import thunderviz.core.traces, thunderviz.core.collectives, thunderviz.core.diff, thunderviz.core.module_paths\n"
        "import thunderviz.render.graph, thunderviz.render.html, thunderviz.cli\n"
        "bad = [m for m in ('IPython', 'ipywidgets', 'anywidget') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
