"""Rank side: this rank's bookkeeping between cells (``STATE``), and what every rank-side module touches: the
user's namespace and the cell's data channel.

The bookkeeping lives here, in module state (the module is imported once per rank process), never in the user's
namespace, where a cell could see, clobber or ``%reset`` it. Importing this module is cheap: IPython and
ipyparallel load inside the functions, which run only in a rank.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from thunderviz.cell.protocol import RankSetup, StrategySpec
from thunderviz.process_rank import process_rank
from thunderviz.rank.cell_targets import CellSnapshot

__all__ = ["STATE", "RankState", "publish", "this_rank", "user_namespace"]


@dataclass
class RankState:
    """This rank's bookkeeping between cells.

    ``setup``: what ``set_up`` received; ``fabric``/``fabric_spec``: the ``Fabric`` we built and the spec it was built
    for; ``collect``: whether the post-cell hook gathers report data; ``before``: what had run when the cell
    started (``cell_targets.snapshot``); ``hook``/``pre_hook``: the registered ``post_run_cell``/``pre_run_cell``
    callbacks; ``phase_watch``: what says "compiling" during a cell. With ``--timeline``: ``timeline_steps`` (0:
    off), the ``recorder`` running between the two hooks, and the problems met starting it. ``rendezvous_socket``:
    rank 0's listening socket, from ``bind_rendezvous`` until the process group's store takes it over.
    """

    setup: RankSetup | None = None
    fabric: Any = None
    fabric_spec: StrategySpec | None = None
    collect: bool = True
    before: CellSnapshot = field(default_factory=CellSnapshot)
    hook: Any = None
    pre_hook: Any = None
    timeline_steps: int = 0
    recorder: Any = None
    timeline_problems: list[str] = field(default_factory=list)
    rendezvous_socket: socket.socket | None = None
    #: the ``cell_phase.CellPhaseWatch`` that says "compiling" while a cell's compile runs
    phase_watch: Any = None


STATE = RankState()


def user_namespace() -> dict[str, Any]:
    """The namespace user cells run in (the engine's IPython shell)."""
    from IPython import get_ipython

    return get_ipython().user_ns


def publish(data: Mapping[str, Any]) -> None:
    """Send ``data`` on the running cell's data channel (it reaches the kernel with the cell's reply)."""
    from ipyparallel.datapub import publish_data

    publish_data(dict(data))


def this_rank() -> int:
    """The rank ``set_up`` gave this process; before any set-up, what ``process_rank`` finds."""
    return STATE.setup.rank if STATE.setup is not None else process_rank().rank
