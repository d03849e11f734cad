"""thunderviz: Fabric strategies that decide well when to ``thunder.jit`` and where to shard, and a notebook
layer that shows what Thunder did on every rank.

The public API is this module's ``__all__``; each name loads its module on first use (PEP 562 ``__getattr__``),
so ``import thunderviz`` imports none of torch, lightning, thunder, IPython or ipywidgets: a training script, a
rank process and ``thunderviz render FILE`` pay only for what they touch. The ``"thunder_fsdp"`` /
``"thunder_ddp"`` Fabric strategy names are registered the moment lightning's strategy registry is imported (see
``thunderviz.strategies.registry``), so ``Fabric(strategy="thunder_fsdp")`` works after ``import thunderviz``.
"""

from __future__ import annotations

import importlib
from typing import Any

from thunderviz.errors import (
    JitDecisionError,
    PlanError,
    RankError,
    ThundervizError,
    TraceCaptureError,
    TraceFormatError,
    UnsupportedThunderError,
    UntraceableModelError,
)
from thunderviz.strategies.registry import register_when_lightning_loads as _register_strategy_names

__version__ = "0.1.0"

# public name -> the module that defines it, imported on first access.
_LAZY: dict[str, str] = {
    "Plan": "thunderviz.strategies.planning",
    "ThunderAutoStrategy": "thunderviz.strategies",
    "ThunderDDPStrategy": "thunderviz.strategies",
    "ThunderFSDPStrategy": "thunderviz.strategies",
    "TraceBundle": "thunderviz.trace.model",
    "TimelineView": "thunderviz.notebook.timeline_widget",
    "TraceView": "thunderviz.notebook.widgets",
    "capture": "thunderviz.thunder.capture.traces",
    "collective_changes": "thunderviz.trace.diff",
    "compare": "thunderviz.notebook.compare",
    "compare_runs": "thunderviz.reports.strategy_table",
    "load": "thunderviz.trace.file",
    "plan": "thunderviz.strategies.planning",
    "record_timeline": "thunderviz.timeline.record",
    "render_html": "thunderviz.render.html",
    "run_ranks": "thunderviz.pool.spawn",
    "save": "thunderviz.trace.file",
}

__all__ = [
    "JitDecisionError",
    "Plan",
    "PlanError",
    "RankError",
    "ThunderAutoStrategy",
    "ThunderDDPStrategy",
    "ThunderFSDPStrategy",
    "ThundervizError",
    "TimelineView",
    "TraceBundle",
    "TraceCaptureError",
    "TraceFormatError",
    "TraceView",
    "UnsupportedThunderError",
    "UntraceableModelError",
    "capture",
    "collective_changes",
    "compare",
    "compare_runs",
    "load",
    "load_ipython_extension",
    "plan",
    "record_timeline",
    "render_html",
    "run_ranks",
    "save",
]

_register_strategy_names()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'thunderviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext thunderviz``: registers ``%%thunder_fsdp``, ``%%thunder_ddp`` and ``%thunder_ranks``."""
    from thunderviz.notebook.magics import register

    register(ipython)
