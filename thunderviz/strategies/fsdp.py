"""``ThunderFSDPStrategy``: fully sharded data parallel for thunder-jitted models, decided by ``parallel.decisions``."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.strategies.registry import _StrategyRegistry
from torch import nn
from typing_extensions import override

from thunderviz.parallel.options import Parallelism
from thunderviz.strategies.base import ThunderParallelStrategy
from thunderviz.strategies.materialize import has_meta_tensors, materialize_, rank0_generator_state
from thunderviz.strategies.registry import register_strategy_names
from thunderviz.thunder import distribute
from thunderviz.thunder.hooks import fsdp_enums

__all__ = ["ThunderFSDPStrategy"]


class ThunderFSDPStrategy(ThunderParallelStrategy):
    """Shards every parameter along dim 0 across ranks; gathers them per bucket in forward, reduce-scatters grads.

    A model built under ``fabric.init_module(empty_init=True)`` stays on the meta device until ``fabric.setup``,
    which materializes it module by module with each module's ``reset_parameters()`` (rank 0's random generator
    on every rank) and keeps only this rank's shard of each parameter right away: a rank's peak memory is its
    shards plus the largest single module. The options are ``parallel.options.OPTIONS``; ``sharding_strategy`` and
    ``bucketing_strategy`` read back as thunder's own enums (``strategy.sharding_strategy is FSDPType.ZERO3``).
    """

    parallelism = Parallelism.FSDP

    @property
    def sharding_strategy(self) -> Any:
        """thunder's ``FSDPType`` member of the ``sharding_strategy`` option."""
        return fsdp_enums()[0][self.options.sharding_strategy.value]

    @property
    def bucketing_strategy(self) -> Any:
        """thunder's ``FSDPBucketingStrategy`` member of the ``bucketing_strategy`` option."""
        return fsdp_enums()[1][self.options.bucketing_strategy.value]

    @override
    def _distribute_(self, module: nn.Module) -> dict[int, torch.Tensor]:
        group, device = self.process_group, self.root_device
        replaced: dict[int, torch.Tensor] = {}
        done: frozenset[int] = frozenset()
        if has_meta_tensors(module):
            with rank0_generator_state(device, group):
                replaced = materialize_(module, device, keep=lambda _name, p: distribute.shard_param_(p, group))
            done = frozenset(id(p) for p in module.parameters() if distribute.is_sharded(p))
        distribute.shard_params_(module, group, device, done=done)
        return replaced

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        register_strategy_names(strategy_registry, only=Parallelism.FSDP)
