"""What the kernel calls inside each rank process (an ipyparallel engine), by ``apply``: one name per call.

The kernel never builds torch objects for the ranks: it sends ``protocol`` dataclasses, and these functions turn
them into a process group, a launched ``Fabric`` and a namespace the user's cell can rely on
(``protocol.NAMESPACE_NAMES``). ``engine.py`` and ``warm_pool.py`` name the calls through this module; each lives
in the rank-side module of its job:

    rank/identity.py  identify: who this engine is (host, pid, GPUs, the address facing the controller)
    rank/setup.py     warm_up, bind_rendezvous, set_up, check_process_group, reset: the process group
    cell_hooks.py     prepare_cell, and the pre/post-cell hooks that record the timeline and publish the report data
    rank/fabric.py    the launched Fabric for a StrategySpec
    cell_targets.py   what ran in a cell (call-count snapshots, the objects to capture)
    collect.py        the ReportData of a cell: decisions, traces, ledgers, memory
    rank/state.py     STATE, the rank's bookkeeping between cells (never in the user's namespace)

Importing any of them is cheap (torch, thunder and IPython load inside the calls), so the kernel imports this
module to name the functions it sends; a function crosses by reference to its own module.
"""

from __future__ import annotations

from thunderviz.rank.cell_hooks import prepare_cell
from thunderviz.rank.identity import identify
from thunderviz.rank.setup import bind_rendezvous, check_process_group, reset, set_up, warm_up

__all__ = ["bind_rendezvous", "check_process_group", "identify", "prepare_cell", "reset", "set_up", "warm_up"]
