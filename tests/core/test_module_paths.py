"""Attributing ops to modules: on a real jitted GPT (forward and backward), and the naming rules alone."""

from __future__ import annotations

import pytest

from tests.helpers import trace_fixtures as tf
from thunderviz.core.module_paths import module_of_param, top_group


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
