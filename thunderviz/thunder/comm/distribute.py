"""Distributing a module's own parameters in place: FSDP shards along dim 0, DDP replicas, and the way back.

The layout of a shard (``shard_tensor``, ``local_rows``, ``unpadded``) is defined here once: ``torch.chunk``'s
split along dim 0, every rank's shard padded to the same length. Clipping and checkpoints read shards only
through these helpers.

Why in place: ``model.parameters()`` then are the real shards (or replicas) that Fabric's wrapper and any optimizer
built the usual way update, and no full copy sits next to them. The tag each parameter gets (``tag_param``) is
thunder's format and lives in ``thunder_hooks``; this module only does the tensor arithmetic and the collectives
that move whole tensors (broadcast at set-up, gather for full checkpoints).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as tdist

from thunderviz.thunder import hooks, param_tags
from thunderviz.thunder.param_tags import SyncKind, full_shape, param_group, sync_tag

__all__ = [
    "gather_full",
    "is_sharded",
    "local_rows",
    "local_shard_of",
    "replicate_param_",
    "replicate_params_",
    "shard_param_",
    "shard_params_",
    "shard_tensor",
    "unpadded",
]


def _unique_params(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    # named_parameters() yields a shared (tied) parameter once: tagging it once makes thunder gather it once.
    yield from module.named_parameters(remove_duplicate=True)


def _chunk(rows: int, world_size: int) -> int:
    return (rows + world_size - 1) // world_size


def shard_tensor(t: torch.Tensor, rank: int, world_size: int) -> tuple[torch.Tensor, int]:
    """This rank's slice of ``t`` along dim 0, padded so every rank holds the same shape; returns (shard, padding).

    The split is ``torch.chunk``'s (chunks of ``ceil(rows / world_size)``, the last ones shorter or empty), so the
    real rows of each shard are exactly what a ``DTensor`` with ``Shard(0)`` holds on that rank.
    """
    chunk = _chunk(t.shape[0], world_size)
    padding = chunk * world_size - t.shape[0]
    start = min(chunk * rank, t.shape[0])
    real = max(0, min(t.shape[0], chunk * (rank + 1)) - start)
    shard = torch.zeros((chunk, *t.shape[1:]), dtype=t.dtype, device=t.device) if real < chunk else None
    if shard is None:
        return t.narrow(0, start, chunk).clone(), padding
    shard[:real].copy_(t.narrow(0, start, real))
    return shard, padding


def is_sharded(param: torch.Tensor) -> bool:
    """True for a parameter ``shard_param_`` sharded (and its local tensor is a padded dim-0 shard)."""
    return sync_tag(param) == SyncKind.FULLY_SHARDED


def local_rows(param: torch.Tensor) -> tuple[int, int]:
    """(first global row, number of real rows) of this rank's shard of ``param``; the rest of the shard is padding.

    A replicated or untagged parameter holds all its rows. A 0-dim parameter is sharded as shape ``(1,)``.
    """
    shape = full_shape(param)
    rows = shape[0] if shape else 1
    if not is_sharded(param):
        return 0, rows
    group = param_group(param)
    rank, world = tdist.get_rank(group), tdist.get_world_size(group)
    chunk = _chunk(rows, world)
    start = min(chunk * rank, rows)
    return start, max(0, min(rows, chunk * (rank + 1)) - start)


def unpadded(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` (shaped like ``like``'s local shard: its grad, optimizer state...) that is not padding.

    A view, so writing into it writes into ``tensor``. Replicated parameters' tensors come back whole.
    """
    if not is_sharded(like):
        return tensor
    return tensor.narrow(0, 0, local_rows(like)[1])


@torch.no_grad()
def shard_param_(
    param: torch.nn.Parameter, group: tdist.ProcessGroup, replica_group: tdist.ProcessGroup | None = None
) -> None:
    """Shard one full parameter in place along dim 0 (``param.data`` becomes this rank's padded shard) and tag it.

    ``replica_group`` (hybrid sharding): the shard is the same on every rank of that group (see ``tag_param``).
    """
    shape = tuple(param.shape)
    rank, world = tdist.get_rank(group), tdist.get_world_size(group)
    grad = param.grad
    if param.dim() == 0:
        param.data = param.data.reshape(1)
    shard, padding = shard_tensor(param.data, rank, world)
    param.data = shard
    if grad is not None:
        # A gradient from a backward run before set-up (a module jitted and trained first) keeps its meaning as
        # this rank's shard of it; left full-size, the next backward could not accumulate into it.
        param.grad = shard_tensor(grad.reshape(1) if grad.dim() == 0 else grad, rank, world)[0]
    param_tags.tag_param(
        param, SyncKind.FULLY_SHARDED, group=group, padding=padding, full_shape=shape, replica_group=replica_group
    )


