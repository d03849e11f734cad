"""Fabric strategies for Lightning Thunder. The classes (and thunder) load on first attribute access."""

from __future__ import annotations

from typing import Any

from thunderviz.strategies.registry import register_strategy_names

__all__ = [
    "ThunderAutoStrategy",
    "ThunderDDPStrategy",
    "ThunderFSDPStrategy",
    "ThunderParallelStrategy",
    "register_strategy_names",
]

_LAZY = {
    "ThunderAutoStrategy": "thunderviz.strategies.auto",
    "ThunderDDPStrategy": "thunderviz.strategies.ddp",
    "ThunderFSDPStrategy": "thunderviz.strategies.fsdp",
    "ThunderParallelStrategy": "thunderviz.strategies.base",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'thunderviz.strategies' has no attribute {name!r}")
