"""The Fabric strategy names thunderviz provides, registered without importing thunder.

``import thunderviz`` must make ``Fabric(strategy="thunder_fsdp")`` work, but a notebook kernel or a helper
process that never trains should not pay for importing thunder; so the registry holds small factories that import
the strategy classes on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["STRATEGY_NAMES", "register_strategy_names"]

#: name -> (class name in thunderviz.strategies, constructor arguments, description)
STRATEGY_NAMES: dict[str, tuple[str, dict[str, Any], str]] = {
    "thunder_fsdp": ("ThunderFSDPStrategy", {}, "Lightning Thunder FSDP with thunderviz's jit decisions"),
    "thunder_fsdp_zero3": (
        "ThunderFSDPStrategy",
        {"sharding_strategy": "ZERO3"},
        "Lightning Thunder FSDP, ZERO3 requested (traced as ZERO2 by thunder 0.2.6)",
    ),
    "thunder_ddp": ("ThunderDDPStrategy", {}, "Lightning Thunder DDP with thunderviz's jit decisions"),
}


def _factory(class_name: str) -> Any:
    def make(**kwargs: Any) -> Any:
        import thunderviz.strategies as strategies

        return getattr(strategies, class_name)(**kwargs)

    make.__name__ = class_name
    make.__qualname__ = class_name
    return make


def register_strategy_names(registry: Any = None, only_class: str | None = None) -> list[str]:
    """Register our names in Fabric's strategy registry (``override=True``: safe to call again); return them."""
    if registry is None:
        from lightning.fabric.strategies import STRATEGY_REGISTRY as registry
    names = []
    for name, (class_name, init_params, description) in STRATEGY_NAMES.items():
        if only_class is not None and class_name != only_class:
            continue
        registry.register(name, _factory(class_name), description=description, override=True, **init_params)
        names.append(name)
    return names
