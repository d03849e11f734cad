"""A small FSDP-shaped trace pair built from the trace model alone (no thunder), for CLI and start-up tests.

Real traces cost a ``thunder.jit`` (seconds); tests about the command line and about what ``thunderviz render``
imports need a valid file, not a realistic one. Each rank's forward gathers a weight shard, waits, and multiplies;
the backward reduce-scatters the gradient.
"""

from __future__ import annotations

from pathlib import Path

from thunderviz.trace.file import save
from thunderviz.trace.model import OpRecord, TensorRef, TraceBundle, TraceSnapshot


def _t(name: str, shape: tuple[int, ...]) -> TensorRef:
    return TensorRef(name=name, shape=shape, dtype="float32", device="cpu")


def fsdp_bundle(rank: int, world_size: int = 2, name: str = "TinyLinear") -> TraceBundle:
    """One rank's traces of ``x @ W`` with ``W`` sharded along dim 0."""
    shard, full, x, y = _t("t_w", (4, 8)), _t("t_w_full", (8, 8)), _t("x", (2, 8)), _t("y", (2, 8))
    fut = TensorRef(name="fut", kind="future")
    forward = TraceSnapshot(
        label="forward",
        ops=[
            OpRecord(0, "all_gather", "all_gather", (shard,), (fut,), collective="all_gather", group_size=world_size),
            OpRecord(1, "wait", "wait", (fut,), (full,), collective="wait"),
            OpRecord(2, "matmul", "torch.matmul", (x, full), (y,), module="proj"),
            OpRecord(3, "python_return", "python_return", (y,), ()),
        ],
        edges=[(0, 1, "fut"), (1, 2, "t_w_full"), (2, 3, "y")],
        arg_names=["x", "t_w"],
        return_names=["y"],
        param_names={"t_w": "proj.weight"},
        peak_memory_bytes=1024,
    )
    grad, grad_shard = _t("g_w", (8, 8)), _t("g_w_shard", (4, 8))
    gfut = TensorRef(name="gfut", kind="future")
    backward = TraceSnapshot(
        label="backward",
        ops=[
            OpRecord(0, "matmul", "torch.matmul", (x, y), (grad,), module="proj"),
            OpRecord(
                1,
                "reduce_scatter",
                "reduce_scatter",
                (grad,),
                (gfut,),
                collective="reduce_scatter",
                group_size=world_size,
            ),
            OpRecord(2, "wait", "wait", (gfut,), (grad_shard,), collective="wait"),
            OpRecord(3, "python_return", "python_return", (grad_shard,), ()),
        ],
        edges=[(0, 1, "g_w"), (1, 2, "gfut"), (2, 3, "g_w_shard")],
        arg_names=["x", "y"],
        return_names=[None, "g_w_shard"],
        peak_memory_bytes=2048,
    )
    return TraceBundle(name=name, rank=rank, world_size=world_size, forward=forward, backward=backward)


def write_rank_files(folder: Path, world_size: int = 2) -> list[Path]:
    """``rank0.json``, ``rank1.json``, ... as ``thunderviz.save`` writes them on a cluster."""
    return [save(fsdp_bundle(r, world_size), folder / f"rank{r}.json") for r in range(world_size)]
