"""``ThunderFSDPStrategy``: fully sharded data parallel for thunder-jitted models, decided by ``parallel.decisions``."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.strategies.registry import _StrategyRegistry
from torch import nn
from typing_extensions import override

from thunderviz.parallel.decisions import BUCKETING_STRATEGIES, DEFAULT_BUCKETING_STRATEGY, SHARDING_STRATEGIES
from thunderviz.strategies.base import ThunderParallelStrategy
from thunderviz.strategies.materialize import has_meta_tensors, materialize_, rank0_generator_state
from thunderviz.strategies.registry import register_strategy_names
from thunderviz.thunder import distribute
from thunderviz.thunder.hooks import fsdp_enums

__all__ = ["ThunderFSDPStrategy"]


def _enum_member(value: Any, enum: Any, allowed: tuple[str, ...], knob: str) -> Any:
    """thunder's enum member for a knob given as that member or as its name (any case)."""
    name = value.name if isinstance(value, enum) else str(value).upper()
    if name not in allowed or not isinstance(value, (str, enum)):
        raise ValueError(
            f"You set `ThunderFSDPStrategy({knob}={value!r})`; choose one of {', '.join(repr(a) for a in allowed)}"
            f" (or thunder's `{enum.__name__}` member of the same name)."
        )
    return enum[name]


class ThunderFSDPStrategy(ThunderParallelStrategy):
    """Shards every parameter along dim 0 across ranks; gathers them per bucket in forward, reduce-scatters grads.

    Args:
        jit: ``True``: a plain module handed to ``fabric.setup`` is jitted here (case 1). ``False``: the module is
            only sharded, for use inside a function the user jits (case 2). A module the user already jitted is
            sharded in place either way (case 3).
        executors: thunder executors for the ``thunder.jit`` call this strategy makes (only with ``jit=True``).
        sharding_strategy: ``"ZERO2"`` or ``"ZERO3"`` (or ``thunder.distributed.FSDPType``); read back as the enum
            (``strategy.sharding_strategy is FSDPType.ZERO3``). ZERO2 keeps the parameters gathered in forward for
            backward; ZERO3 gathers them again in backward from their shards, so forward saves shards only.
        bucketing_strategy: ``"BLOCK"`` (default), ``"LAYER"`` or ``"NONE"`` (or ``FSDPBucketingStrategy``), read
            back as the enum: which parameters share one all_gather / reduce_scatter — one per block (the children
            of the model's repeated ModuleList/Sequential) plus one for the rest, one per layer, or one per
            parameter. See ``thunderviz.parallel.buckets``; the decision log says what was found and why BLOCK is the
            default.
        state_dict_type: ``"sharded"`` (a PyTorch Distributed Checkpoint directory, loadable at any world size) or
            ``"full"`` (one ``torch.save`` file, loadable anywhere). See ``strategies.checkpoint``.
        **kwargs: Fabric's DDP knobs (``timeout``, ``process_group_backend``, ``start_method``) and anything else,
            passed to ``thunder.jit`` (an error where that call never happens: ``jit=False``, or an already jitted
            module).

    A model built under ``fabric.init_module(empty_init=True)`` stays on the meta device until ``fabric.setup``,
    which materializes it module by module with each module's ``reset_parameters()`` (rank 0's random generator
    on every rank) and keeps only this rank's shard of each parameter right away: a rank's peak memory is its
    shards plus the largest single module.
    """

    parallelism = "fsdp"

    def __init__(
        self,
        jit: bool = True,
        executors: Any = None,
        sharding_strategy: Any = "ZERO2",
        bucketing_strategy: Any = DEFAULT_BUCKETING_STRATEGY,
        state_dict_type: str = "sharded",
        **kwargs: Any,
    ) -> None:
        if "bucket_size_in_mb" in kwargs:
            raise ValueError(
                "You set `ThunderFSDPStrategy(bucket_size_in_mb=...)`, but FSDP buckets parameters by the model's"
                " structure, not by size: use `bucketing_strategy='BLOCK'` (one collective per block), 'LAYER' or"
                " 'NONE'. `bucket_size_in_mb` is `ThunderDDPStrategy`'s knob for its gradient all-reduces."
            )
        fsdp_type, fsdp_bucketing = fsdp_enums()
        self.sharding_strategy = _enum_member(sharding_strategy, fsdp_type, SHARDING_STRATEGIES, "sharding_strategy")
        self.bucketing_strategy = _enum_member(
            bucketing_strategy, fsdp_bucketing, BUCKETING_STRATEGIES, "bucketing_strategy"
        )
        super().__init__(
            jit=jit,
            executors=executors,
            state_dict_type=state_dict_type,
            sharding_strategy=self.sharding_strategy.name,
            bucketing_strategy=self.bucketing_strategy.name,
            **kwargs,
        )

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
        register_strategy_names(strategy_registry, only_class="ThunderFSDPStrategy")
