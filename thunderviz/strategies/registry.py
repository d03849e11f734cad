"""The Fabric strategy names thunderviz provides, registered without importing lightning (or thunder) ourselves.

``import thunderviz`` must make ``Fabric(strategy="thunder_fsdp")`` work, yet ``thunderviz render FILE``, a notebook
kernel or a helper process that never trains should not pay the 2-4 s that importing lightning costs. Lightning
offers no plug-in mechanism for strategies (its entry points cover callbacks only); Fabric looks names up in
``lightning.fabric.strategies.STRATEGY_REGISTRY``, a dict filled when that module is imported. So
``register_when_lightning_loads`` registers our names at exactly that moment:

- if the registry module is already imported, it registers now;
- otherwise it puts a small finder on ``sys.meta_path`` that wraps the loader of that one module and registers
  right after the module has executed, before anyone can call ``Fabric(...)``. The finder delegates the real
  finding to the rest of ``sys.meta_path`` and changes nothing else about the import.

Both ``lightning.fabric.strategies`` and the standalone ``lightning_fabric.strategies`` (a separate registry) are
covered. The registered factories import the strategy classes (and thunder) on first use.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

from thunderviz.parallel.option_values import Parallelism
from thunderviz.parallel.strategy_options import AUTO_STRATEGY, REGISTERED_STRATEGIES

__all__ = ["FABRIC_REGISTRY_MODULES", "register_strategy_names", "register_when_lightning_loads"]

#: The modules that define a Fabric ``STRATEGY_REGISTRY`` (the unified package and the standalone one).
FABRIC_REGISTRY_MODULES: tuple[str, ...] = ("lightning.fabric.strategies", "lightning_fabric.strategies")


def _factory(class_name: str) -> Any:
    def make(**kwargs: Any) -> Any:
        import thunderviz.strategies as strategies

        return getattr(strategies, class_name)(**kwargs)

    make.__name__ = class_name
    make.__qualname__ = class_name
    return make


def register_strategy_names(registry: Any = None, only: Parallelism | str | None = None) -> list[str]:
    """Register ``parallel.strategy_options.REGISTERED_STRATEGIES`` and the auto strategy (``AUTO_STRATEGY``) in
    Fabric's strategy registry (``override=True``: safe to call again); return the names. ``only``: just the names of
    one parallelism, or ``"auto"`` for the auto strategy's. Without ``registry`` this imports lightning and uses
    ``lightning.fabric.strategies.STRATEGY_REGISTRY``.
    """
    if registry is None:
        from lightning.fabric.strategies import STRATEGY_REGISTRY as registry
    names = []
    for name, entry in REGISTERED_STRATEGIES.items():
        if only is not None and entry.parallelism is not only:
            continue
        factory = _factory(entry.parallelism.strategy_name)
        registry.register(name, factory, description=entry.description, override=True, **dict(entry.preset))
        names.append(name)
    if only is None or only == "auto":
        name, description = AUTO_STRATEGY
        registry.register(name, _factory("ThunderAutoStrategy"), description=description, override=True)
        names.append(name)
    return names


def _register_in(module: ModuleType) -> None:
    registry = getattr(module, "STRATEGY_REGISTRY", None)
    if registry is not None:
        register_strategy_names(registry)


class _RegisteringLoader(importlib.abc.Loader):
    """Runs the real loader, then registers our names in the registry the module just created."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _register_in(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ... as the real loader has them
        return getattr(self._loader, name)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the registry modules it asks the other finders and wraps the loader they return."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        if fullname not in FABRIC_REGISTRY_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def register_when_lightning_loads() -> None:
    """Make our names available in every Fabric strategy registry, now or when it is imported (idempotent)."""
    for name in FABRIC_REGISTRY_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            _register_in(module)
    if not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
