"""``ThunderDDPStrategy``: data parallel for thunder-jitted models, decided by ``parallel.decisions``.

DDP-only mechanics live here, beside the strategy (as Lightning keeps ``_DDPBackwardSyncControl`` beside
``DDPStrategy``): thunder's DDP attributes on the set-up module, and ``no_backward_sync``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as tdist
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from torch import nn
from typing_extensions import override

from thunderviz.parallel.option_values import Parallelism
from thunderviz.strategies.base import ThunderParallelStrategy
from thunderviz.strategies.materialize import has_meta_tensors, materialize_, rank0_generator_state
from thunderviz.strategies.registry import register_strategy_names
from thunderviz.thunder import hooks, param_tags
from thunderviz.thunder.comm import distribute
from thunderviz.thunder.modules import user_module

__all__ = ["ThunderDDPStrategy"]


class ThunderDDPStrategy(ThunderParallelStrategy):
    """Replicates every parameter (broadcast from rank 0); gradients are all-reduced in buckets during backward.

    A model built under ``fabric.init_module(empty_init=True)`` stays on the meta device until ``fabric.setup``,
    which materializes the whole model identically on every rank (each module's ``reset_parameters()``, drawing
    from rank 0's random generator on every rank) and then broadcasts rank 0's values as for any model, so even a
    non-deterministic initialization ends up identical everywhere. ``fabric.no_backward_sync`` accumulates
    gradients locally and averages them once, before the next synchronized backward
    (``_ReplicatedBackwardSyncControl``). The options are ``parallel.options.OPTIONS``.
    """

    parallelism = Parallelism.DDP

    @property
    def bucket_size_in_mb(self) -> float:
        """Gradient all-reduce bucket size in megabytes, as ``thunder.distributed.ddp`` takes it."""
        return self.options.bucket_size_in_mb

    @override
    def _make_backward_sync_control(self) -> _BackwardSyncControl | None:
        reduce_dtype = self.options.reduce_dtype
        return _ReplicatedBackwardSyncControl(None if reduce_dtype is None else getattr(torch, str(reduce_dtype)))

    @override
    def _distribute_(self, module: nn.Module) -> dict[int, torch.Tensor]:
        group, device = self.process_group, self.root_device
        replaced: dict[int, torch.Tensor] = {}
        if has_meta_tensors(module):
            with rank0_generator_state(device, group):
                replaced = materialize_(module, device)
        distribute.replicate_params_(module, group, device)
        return replaced

    @override
    def _after_distribute(self, inner: nn.Module, jitted: Any) -> None:
        # thunder keys a DDP module's cache on no_sync and buckets its all-reduces when it sees these attributes
        hooks.mark_module_ddp(inner, jitted, self.process_group, self.bucket_size_in_mb)

    @override
    def backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        control = self._backward_sync_control
        if (
            isinstance(control, _ReplicatedBackwardSyncControl)
            and control.pending
            and not hooks.is_skipping_grad_sync()
        ):
            control.sync_pending()
        super().backward(tensor, module, *args, **kwargs)

    @override
    def _pending_accumulation(self) -> list[str]:
        control = self._backward_sync_control
        if not isinstance(control, _ReplicatedBackwardSyncControl) or not control.pending:
            return []
        return [n for m in control.pending.values() for n, p in user_module(m).named_parameters() if p.grad is not None]

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        register_strategy_names(strategy_registry, only=Parallelism.DDP)


class _ReplicatedBackwardSyncControl(_BackwardSyncControl):
    """DDP's ``no_backward_sync`` for thunder: skip the all-reduce in backward, average the local sum once later.

    thunder's own ``ThunderModule.no_sync`` all-reduces on every exit, which with Fabric's usual pattern (one
    ``no_backward_sync`` block per micro-batch) saves nothing. Here the gradients accumulated without sync are
    averaged once, right before the next synchronized backward, so the result equals torch DDP's
    ``AllReduce(sum of micro-batch gradients) / world_size`` and the collectives are paid once per window.
    """

    def __init__(self, reduce_dtype: torch.dtype | None = None) -> None:
        self.pending: dict[int, nn.Module] = {}
        self.reduce_dtype = reduce_dtype

    @override
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager:
        if not enabled:
            return nullcontext()
        return self._skip(module)

    @contextmanager
    def _skip(self, module: nn.Module) -> Iterator[None]:
        with hooks.skip_grad_sync():
            yield
        self.pending[id(module)] = module

    def sync_pending(self) -> None:
        """One all_reduce per process group and dtype (not per gradient), as the bucketed backward does, in
        ``reduce_dtype`` when one is set (the result is copied back into each gradient's own dtype)."""
        buckets: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}
        groups: dict[int, tdist.ProcessGroup] = {}
        for module in self.pending.values():
            for p in user_module(module).parameters():
                if p.grad is not None and param_tags.sync_tag(p) == param_tags.SyncKind.REPLICATED:
                    group = param_tags.param_group(p)
                    groups[id(group)] = group
                    buckets.setdefault((id(group), p.grad.dtype, p.grad.device), []).append(p.grad)
        with torch.no_grad():
            for (gid, _, _), grads in buckets.items():
                group = groups[gid]
                flat = torch.cat([g.reshape(-1) for g in grads])
                if self.reduce_dtype is not None:
                    flat = flat.to(self.reduce_dtype)  # as the backward's buckets are reduced (reduce_dtype)
                flat.div_(tdist.get_world_size(group))
                tdist.all_reduce(flat, group=group)
                pieces = flat.split([g.numel() for g in grads])
                torch._foreach_copy_(grads, [piece.view_as(g) for piece, g in zip(pieces, grads, strict=True)])
        self.pending.clear()
