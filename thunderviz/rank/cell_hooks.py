"""Rank side: around each user cell. ``prepare_cell`` (by ``apply``, when the cell's config changed), then the
shell's ``pre_run_cell`` hook (start measuring memory; ``--timeline``: start recording), the cell, and the
``post_run_cell`` hook (stop recording, gather the report data, publish it with the cell's own reply).

Why hooks: they run inside the cell's execution, before the reply, so the data reaches the kernel with the reply
and a warm cell costs one message per rank, not two. Only user cells trigger them: our own calls arrive by
``apply``, which runs no cell. Importing this module is cheap: IPython and the timeline recorder load inside the
functions.
"""

from __future__ import annotations

import contextlib
import traceback
from typing import Any

from thunderviz.cell.protocol import PHASE_DATA_KEY, REPORT_DATA_KEY, CellConfig, ReportData, TimelinePart
from thunderviz.cell.status import Phase
from thunderviz.rank import memory as memory_measure
from thunderviz.rank.cell_targets import forget_unreachable_modules, snapshot
from thunderviz.rank.collect import collect
from thunderviz.rank.fabric import configure_fabric
from thunderviz.rank.state import STATE, publish, this_rank, user_namespace

__all__ = ["after_user_cell", "before_user_cell", "install_cell_hooks", "prepare_cell"]


def prepare_cell(config: CellConfig) -> None:
    """Before a cell whose strategy, collect or timeline flags changed, or after a failure: configure ``fabric``,
    keep the flags for the hooks, and snapshot what had run (the report compares against it)."""
    ns = user_namespace()
    configure_fabric(ns, config.strategy)
    STATE.collect = bool(config.collect)
    STATE.timeline_steps = config.steps if config.timeline else 0
    STATE.before = snapshot(ns)


# -- the hooks


def before_user_cell(_info: Any) -> None:
    """The ``pre_run_cell`` hook: with ``--timeline`` start recording this rank, and measure the memory of the cell's
    steps the recording does not keep (``rank.memory``), just before the user's code."""
    _forget_compiles()
    _watch_phase()
    if STATE.timeline_steps:
        from thunderviz.rank.timeline import start_cell_recording

        fabric = user_namespace().get("fabric")
        STATE.recorder, STATE.timeline_problems = start_cell_recording(
            STATE.timeline_steps, fabric=fabric, previous=STATE.recorder
        )
    memory_measure.cell_started(user_namespace, STATE.timeline_steps if STATE.recorder is not None else 0)


def _forget_compiles() -> None:
    """Start the cell's compile log afresh (what earlier cells compiled is not this cell's story)."""
    import sys

    if "thunderviz.thunder.reuse.compile_reuse" in sys.modules:  # nothing was compiled through a strategy otherwise
        sys.modules["thunderviz.thunder.reuse.compile_reuse"].take_events()


def _watch_phase() -> None:
    """Say "compiling" while thunder compiles during the cell (``cell_phase``); one watch per rank process."""
    if STATE.phase_watch is None:
        from thunderviz.rank.cell_phase import CellPhaseWatch

        STATE.phase_watch = CellPhaseWatch(publish)
    STATE.phase_watch.start()


def _stop_watching_phase() -> None:
    if STATE.phase_watch is not None:
        STATE.phase_watch.stop()


def after_user_cell(result: Any) -> None:
    """The ``post_run_cell`` hook: stop the recording, gather the report data, publish it with the cell's output,
    and snapshot what ran for the next cell."""
    _stop_watching_phase()
    ns = user_namespace()
    data: ReportData | None = None
    succeeded = bool(getattr(result, "success", False))
    recorder, timeline_problems = _stop_timeline(failed=not succeeded)
    captured: dict[int, Any] = {}
    try:
        if succeeded and STATE.collect:
            data = collect(ns, STATE.before, keep_bundles=True, by_object=captured, watch=STATE.phase_watch)
        forget_unreachable_modules(ns)
        STATE.before = snapshot(ns)
    except Exception:
        data = ReportData(rank=this_rank(), problems=["collecting after the cell failed:\n" + traceback.format_exc()])
    if STATE.timeline_steps or recorder is not None:
        # sent also for a cell that raised: what ran before the error, for the partial report
        data = data if data is not None else ReportData(rank=this_rank())
        data.update(_finish_timeline(recorder, failed=not succeeded, bundles=captured, problems=timeline_problems))
    if data is not None:
        publish({REPORT_DATA_KEY: data})


def install_cell_hooks() -> None:
    """Register both hooks with this rank's shell, replacing the ones an earlier ``set_up`` registered."""
    from IPython import get_ipython

    events = get_ipython().events
    for event, old in (("post_run_cell", STATE.hook), ("pre_run_cell", STATE.pre_hook)):
        if old is not None:
            with contextlib.suppress(ValueError):  # already gone
                events.unregister(event, old)
    events.register("post_run_cell", after_user_cell)
    events.register("pre_run_cell", before_user_cell)
    STATE.hook, STATE.pre_hook = after_user_cell, before_user_cell


# -- the timeline's part


def _stop_timeline(*, failed: bool) -> tuple[Any, list[str]]:
    """Stop this cell's recording, if one runs, before anything else the post-cell hook does."""
    recorder, STATE.recorder = STATE.recorder, None
    problems, STATE.timeline_problems = STATE.timeline_problems, []
    if recorder is None:
        return None, problems
    from thunderviz.rank.timeline import stop_cell_recording

    return recorder, problems + stop_cell_recording(recorder, failed=failed)


def _finish_timeline(recorder: Any, *, failed: bool, bundles: dict[int, Any], problems: list[str]) -> TimelinePart:
    from thunderviz.rank.timeline import finish_cell_recording

    if recorder is not None:
        publish({PHASE_DATA_KEY: Phase.COLLECTING})
    return finish_cell_recording(recorder, failed=failed, bundles=bundles, problems=problems)
