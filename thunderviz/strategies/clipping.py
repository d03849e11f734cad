"""Gradient clipping over a model whose parameters are sharded (FSDP) or replicated (DDP) across ranks.

Why not ``torch.nn.utils.clip_grad_norm_``: on a rank it sees only that rank's shards, so each rank would scale its
shards by a different factor (the norm of its own shard) and the model would silently stop being the one a single
process trains. Here the norm is the global one: each rank adds up the real (non-padding) elements of its shards,
one all-reduce per process group combines them, and replicated gradients count once. The result and the clipping
equal ``torch.nn.utils.clip_grad_norm_`` on the full gradients of one process.

Written against per-parameter shards (``distribute.unpadded``), so when parameters are later packed into flat
buckets, only the function that yields each parameter's real local elements has to change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as tdist

from thunderviz.thunder.comm import distribute
from thunderviz.thunder.param_tags import param_group

__all__ = ["clip_grad_norm_", "clip_grad_value_", "global_grad_norm"]


def _norm_type(norm_type: float | str) -> float:
    value = float(norm_type)
    if value <= 0 and not math.isinf(value):
        raise ValueError(f"`fabric.clip_gradients(norm_type={norm_type!r})`: use a positive number or 'inf'.")
    return value


@torch.no_grad()
def global_grad_norm(parameters: Iterable[torch.Tensor], norm_type: float | str = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients of ``parameters`` as one vector, over every rank's shards.

    A collective for sharded parameters: every rank must call it with the same parameters in the same order.
    Padding rows are excluded; replicated gradients (identical on every rank) are counted once.
    """
    p_norm = _norm_type(norm_type)
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    device = params[0].grad.device
    dtype = torch.promote_types(params[0].grad.dtype, torch.float32)
    local = torch.zeros((), dtype=dtype, device=device)  # replicated (or undistributed) part, complete on every rank
    sharded: dict[tdist.ProcessGroup, torch.Tensor] = {}
    for p in params:
        real = distribute.unpadded(p.grad, p)
        if real.numel() == 0:
            part = torch.zeros((), dtype=dtype, device=device)
        elif math.isinf(p_norm):
            part = real.detach().abs().max().to(device, dtype)
        else:
            part = torch.linalg.vector_norm(real.detach(), p_norm).to(device, dtype) ** p_norm
        if distribute.is_sharded(p):
            group = param_group(p)
            acc = sharded.setdefault(group, torch.zeros((), dtype=dtype, device=device))
            sharded[group] = torch.maximum(acc, part) if math.isinf(p_norm) else acc + part
        else:
            local = torch.maximum(local, part) if math.isinf(p_norm) else local + part
    total = local
    for group, acc in sharded.items():
        tdist.all_reduce(acc, op=tdist.ReduceOp.MAX if math.isinf(p_norm) else tdist.ReduceOp.SUM, group=group)
        total = torch.maximum(total, acc) if math.isinf(p_norm) else total + acc
    return total if math.isinf(p_norm) else total ** (1.0 / p_norm)


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float | str = 2.0,
    error_if_nonfinite: bool = True,
) -> torch.Tensor:
    """Scale all gradients so their global norm is at most ``max_norm``; return the global norm before clipping.

    Same formula as ``torch.nn.utils.clip_grad_norm_`` (``max_norm / (norm + 1e-6)``, capped at 1), with the norm
    taken over every rank's shards, so every rank applies the same factor.
    """
    params = [p for p in parameters if p.grad is not None]
    total = global_grad_norm(params, norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} of the gradients is non-finite ({float(total)}), so"
            " `fabric.clip_gradients` cannot clip them (every rank sees the same global norm). Find where the"
            " gradients overflow, or pass `error_if_nonfinite=False` to scale them by the non-finite norm anyway."
        )
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef.to(p.grad.device, p.grad.dtype))
    return total


@torch.no_grad()
def clip_grad_value_(parameters: Iterable[torch.Tensor], clip_value: float) -> None:
    """Clamp every gradient element to ``[-clip_value, clip_value]``: element-wise, so exact on shards as they are."""
    for p in parameters:
        if p.grad is not None:
            p.grad.clamp_(min=-clip_value, max=clip_value)
