"""Measured per-rank step memory for every notebook cell: started before the user's code, read back after it.

The rank side of "measured next to predicted" (``thunder.memory_meter`` does the measuring): a cell is arbitrary
code, so the meter is started by the rank's ``pre_run_cell`` hook and stopped when the report data is collected
(``ranks.collect``). Its state lives here, not in the user's namespace nor in ``rank_state.STATE``; a meter
left running by a cell whose report was never collected (it raised) is stopped when the next cell starts.

The modules the meter registers when a window opens are the ones the cell's strategy set up (read when the window
opens, so a model set up in the same cell counts); the optimizer is the one whose ``step()`` opened it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thunderviz.trace.memory import StepMemory

__all__ = ["cell_finished", "cell_started"]

_meter: Any = None


def _strategy_modules(namespace: Callable[[], dict[str, Any]]) -> list[Any]:
    fabric = namespace().get("fabric")
    strategy = getattr(fabric, "strategy", None)
    return [module for _, module in getattr(strategy, "thunder_modules", None) or []]


def cell_started(namespace: Callable[[], dict[str, Any]]) -> None:
    """Start measuring this cell's steps (``pre_run_cell``); ``namespace`` returns the user's namespace."""
    global _meter
    if _meter is not None:
        _meter.stop()
        _meter = None
    try:
        from thunderviz.thunder.memory_meter import StepMemoryMeter
    except ImportError:  # torch missing on this rank: set-up reported it already
        return
    _meter = StepMemoryMeter(lambda: _strategy_modules(namespace)).start()


def cell_finished() -> StepMemory:
    """Stop measuring and return what was measured (for ``ReportData.step_memory``)."""
    global _meter
    meter, _meter = _meter, None
    if meter is None:
        return StepMemory(None, "", note="the cell's steps were not measured (no meter was started)")
    return meter.stop()
