"""Rank processes for notebooks and scripts. No IPython here: the notebook layer is a thin shell over these.

One job per module, in the order a cell meets them. Kernel side:

    topology.py       public: argument validation, backend choice, engines -> ranks grouped by host
    protocol.py       what crosses between kernel and rank: RankSetup, CellConfig, StrategySpec, ReportData, keys
    status.py         Phase (what a rank is doing; PHASES, their words) and RankStatusInfo (engine.status())
    engine.py         RankEngine: start/attach/run/pull/interrupt/status/restart/stop
    driver.py         waits for every rank's reply while streaming output; escalates stragglers; OUTPUT_MODES
    failures.py       FailureKind, RankFailure, CellError, RanksInterrupted, RankUsageError, the failure message
    cluster.py        where engines come from: LocalCluster (ours, watched) or AttachedCluster (never stopped)
    warm_pool.py      a LocalCluster started in the background at %load_ext, handed to the first cell
    watchdog.py       kills a local cluster whose owner died
    spawn.py          run_ranks: a function on N fresh processes, like torchrun (scripts, tests, the demo)
    rendezvous.py     torchrun environment block, rendezvous socket, cluster-facing interface (engine and spawner)
    report.py         RunReport: one cell's results from every rank

Rank side (runs inside each rank; cheap to import, so the kernel names the calls it sends):

    inside_rank.py    the names of the calls the kernel sends by apply (identify, set_up, prepare_cell, ...)
    rank_identity.py  identify: who this engine is
    rank_setup.py     the process group: warm_up, bind_rendezvous, set_up, check_process_group, reset
    rank_fabric.py    the launched Fabric for a StrategySpec
    cell_hooks.py     prepare_cell and the pre/post-cell hooks (timeline recording, publishing the report data)
    cell_targets.py   what ran in a cell: call-count snapshots, the objects to capture
    collect.py        one cell's ReportData: decisions, traces, ledgers, memory
    rank_state.py     STATE, the rank's bookkeeping between cells
    timeline_rank.py  --timeline on each rank, and merging the ranks' recordings (kernel side)
"""

from __future__ import annotations

from thunderviz.ranks.driver import OUTPUT_MODES
from thunderviz.ranks.engine import RankEngine
from thunderviz.ranks.failures import CellError, FailureKind, RankFailure, RanksInterrupted, RankUsageError
from thunderviz.ranks.protocol import StrategySpec
from thunderviz.ranks.report import RunReport
from thunderviz.ranks.spawn import run_ranks
from thunderviz.ranks.status import PHASES, Phase, RankStatusInfo
from thunderviz.ranks.topology import BACKENDS, DEFAULT_TIMEOUT_S

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "OUTPUT_MODES",
    "PHASES",
    "CellError",
    "FailureKind",
    "Phase",
    "RankEngine",
    "RankFailure",
    "RankStatusInfo",
    "RankUsageError",
    "RanksInterrupted",
    "RunReport",
    "StrategySpec",
    "run_ranks",
]
