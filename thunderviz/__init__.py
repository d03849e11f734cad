"""thunderviz: Fabric strategies that decide well when to ``thunder.jit`` and where to shard, and a notebook
layer that shows what Thunder did on every rank.

Importing the package registers the ``"thunder_fsdp"`` and ``"thunder_ddp"`` Fabric strategy names; the strategy
classes (and thunder) load on first use. The notebook layer (IPython magics, widgets) is imported only by
``load_ipython_extension``, so importing ``thunderviz`` in a training script never pulls in IPython.
"""

from __future__ import annotations

from typing import Any

from thunderviz.errors import (
    JitDecisionError,
    RankError,
    ThundervizError,
    TraceFormatError,
    UnsupportedThunderError,
)
from thunderviz.strategies.registry import register_strategy_names

__version__ = "0.1.0"

__all__ = [
    "JitDecisionError",
    "RankError",
    "ThunderDDPStrategy",
    "ThunderFSDPStrategy",
    "ThundervizError",
    "TraceFormatError",
    "UnsupportedThunderError",
    "compare",
    "load_ipython_extension",
]


register_strategy_names()


def __getattr__(name: str) -> Any:
    # The strategies import thunder (seconds); load them when first used, not on ``import thunderviz``.
    if name in ("ThunderDDPStrategy", "ThunderFSDPStrategy"):
        import thunderviz.strategies

        return getattr(thunderviz.strategies, name)
    if name == "compare":  # a widget: IPython/ipywidgets load only when it is asked for
        from thunderviz.notebook.compare import compare

        return compare
    raise AttributeError(f"module 'thunderviz' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext thunderviz``: registers ``%%thunder_fsdp``, ``%%thunder_ddp`` and ``%thunder_ranks``."""
    from thunderviz.notebook.magics import register

    register(ipython)
