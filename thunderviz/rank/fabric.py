"""Rank side: the launched ``Fabric`` in the namespace, built from the ``StrategySpec`` a cell sent.

The spec's options were parsed in the kernel; here they only go to the strategy class (``from_options``). A spec
that did not change keeps the ``Fabric`` of earlier cells, so objects set up there stay attached to the same
strategy. Importing this module is cheap: lightning and the strategies load inside the functions.
"""

from __future__ import annotations

from typing import Any

from thunderviz.cell.protocol import StrategySpec
from thunderviz.rank.state import STATE

__all__ = ["build_strategy", "configure_fabric"]


def build_strategy(spec: StrategySpec) -> Any:
    """The strategy object (or Fabric's name for one of its own) for a ``StrategySpec``."""
    if spec.options is None:
        # One of Fabric's own registered strategies by name (e.g. "ddp"): used before ours exist, and in tests.
        return spec.fabric_name
    import thunderviz.strategies as strategies

    return getattr(strategies, spec.options.strategy_name).from_options(spec.options)


def configure_fabric(ns: dict[str, Any], spec: StrategySpec | None) -> None:
    """Put a launched ``Fabric`` for ``spec`` in the namespace; keep the existing one when the spec is unchanged
    and ``fabric`` still names it, so objects set up in earlier cells stay attached to the same strategy.

    Raises:
        RuntimeError: no ``set_up`` ran in this process yet (the kernel always sends it first).
    """
    if spec is None or (STATE.fabric_spec == spec and ns.get("fabric") is STATE.fabric):
        return
    setup = STATE.setup
    if setup is None:
        raise RuntimeError("configure_fabric needs set_up() first: the process group and devices come from it")
    import lightning.fabric.connector as connector
    from lightning.fabric import Fabric

    # An ipyparallel engine runs an IPython shell, so Fabric believes it is in a notebook and refuses "ddp"-style
    # strategies (it would fork workers from there). This process *is* a worker whose group was created
    # externally, which is exactly the case Fabric's check exists to allow.
    connector._IS_INTERACTIVE = False
    fabric = Fabric(
        accelerator="cuda" if setup.backend == "nccl" else "cpu",
        devices=setup.local_world_size,
        num_nodes=setup.num_nodes,
        strategy=build_strategy(spec),
    )
    fabric.launch()
    ns["fabric"] = STATE.fabric = fabric
    STATE.fabric_spec = spec