def replicate_param_(param: torch.nn.Parameter, group: tdist.ProcessGroup) -> None:
    """Tag one parameter REPLICATED (its values must already be identical on every rank)."""
    param_tags.tag_param(param, SyncKind.REPLICATED, group=group, padding=0, full_shape=tuple(param.shape))


@torch.no_grad()
def shard_params_(
    module: torch.nn.Module,
    group: tdist.ProcessGroup,
    device: torch.device,
    *,
    broadcast_from: int | None = 0,
    done: frozenset[int] = frozenset(),
    replica_group: tdist.ProcessGroup | None = None,
) -> list[str]:
    """Shard every parameter of ``module`` in place along dim 0 and tag it FULLY_SHARDED; return the names.

    Parameters are first made identical on every rank (broadcast from ``broadcast_from``), because users build
    models with whatever seed each rank happens to have. Buffers stay replicated. Parameters whose ``id`` is in
    ``done`` were already distributed by this set-up (materialized from meta and sharded) and are skipped.
    ``replica_group`` (hybrid sharding): ``group`` is the shard group, and the broadcast then goes over every rank
    (the default group), so the replicas start from the same values too.
    """
    hooks.ensure_supported_thunder()
    hooks.install_sync_hook()
    names = []
    _move_and_broadcast(module, None if replica_group is not None else group, device, broadcast_from, done)
    for name, param in _unique_params(module):
        if id(param) in done:
            continue
        if sync_tag(param) is not None:
            raise ValueError(f"parameter {name!r} is already distributed by thunderviz")
        shard_param_(param, group, replica_group)
        names.append(name)
    return names


@torch.no_grad()
def replicate_params_(
    module: torch.nn.Module,
    group: tdist.ProcessGroup,
    device: torch.device,
    *,
    broadcast_from: int | None = 0,
) -> list[str]:
    """Make every parameter identical on all ranks (broadcast) and tag it REPLICATED; return the names."""
    hooks.ensure_supported_thunder()
    hooks.install_sync_hook()
    names = []
    _move_and_broadcast(module, group, device, broadcast_from, frozenset())
    for name, param in _unique_params(module):
        if sync_tag(param) is not None:
            raise ValueError(f"parameter {name!r} is already distributed by thunderviz")
        replicate_param_(param, group)
        names.append(name)
    return names


def _move_and_broadcast(
    module: torch.nn.Module,
    group: tdist.ProcessGroup,
    device: torch.device,
    broadcast_from: int | None,
    done: frozenset[int],
) -> None:
    module.to(device)
    if broadcast_from is None:
        return
    src = tdist.get_global_rank(group, broadcast_from) if group is not None else broadcast_from
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in done:
            tdist.broadcast(t.data, src=src, group=group)


@torch.no_grad()
def gather_full(param_or_shard: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """All-gather a tensor shaped like ``like``'s shard (a parameter or its optimizer state) to the full tensor.

    Every rank must call this for the same tensors in the same order (it is a collective).
    """
    if sync_tag(like) != SyncKind.FULLY_SHARDED:
        return param_or_shard.detach().clone()
    group = param_group(like)
    world = tdist.get_world_size(group)
    pieces = [torch.empty_like(param_or_shard) for _ in range(world)]
    tdist.all_gather(pieces, param_or_shard.detach().contiguous(), group=group)
    full = torch.cat(pieces, dim=0)
    shape = full_shape(like)
    full = full[: shape[0]] if shape else full[:1]
    return full.reshape(shape)


def local_shard_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The inverse of ``gather_full``: this rank's padded shard of a full tensor, shaped like ``like``."""
    if sync_tag(like) != SyncKind.FULLY_SHARDED:
        return full
    group = param_group(like)
    full = full.reshape(1) if full.dim() == 0 else full
    shard, _ = shard_tensor(full.to(like.device), tdist.get_rank(group), tdist.get_world_size(group))
    return shard
