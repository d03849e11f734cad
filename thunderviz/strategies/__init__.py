"""Fabric strategies for Lightning Thunder; importing this registers ``"thunder_fsdp"`` and ``"thunder_ddp"``."""

from __future__ import annotations

from lightning.fabric.strategies import STRATEGY_REGISTRY

from thunderviz.strategies.base import ThunderParallelStrategy
from thunderviz.strategies.ddp import ThunderDDPStrategy
from thunderviz.strategies.fsdp import ThunderFSDPStrategy

__all__ = ["ThunderDDPStrategy", "ThunderFSDPStrategy", "ThunderParallelStrategy", "register_strategies"]


def register_strategies() -> list[str]:
    """Make the strategies available by name to ``Fabric(strategy=...)``; returns the registered names."""
    before = set(STRATEGY_REGISTRY.available_strategies())
    ThunderFSDPStrategy.register_strategies(STRATEGY_REGISTRY)
    ThunderDDPStrategy.register_strategies(STRATEGY_REGISTRY)
    return sorted(set(STRATEGY_REGISTRY.available_strategies()) - before) or sorted(
        n for n in STRATEGY_REGISTRY.available_strategies() if n.startswith("thunder_")
    )


register_strategies()
