"""``ThunderDDPStrategy``: data parallel for thunder-jitted models, decided by ``core.decisions``."""

from __future__ import annotations

from typing import Any

from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from torch import nn
from typing_extensions import override

from thunderviz.core import distribute
from thunderviz.strategies.registry import register_strategy_names
from thunderviz.strategies.base import ThunderParallelStrategy, _ReplicatedBackwardSyncControl

__all__ = ["ThunderDDPStrategy"]


class ThunderDDPStrategy(ThunderParallelStrategy):
    """Replicates every parameter (broadcast from rank 0); thunder all-reduces each gradient in backward.

    Args:
        jit: ``True``: a plain module handed to ``fabric.setup`` is jitted here (case 1). ``False``: the module is
            only replicated and tagged, for use inside a function the user jits (case 2). A module the user already
            jitted is set up in place either way (case 3).
        executors: thunder executors for the ``thunder.jit`` call this strategy makes (only with ``jit=True``).
        state_dict_type: ``"sharded"`` (one file per rank) or ``"full"`` (one file from rank 0).
        bucket_size_in_mb: gradient all-reduce bucket size for a jitted module, as in ``thunder.distributed.ddp``
            (0 disables bucketing).
        **kwargs: Fabric's DDP knobs (``timeout``, ``process_group_backend``, ``start_method``) and anything else,
            passed to ``thunder.jit``.
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
        super().__init__(jit=jit, executors=executors, state_dict_type=state_dict_type, **kwargs)
        self._bucket_size_in_mb = float(bucket_size_in_mb)

    @override
    def _make_backward_sync_control(self) -> _BackwardSyncControl | None:
        return _ReplicatedBackwardSyncControl()

    @override
    def _distribute_(self, module: nn.Module) -> list[str]:
        return distribute.replicate_params_(module, self.process_group, self.root_device)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        register_strategy_names(strategy_registry, only_class="ThunderDDPStrategy")
