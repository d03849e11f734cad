"""Attributing ops to modules: on a real jitted GPT (forward and backward), and the naming rules alone."""

from __future__ import annotations

import pytest

from tests.helpers import trace_fixtures as tf
from thunderviz.trace.attribution import assign_modules, module_of_param, top_group
from thunderviz.trace.buckets import Bucket
from thunderviz.trace.model import OpRecord, TensorRef, TraceSnapshot


@pytest.mark.parametrize(("qual", "module"), [("blocks.0.attn_qkv.weight", "blocks.0.attn_qkv"), ("bias", "(root)")])
def test_module_of_param(qual, module):
    assert module_of_param(qual) == module


@pytest.mark.parametrize(
    ("module", "group"),
    [
        ("blocks.3.mlp.fc", "blocks.3"),
        ("lm_head", "lm_head"),
        ("encoder.layer.norm", "encoder.layer"),
        ("@model.py:12", "@model.py:12"),
        ("(inputs)", "(inputs)"),
        (None, "(other)"),
        ("", "(other)"),
        ("0", "0"),
        ("layers.0", "layers.0"),
    ],
)
def test_top_group(module, group):
    assert top_group(module) == group


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


def _t(name: str, kind: str = "tensor") -> TensorRef:
    return TensorRef(name=name, kind=kind, shape=(4,), dtype="float32", device="cpu")


def _snap(label: str, specs: list[tuple[str, list[str], list[str]]], **kw: object) -> TraceSnapshot:
    """Ops from (op, input names, output names); edges follow the names, as thunder's producer map does."""
    ops, producer, edges = [], {}, []
    for i, (op, ins, outs) in enumerate(specs):
        ops.append(OpRecord(i, op, op, tuple(_t(n) for n in ins), tuple(_t(n) for n in outs)))
        edges += [(producer[n], i, n) for n in ins if n in producer]
        producer.update(dict.fromkeys(outs, i))
    return TraceSnapshot(label=label, ops=ops, edges=edges, **kw)


def test_a_bucket_names_each_unpacked_parameter_and_each_sent_gradient_by_its_own_module():
    """One bucket holds a block's weight and the embedding: downstream ops follow each parameter, not the bucket."""
    params = ["blocks.0.fc.weight", "wte.weight"]
    gather = Bucket("all_gather", "forward", "(root)", params, 32, "float32", 1, 2, ["p_fc", "p_wte"], ["fc", "wte"])
    forward = _snap(
        "forward",
        [
            ("unpack_trivial", [], ["p_fc", "p_wte", "x"]),
            ("thunderviz_pack_for_all_gather", ["p_fc", "p_wte"], ["buf"]),
            ("torch_all_gather_prim_impl", ["buf"], ["fut"]),
            ("torch_wait_prim_impl", ["fut"], ["full"]),
            ("thunderviz_unpack_all_gather", ["full"], ["fc", "wte"]),
            ("embedding", ["x", "wte"], ["h"]),
            ("linear", ["h", "fc"], ["y"]),
            ("python_return", ["y"], []),
        ],
        arg_names=["p_fc", "p_wte", "x"],
        param_names={"p_fc": params[0], "p_wte": params[1]},
    )
    reduce = Bucket(
        "reduce_scatter", "backward", "(root)", params, 32, "float32", 5, 6, ["g_fc", "g_wte"], ["r_fc", "r_wte"]
    )
    backward = _snap(
        "backward",
        [
            ("unpack_trivial", [], ["h", "fc", "dy"]),
            ("matmul", ["dy", "fc"], ["dh"]),
            ("matmul", ["dy", "h"], ["g_fc"]),
            ("embedding_backward", ["dh"], ["g_wte"]),
            ("thunderviz_pack_for_reduce_scatter", ["g_fc", "g_wte"], ["gbuf"]),
            ("torch_reduce_scatter_prim_impl", ["gbuf"], ["gfut"]),
            ("torch_wait_prim_impl", ["gfut"], ["gred"]),
            ("thunderviz_unpack_views", ["gred"], ["r_fc", "r_wte"]),
            ("python_return", ["r_fc", "r_wte"], []),
        ],
        return_names=["r_fc", "r_wte", None],
        buckets=[reduce],
    )
    forward.buckets = [gather]
    assign_modules(forward, backward)
    assert [forward.ops[i].module for i in (5, 6)] == ["wte", "blocks.0.fc"]
    assert [backward.ops[i].module for i in (2, 3)] == ["blocks.0.fc", "wte"]  # each gradient its own module
