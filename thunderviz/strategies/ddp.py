"""``ThunderDDPStrategy``: data parallel for thunder-jitted models, decided by ``parallel.decisions``."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from torch import nn
from typing_extensions import override

from thunderviz.strategies.base import ThunderParallelStrategy, _ReplicatedBackwardSyncControl
from thunderviz.strategies.materialize import has_meta_tensors, materialize_, rank0_generator_state
from thunderviz.strategies.registry import register_strategy_names
from thunderviz.thunder import distribute

__all__ = ["ThunderDDPStrategy"]


class ThunderDDPStrategy(ThunderParallelStrategy):
    """Replicates every parameter (broadcast from rank 0); gradients are all-reduced in buckets during backward.

    Args:
        jit: ``True``: a plain module handed to ``fabric.setup`` is jitted here (case 1). ``False``: the module is
            only replicated and tagged, for use inside a function the user jits (case 2). A module the user already
            jitted is set up in place either way (case 3).
        executors: thunder executors for the ``thunder.jit`` call this strategy makes (only with ``jit=True``).
        state_dict_type: ``"full"`` (one ``torch.save`` file from rank 0, loadable anywhere) or ``"sharded"`` (a
            PyTorch Distributed Checkpoint directory). See ``strategies.checkpoint``.
        bucket_size_in_mb: gradients are packed, in the order backward produces them, into buckets of this many
            megabytes (0: one all-reduce per gradient); each bucket's all-reduce is issued as soon as its last
            gradient exists and waited for just before backward returns. Read back as ``strategy.bucket_size_in_mb``.
        **kwargs: Fabric's DDP knobs (``timeout``, ``process_group_backend``, ``start_method``) and anything else,
            passed to ``thunder.jit`` (an error where that call never happens: ``jit=False``, or an already jitted
            module).

    A model built under ``fabric.init_module(empty_init=True)`` stays on the meta device until ``fabric.setup``,
    which materializes the whole model identically on every rank (each module's ``reset_parameters()``, drawing
    from rank 0's random generator on every rank) and then broadcasts rank 0's values as for any model, so even a
    non-deterministic initialization ends up identical everywhere.
    """

    parallelism = "ddp"

    def __init__(
        self,
        jit: bool = True,
        executors: Any = None,
        state_dict_type: str = "full",
        bucket_size_in_mb: float = 25.0,
        **kwargs: Any,
    ) -> None:
        if (
            isinstance(bucket_size_in_mb, bool)
            or not isinstance(bucket_size_in_mb, (int, float))
            or bucket_size_in_mb < 0
        ):
            raise ValueError(
                f"You set `ThunderDDPStrategy(bucket_size_in_mb={bucket_size_in_mb!r})`; it must be a number >= 0"
                " (megabytes of gradients per all-reduce; 0 means one all-reduce per parameter)."
            )
        for knob in ("sharding_strategy", "bucketing_strategy"):
            if knob in kwargs:
                raise ValueError(
                    f"You set `ThunderDDPStrategy({knob}=...)`, but DDP replicates parameters: nothing is sharded or"
                    " gathered. Its gradients are all-reduced in buckets of `bucket_size_in_mb` (default 25); for"
                    f" `{knob}` use `ThunderFSDPStrategy`."
                )
        super().__init__(
            jit=jit,
            executors=executors,
            state_dict_type=state_dict_type,
            bucket_size_in_mb=float(bucket_size_in_mb),
            **kwargs,
        )

    @property
    def bucket_size_in_mb(self) -> float:
        """Gradient all-reduce bucket size in megabytes, as ``thunder.distributed.ddp`` takes it."""
        return self._bucket_size_in_mb

    @override
    def _make_backward_sync_control(self) -> _BackwardSyncControl | None:
        return _ReplicatedBackwardSyncControl()

    @override
    def _distribute_(self, module: nn.Module) -> dict[int, torch.Tensor]:
        group, device = self.process_group, self.root_device
        replaced: dict[int, torch.Tensor] = {}
        if has_meta_tensors(module):
            with rank0_generator_state(device, group):
                replaced = materialize_(module, device)
        distribute.replicate_params_(module, group, device)
        return replaced

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        register_strategy_names(strategy_registry, only_class="ThunderDDPStrategy")
