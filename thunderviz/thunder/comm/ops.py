"""The operators the communication pass inserts into thunder's traces: torch code the rewritten trace runs.

A bucket needs steps thunder has no symbol for: pack its members into one flat buffer (a gradient bucket divided by
the world size and cast to the reduce dtype once, not per gradient), unpack the collective's result into the very
tensors the rest of the trace already uses, and, under no_backward_sync, add unsharded gradients to their
accumulators. Each is registered on an executor of our own (``thunderviz_comm``) with a meta that tells thunder its
result's shape and dtype, so the trace names it like any other symbol. Those names
(``thunderviz_pack_for_reduce_scatter`` ...) are what trace views, saved trace files and tests read: they must not
change.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["Ops"]


def _pack_gather_impl(shards: list[torch.Tensor], label: str, names: tuple[str, ...]) -> torch.Tensor:
    # one C++ call for what torch.cat([s.reshape(-1) for s in shards]) does (half its host time for a block's shards)
    return torch._C._nn.flatten_dense_tensors(shards)


def _unpack_gather_impl(
    buffer: torch.Tensor, sent: torch.Tensor, full_shapes: tuple[tuple[int, ...], ...], world: int, label: str
) -> list[torch.Tensor]:
    # The gathered buffer is [rank 0's shards | rank 1's shards | ...]; parameter i is column block i of the
    # (world, n) view, which one split_with_sizes_copy writes into each parameter's own storage (as FSDP2 does).
    # (Allocated here, one torch.empty each, not by the copy: the rehearsal's StorageTracker counts these
    # allocations one by one, and letting split_with_sizes_copy allocate them changed what it counted.)
    _free(sent)
    sizes = _shard_sizes(full_shapes, world)
    outs = [torch.empty((world, n), dtype=buffer.dtype, device=buffer.device) for n in sizes]
    torch.split_with_sizes_copy(buffer.view(world, -1), sizes, dim=1, out=outs)
    _free(buffer)
    return [o.view(s) for o, s in zip(outs, full_shapes, strict=True)]


def _shard_sizes(shapes: Sequence[Sequence[int]], world: int) -> tuple[int, ...]:
    """Elements per rank of each shape (the same few bucket layouts every step: computed once each)."""
    try:
        return _shard_sizes_of(shapes, world)
    except TypeError:  # shapes given as lists (unhashable): computed each time
        return tuple(math.prod(s) // world for s in shapes)


@functools.lru_cache(maxsize=4096)
def _shard_sizes_of(shapes: tuple[tuple[int, ...], ...], world: int) -> tuple[int, ...]:
    return tuple(math.prod(s) // world for s in shapes)


def _free(buffer: torch.Tensor) -> None:
    """Free a bucket's communication buffer now, whoever else still holds it (FSDP's own way: storage resized to 0).

    Why not leave it to reference counting: gloo's worker thread keeps its work object, and with it the
    ``all_gather``'s input and output, until after ``wait()`` has returned (measured on 4 ranks: in about 20% of 3000
    waits neither had died when the last Python reference went). The buffers then died whenever that thread next
    ran, on oversubscribed cores after the next allocations, and a rank's measured peak moved up by a bucket or a
    shard in 4 of 600 rank measurements of two bench runs. The unpack is the first point after the wait, and the
    buffers are the pass's own (the pack's result and the collective's), so nothing else reads them. The rehearsal
    counts the same frees: ``StorageTracker`` follows storage resizes as ``MemTracker`` does.
    """
    buffer.untyped_storage().resize_(0)


def _with_accumulated(grads: list[torch.Tensor], keys: tuple[str, ...], world: int, divide: bool) -> list[torch.Tensor]:
    """The synchronizing backward's gradients plus what no_backward_sync micro-batches accumulated for them.

    ``divide``: the pack divides by the world size afterwards (it gets undivided gradients); otherwise the gradients
    arrive divided already and so must the accumulated sums.
    """
    from thunderviz.thunder.comm import accumulation

    out = []
    for g, key in zip(grads, keys, strict=True):
        undivided, divided = accumulation.lookup(key).take()
        if undivided is not None or divided is not None:
            total = g.to(undivided.dtype if undivided is not None else divided.dtype)
            if undivided is not None:
                total = total + (undivided if divide else undivided / world)
            if divided is not None:
                total = total + (divided * world if divide else divided)
            g = total
        out.append(g)
    return out


def _cast(buffer: torch.Tensor, dtype_name: str | None) -> torch.Tensor:
    return buffer if dtype_name is None else buffer.to(getattr(torch, dtype_name))


def _pack_scatter_impl(
    grads: list[torch.Tensor],
    world: int,
    divide: bool,
    label: str,
    names: tuple[str, ...],
    reduce_dtype: str | None = None,
    accumulated: tuple[str, ...] = (),
    replicas: int = 1,
) -> torch.Tensor:
    """``replicas`` (hybrid sharding): the result is also all-reduced over that many replicas, so the division is by
    ``world * replicas`` (only by ``replicas`` when the gradients arrive divided by ``world`` already)."""
    if accumulated:
        grads = _with_accumulated(grads, accumulated, world, divide)
    divisor = world * replicas if divide else replicas
    # Rank r must receive [grad 0's rows for r | grad 1's rows for r | ...]: interleave the dim-0 chunks.
    if len(grads) == 1:
        flat = _cast(grads[0].reshape(-1), reduce_dtype)
        return flat / divisor if divisor != 1 else flat
    if world == 1:
        buffer = _cast(torch._C._nn.flatten_dense_tensors(grads), reduce_dtype)
    elif all(g.dim() and g.shape[0] % world == 0 and g.dtype == grads[0].dtype for g in grads):
        # rows split evenly: rank r's rows of every gradient side by side in one C++ call (FSDP2's copy-in), which
        # is what the reshapes below give; uneven rows _chunk_cat would pad, and mixed dtypes it refuses (cat
        # promotes them), so those take the reshapes
        buffer = _cast(torch._chunk_cat(grads, 0, world).view(-1), reduce_dtype)
    else:
        buffer = _cast(torch.cat([g.reshape(world, -1) for g in grads], dim=1).view(-1), reduce_dtype)
    return buffer.div_(divisor) if divisor != 1 else buffer


def _pack_flat_impl(
    grads: list[torch.Tensor],
    world: int,
    divide: bool,
    label: str,
    names: tuple[str, ...],
    reduce_dtype: str | None = None,
    accumulated: tuple[str, ...] = (),
    replicas: int = 1,
) -> torch.Tensor:
    if len(grads) == 1:
        flat = grads[0].reshape(-1)
        if divide:
            return _cast(flat, reduce_dtype) / world
        # all_reduce works in place: never on the caller's tensor (a cast to another dtype is a copy already)
        return (
            flat.clone()
            if reduce_dtype is None or flat.dtype == getattr(torch, reduce_dtype)
            else _cast(flat, reduce_dtype)
        )
    buffer = _cast(torch._C._nn.flatten_dense_tensors(grads), reduce_dtype)
    return buffer.div_(world) if divide else buffer


def _unpack_views_impl(
    buffer: torch.Tensor, shapes: tuple[tuple[int, ...], ...], label: str, out_dtype: str | None = None
) -> list[torch.Tensor]:
    pieces = _cast(buffer, out_dtype).split_with_sizes(_shard_sizes(shapes, 1))
    # a 1-D piece is already its gradient (biases, norms: most of a transformer block's parameters); a view of it
    # would be one more Python call each
    return [piece if len(s) == 1 else piece.view(s) for piece, s in zip(pieces, shapes, strict=True)]


def _accumulate_impl(
    grads: list[torch.Tensor], keys: tuple[str, ...], divided: bool, dtypes: tuple[str, ...], label: str
) -> torch.Tensor:
    from thunderviz.thunder.comm import accumulation

    for g, key, dtype in zip(grads, keys, dtypes, strict=True):
        accumulation.lookup(key).add(g, divided=divided, dtype=getattr(torch, dtype))
    return grads[0]


def _flat_meta(tensors: Sequence[Any], numel: int) -> Any:
    from thunder.core.proxies import TensorProxy

    first = tensors[0]
    return TensorProxy(shape=(numel,), device=first.device, dtype=first.dtype, requires_grad=False)


def _pack_gather_meta(shards: list[Any], label: str, names: tuple[str, ...]) -> Any:
    return _flat_meta(shards, sum(s.numel for s in shards))


def _pack_reduce_meta(
    grads: list[Any],
    world: int,
    divide: bool,
    label: str,
    names: tuple[str, ...],
    reduce_dtype: str | None = None,
    accumulated: tuple[str, ...] = (),
    replicas: int = 1,
) -> Any:
    from thunder.core.proxies import TensorProxy

    flat = _flat_meta(grads, sum(g.numel for g in grads))
    if reduce_dtype is None:
        return flat
    return TensorProxy(like=flat, dtype=_thunder_dtype(reduce_dtype))


def _thunder_dtype(name: str) -> Any:
    from thunder.core import dtypes

    return dtypes.to_dtype(getattr(torch, name))


def _accumulate_meta(grads: list[Any], keys: tuple, divided: bool, dtypes: tuple, label: str) -> Any:
    from thunder.core.proxies import TensorProxy

    return TensorProxy(like=grads[0])


def _unpack_gather_meta(buffer: Any, sent: Any, full_shapes: tuple, world: int, label: str) -> list[Any]:
    from thunder.core.proxies import TensorProxy

    return [TensorProxy(like=buffer, shape=tuple(s)) for s in full_shapes]


def _unpack_views_meta(buffer: Any, shapes: tuple, label: str, out_dtype: str | None = None) -> list[Any]:
    from thunder.core.proxies import TensorProxy

    dtype = buffer.dtype if out_dtype is None else _thunder_dtype(out_dtype)
    return [TensorProxy(like=buffer, shape=tuple(s), dtype=dtype) for s in shapes]


class Ops:
    """The executor and symbols, created on first use (importing thunder costs seconds)."""

    _instance: Ops | None = None

    def __init__(self) -> None:
        from thunder.core import prims
        from thunder.examine.memory_calculation import register_memory_calculate_function, track_alias_op_memory
        from thunder.extend import OperatorExecutor, register_executor

        ex = OperatorExecutor("thunderviz_comm", version="1")
        register_executor(ex)
        self.pack_gather = ex.register_operator(
            "thunderviz_pack_for_all_gather", meta=_pack_gather_meta, fn=_pack_gather_impl
        )
        self.unpack_gather = ex.register_operator(
            "thunderviz_unpack_all_gather", meta=_unpack_gather_meta, fn=_unpack_gather_impl
        )
        self.pack_scatter = ex.register_operator(
            "thunderviz_pack_for_reduce_scatter", meta=_pack_reduce_meta, fn=_pack_scatter_impl
        )
        self.pack_flat = ex.register_operator(
            "thunderviz_pack_for_all_reduce", meta=_pack_reduce_meta, fn=_pack_flat_impl
        )
        self.unpack_views = ex.register_operator(
            "thunderviz_unpack_views", meta=_unpack_views_meta, fn=_unpack_views_impl
        )
        # Its result is used by nothing (the effect is the accumulators): tagged so a fusion pass's dead-code
        # elimination (fusion_regions.refuse) keeps it.
        self.accumulate = ex.register_operator(
            "thunderviz_accumulate_unsharded_grads",
            meta=_accumulate_meta,
            fn=_accumulate_impl,
            tags=[prims.OpTags.DONT_DCE],
        )
        # The reduced gradients are views of the bucket: thunder's memory estimate must not count them twice.
        register_memory_calculate_function(self.unpack_views.id)(track_alias_op_memory)

    @classmethod
    def get(cls) -> Ops:
        if cls._instance is None:
            cls._instance = Ops()
        return cls._instance
