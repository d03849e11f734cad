"""What a rank is doing: its ``Phase``, and ``RankStatusInfo``, one rank's line of ``RankEngine.status()``.

The phases print as their words (``str(Phase.RUNNING) == "running"``, and they compare equal to them), so status
lines, the ``RankStatus`` widget's chips and the JSON a front end receives read as before. Plain Python: the rank
side publishes ``Phase.COMPILING`` and ``Phase.COLLECTING`` (``PUBLISHED``) and the kernel side reads them, so both
import this cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

from thunderviz.parallel.option_values import TextEnum

__all__ = ["PHASES", "PUBLISHED", "Phase", "RankStatusInfo"]


class Phase(TextEnum):
    """What ``on_status`` reports per rank, in the order a cell meets them."""

    #: the rank process is starting (or restarting)
    STARTING = "starting"
    #: importing torch and thunder, joining the process group
    IMPORTING = "importing"
    #: ready for a cell
    WAITING = "waiting"
    #: building ``fabric`` for a new strategy
    CONFIGURING = "configuring"
    #: running the user's cell
    RUNNING = "running"
    #: inside the cell, thunder (or inductor) is compiling: a jitted function's first call, or one with new inputs
    #: (the rank says so while it happens: ``cell_phase``)
    COMPILING = "compiling"
    #: capturing traces (and the timeline) for the report, after the cell
    COLLECTING = "collecting"
    DONE = "done"
    FAILED = "failed"
    #: stopped by the user's Ctrl-C (or killed after not stopping in time)
    INTERRUPTED = "interrupted"
    #: the pool was stopped
    STOPPED = "stopped"


#: The phases' words, in order (what the ``RankStatus`` widget accepts).
PHASES: tuple[str, ...] = tuple(p.value for p in Phase)

#: The phases a rank publishes while a cell runs (the kernel shows the latest until the reply).
PUBLISHED: tuple[Phase, ...] = (Phase.RUNNING, Phase.COMPILING, Phase.COLLECTING)


@dataclass(frozen=True)
class RankStatusInfo:
    """One rank of ``RankEngine.status()``: its phase, the engine that runs it, where, and whether it lives.

    ``alive`` is ``None`` for an attached cluster (its controller watches the engines, we cannot see their pids).
    """

    phase: Phase
    engine_id: int
    host: str
    pid: int
    alive: bool | None
