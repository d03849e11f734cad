"""The trace model on its own: derived values, the links between forward and backward, pickling. No thunder."""

from __future__ import annotations

import pickle

import pytest

from thunderviz.trace.model import (
    OpRecord,
    SourceRef,
    TensorRef,
    TraceBundle,
    TraceSnapshot,
    short_dtype,
)


@pytest.mark.parametrize(
    ("ref", "numel", "nbytes", "short"),
    [
        pytest.param(TensorRef("t0", shape=(8, 64, 128), dtype="float32"), 65536, 262144, "f32[8,64,128]", id="f32"),
        pytest.param(TensorRef("t1", shape=(3,), dtype="bfloat16"), 3, 6, "bf16[3]", id="bf16"),
        pytest.param(TensorRef("t2", shape=(), dtype="bool"), 1, 1, "b8[]", id="scalar"),
        pytest.param(TensorRef("t3", shape=(2, 0), dtype="int64"), 0, 0, "i64[2,0]", id="empty"),
        pytest.param(TensorRef("t4", shape=(5,), dtype="float4_e2m1"), 5, 20, "float4_e2m1[5]", id="unknown-dtype"),
        pytest.param(TensorRef("n", kind="number"), None, None, "number", id="number"),
    ],
)
def test_tensor_ref_sizes_and_labels(ref, numel, nbytes, short):
    assert (ref.numel, ref.bytes, ref.short()) == (numel, nbytes, short)


def test_short_dtype_and_source_ref():
    assert [short_dtype(d) for d in ("float16", "uint8", "complex64", None)] == ["f16", "u8", "c64", "?"]
    assert SourceRef("/home/me/model.py", 12, "x = f(y)").short() == "model.py:12"


def _op(
    i: int,
    op: str,
    ins: tuple[str, ...] = (),
    outs: tuple[str, ...] = (),
    collective: str | None = None,
) -> OpRecord:
    return OpRecord(
        index=i,
        op=op,
        symbol_id=op,
        inputs=tuple(TensorRef(n) for n in ins),
        outputs=tuple(TensorRef(n) for n in outs),
        collective=collective,
    )


def _bundle() -> TraceBundle:
    fwd = TraceSnapshot(
        label="forward",
        ops=[
            _op(0, "all_gather", ("t_w",), ("f0",), "all_gather"),
            _op(1, "wait", ("f0",), ("w",), "wait"),
            _op(2, "linear", ("x", "w"), ("y",)),
            _op(3, "python_return", ("y",)),
        ],
        edges=[(0, 1, "f0"), (1, 2, "w"), (2, 3, "y")],
        arg_names=["x", "t_w"],
        param_names={"t_w": "fc.weight"},
        peak_memory_bytes=1024,
    )
    bwd = TraceSnapshot(label="backward", ops=[_op(0, "matmul", ("g",), ("gw",))], return_names=[None, "gw"])
    return TraceBundle(name="m", rank=1, world_size=2, forward=fwd, backward=bwd)


def test_op_kinds():
    ops = _bundle().forward.ops
    assert [(op.is_collective, op.is_wait, op.is_bookkeeping) for op in ops] == [
        (True, False, False),
        (False, True, False),
        (False, False, False),
        (False, False, True),
    ]
    assert [op.index for op in _bundle().forward.collectives] == [0, 1]


def test_edges_give_producers_and_consumers():
    fwd = _bundle().forward
    assert fwd.producers() == {"f0": 0, "w": 1, "y": 2}
    assert fwd.consumers() == {0: [1], 1: [2], 2: [3]}
    assert len(fwd) == 4


def test_backward_gradients_are_matched_to_forward_parameters_by_position():
    b = _bundle()
    assert b.gradient_params() == {"gw": "fc.weight"}
    assert b.memory == {"forward": 1024, "backward": None}
    assert list(b.traces()) == ["forward", "backward"]
    b.backward.return_names = ["gw"]  # one return for two arguments: positions say nothing
    assert b.gradient_params() == {}


def test_bundle_pickles_as_it_is():
    b = _bundle()
    assert pickle.loads(pickle.dumps(b)) == b
