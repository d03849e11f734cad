"""Distributing a module's own parameters in place: FSDP shards along dim 0, DDP replicas, and the way back.

Why in place: ``model.parameters()`` then are the real shards (or replicas) that Fabric's wrapper and any optimizer
built the usual way update, and no full copy sits next to them. The tag each parameter gets (``tag_param``) is
thunder's format and lives in ``thunder_hooks``; this module only does the tensor arithmetic and the collectives
that move whole tensors (broadcast at set-up, gather for full checkpoints).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as tdist

from thunderviz.core import thunder_hooks as hooks
from thunderviz.core.thunder_hooks import SyncKind, full_shape, param_group, sync_tag

__all__ = [
    "gather_full",
    "local_shard_of",
    "replicate_params_",
    "shard_params_",
    "shard_tensor",
]


def _unique_params(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    # named_parameters() yields a shared (tied) parameter once: tagging it once makes thunder gather it once.
    yield from module.named_parameters(remove_duplicate=True)


def shard_tensor(t: torch.Tensor, rank: int, world_size: int) -> tuple[torch.Tensor, int]:
    """This rank's slice of ``t`` along dim 0, padded so every rank holds the same shape; returns (shard, padding)."""
    chunk = (t.shape[0] + world_size - 1) // world_size
    padding = chunk * world_size - t.shape[0]
    if padding:
        padded = torch.zeros((chunk * world_size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        padded[: t.shape[0]].copy_(t)
        t = padded
    return t.narrow(0, chunk * rank, chunk).clone(), padding


@torch.no_grad()
def shard_params_(
    module: torch.nn.Module, group: tdist.ProcessGroup, device: torch.device, *, broadcast_from: int | None = 0
) -> list[str]:
    """Shard every parameter of ``module`` in place along dim 0 and tag it FULLY_SHARDED; return the names.

    Parameters are first made identical on every rank (broadcast from ``broadcast_from``), because users build
    models with whatever seed each rank happens to have. Buffers stay replicated.
    """
    hooks.ensure_supported_thunder()
    hooks.install_sync_hook()
    rank, world = tdist.get_rank(group), tdist.get_world_size(group)
    names = []
    _move_and_broadcast(module, group, device, broadcast_from)
    for name, param in _unique_params(module):
        if sync_tag(param) is not None:
            raise ValueError(f"parameter {name!r} is already distributed by thunderviz")
        shape = tuple(param.shape)
        if param.dim() == 0:
            param.data = param.data.reshape(1)
        shard, padding = shard_tensor(param.data, rank, world)
        param.data = shard
        hooks.tag_param(param, SyncKind.FULLY_SHARDED, group=group, padding=padding, full_shape=shape)
        names.append(name)
    return names


@torch.no_grad()
def replicate_params_(
    module: torch.nn.Module, group: tdist.ProcessGroup, device: torch.device, *, broadcast_from: int | None = 0
) -> list[str]:
    """Make every parameter identical on all ranks (broadcast) and tag it REPLICATED; return the names."""
    hooks.ensure_supported_thunder()
    hooks.install_sync_hook()
    names = []
    _move_and_broadcast(module, group, device, broadcast_from)
    for name, param in _unique_params(module):
        if sync_tag(param) is not None:
            raise ValueError(f"parameter {name!r} is already distributed by thunderviz")
        hooks.tag_param(param, SyncKind.REPLICATED, group=group, padding=0, full_shape=tuple(param.shape))
        names.append(name)
    return names


def _move_and_broadcast(
    module: torch.nn.Module, group: tdist.ProcessGroup, device: torch.device, broadcast_from: int | None
) -> None:
    module.to(device)
    if broadcast_from is None:
        return
    src = tdist.get_global_rank(group, broadcast_from) if group is not None else broadcast_from
    for t in [*module.parameters(), *module.buffers()]:
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
