"""Capture against thunder's own trace objects, on small models jitted in this process."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import trace_fixtures as tf
from thunderviz.errors import TraceCaptureError
from thunderviz.thunder.capture.traces import capture


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
    assert next(s.label for s in b.stages) == "computation"
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


def test_function_without_module_is_grouped_by_source_line():
    b = tf.function().bundle
    assert b.name == "_mlp_loss" and b.forward.param_names == {}
    groups = {op.module for op in b.forward.ops if not op.is_bookkeeping}
    assert groups == {"@trace_fixtures.py:61", "@trace_fixtures.py:62"}
    assert b.backward is not None and all(op.module for op in b.backward.ops)


def test_capture_explains_what_to_do_when_not_jitted_or_not_run():
    import thunder

    with pytest.raises(TraceCaptureError, match=r"thunder\.jit"):
        capture(torch.nn.Linear(2, 2))
    fresh = thunder.jit(torch.nn.Linear(2, 2))
    with pytest.raises(TraceCaptureError, match=r"has not run yet.*Call it once"):
        capture(fresh)


class _Pair(torch.nn.Module):
    """Shapes used by no other test, so functions jitted elsewhere in this process never fit it."""

    def __init__(self, d: int = 3) -> None:
        super().__init__()
        self.a = torch.nn.Linear(d, 11)
        self.b = torch.nn.Linear(11, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def _step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def test_a_module_used_by_a_jitted_function_is_captured_through_that_function():
    import thunder

    model = _Pair(d=13)
    step = thunder.jit(_step)
    step(model, torch.randn(4, 13)).backward()
    b = capture(model)
    assert b.name == "_Pair"
    assert [op.op for op in b.forward.ops] == [bs.sym.name for bs in thunder.last_traces(step)[-1].bound_symbols]
    # The prologue's own records name the parameters exactly (proxy names alone lose the dots).
    assert sorted(b.forward.param_names.values()) == ["a.bias", "a.weight", "b.bias", "b.weight"]
    assert {op.module.split(".")[0] for op in b.forward.ops if op.op == "linear"} == {"a", "b"}
    assert capture(step).forward == b.forward


def test_a_module_no_jitted_function_traced_says_what_to_pass():
    with pytest.raises(TraceCaptureError, match=r"no jitted function in this process has traced it.*capture\(step\)"):
        capture(_Pair(d=17))


def test_two_look_alike_modules_are_not_guessed_between():
    import thunder

    model, twin = _Pair(d=19), _Pair(d=19)  # same names, shapes and dtypes
    step = thunder.jit(_step)
    step(model, torch.randn(2, 19)).backward()
    with pytest.raises(TraceCaptureError, match=r"1 other live module\(s\) have them too.*capture\(_step\)"):
        capture(model)
    del twin
    assert capture(model).name == "_Pair"  # once the look-alike is gone, the answer is unique


def test_a_function_of_two_modules_names_parameters_by_argument():
    import thunder

    def distill(student: torch.nn.Module, teacher: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return (student(x) - teacher(x)).square().mean()

    student, teacher = _Pair(d=23), _Pair(d=23).requires_grad_(False)
    fn = thunder.jit(distill)
    fn(student, teacher, torch.randn(2, 23)).backward()
    names = sorted(capture(fn).forward.param_names.values())
    assert names == [
        "student.a.bias",
        "student.a.weight",
        "student.b.bias",
        "student.b.weight",
        "teacher.a.bias",
        "teacher.a.weight",
        "teacher.b.bias",
        "teacher.b.weight",
    ]
    # The student fits the function's record, and so does the teacher: which one capture(student) means is clear
    # to a person, not to the record, so it asks for the function.
    with pytest.raises(TraceCaptureError, match=r"capture\(.*distill\)"):
        capture(student)
