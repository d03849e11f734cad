"""Measured per-rank step memory for every notebook cell: started before the user's code, read back after it.

The rank side of "measured next to predicted" (``thunder.memory.meter`` does the measuring): a cell is arbitrary
code, so the meter is started by the rank's ``pre_run_cell`` hook and stopped when the report data is collected
(``rank.collect``). Its state lives here, not in the user's namespace nor in ``rank.state.STATE``; a meter
left running by a cell whose report was never collected (it raised) is stopped when the next cell starts.

The modules the meter registers when a window opens are the ones the cell's strategy set up (read when the window
opens, so a model set up in the same cell counts); the optimizer is the one whose ``step()`` opened it.

Observation must not change what it observes: in a ``--timeline`` cell the profiler records steps 2 to N + 1 and the
recorder times the next steps with its clock alone (``timeline.record.observed_steps``); the meter measures the steps
after those (MemTracker's dispatch mode made the timeline's first two steps 7 to 15 times the steady state when both ran
on them: ``bench/observed_steps.py``). Each view says which steps it measured (``StepMemory.steps``, the timeline's
step numbers).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from thunderviz.trace.memory import StepMemory

__all__ = ["cell_finished", "cell_started"]

_meter: Any = None


def _strategy_modules(namespace: Callable[[], dict[str, Any]]) -> list[Any]:
    fabric = namespace().get("fabric")
    strategy = getattr(fabric, "strategy", None)
    return [module for _, module in getattr(strategy, "thunder_modules", None) or []]


def cell_started(namespace: Callable[[], dict[str, Any]], timeline_steps: int = 0) -> None:
    """Start measuring this cell's steps (``pre_run_cell``); ``namespace`` returns the user's namespace.
    ``timeline_steps``: the steps a timeline recording keeps after the first (0: none records); the meter leaves
    them, and the first, to the profiler."""
    global _meter
    if _meter is not None:
        _meter.stop()
        _meter = None
    try:
        from thunderviz.thunder.memory.meter import StepMemoryMeter
    except ImportError:  # torch missing on this rank: set-up reported it already
        return
    modules = functools.partial(_strategy_modules, namespace)
    if not timeline_steps:
        _meter = StepMemoryMeter(modules).start()
        return
    from thunderviz.timeline.record import observed_steps

    last = observed_steps(timeline_steps)
    skipped = (
        f"the timeline records and times steps 1-{last} (step 1 compiles), which memory is not measured on: torch's"
        " MemTracker would slow the steps the timeline times"
    )
    _meter = StepMemoryMeter(modules, skip=last, skipped=skipped).start()


def cell_finished() -> tuple[StepMemory, list[str]]:
    """Stop measuring: what was measured (for ``ReportData.step_memory``), and the class names of the optimizers that
    stepped in the cell (what the run trained with: ``ReportData.workload``)."""
    global _meter
    meter, _meter = _meter, None
    if meter is None:
        return StepMemory(None, "", note="the cell's steps were not measured (no meter was started)"), []
    return meter.stop(), list(meter.optimizers)
