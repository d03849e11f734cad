"""What a rank is doing: its ``Phase``, and ``RankStatusInfo``, one rank's line of ``RankEngine.status()``.

The phases print as their words (``str(Phase.RUNNING) == "running"``, and they compare equal to them), so status
lines, the ``RankStatus`` widget's chips and the JSON a front end receives read as before. Plain Python: the rank
side publishes ``Phase.COLLECTING`` and the kernel side reads it, so both import this cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

from thunderviz.parallel.options import TextEnum

__all__ = ["PHASES", "Phase", "RankStatusInfo"]


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
