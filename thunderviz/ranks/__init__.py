"""Rank processes for notebooks and scripts. No IPython here: the notebook layer is a thin shell over these.

One job per module, in the order a cell meets them:

    topology.py     public: argument validation, backend choice, engines -> ranks grouped by host
    protocol.py     what crosses between kernel and rank: RankSetup, CellConfig, StrategySpec, ReportData, keys
    engine.py       RankEngine: start/attach/run/pull/interrupt/status/restart/stop (kernel side)
    driver.py       waits for every rank's reply while streaming output; escalates stragglers; PHASES, OUTPUT_MODES
    failures.py     RankFailure, CellError, RanksInterrupted, RankUsageError, the failure message
    inside_rank.py  runs inside each rank: set-up, fabric, the post-cell report hook
    cluster.py      where engines come from: LocalCluster (ours, watched) or AttachedCluster (never stopped)
    warm_pool.py    a LocalCluster started in the background at %load_ext, handed to the first cell
    watchdog.py     kills a local cluster whose owner died
    spawn.py        run_ranks: a function on N fresh processes, like torchrun (scripts, tests, the demo)
    rendezvous.py   torchrun environment block, rendezvous socket, cluster-facing interface (engine and spawner)
    report.py       RunReport: one cell's results from every rank
"""

from __future__ import annotations

from thunderviz.ranks.driver import OUTPUT_MODES, PHASES
from thunderviz.ranks.engine import RankEngine
from thunderviz.ranks.failures import CellError, RankFailure, RanksInterrupted, RankUsageError
from thunderviz.ranks.protocol import StrategySpec
from thunderviz.ranks.report import RunReport
from thunderviz.ranks.spawn import run_ranks
from thunderviz.ranks.topology import BACKENDS, DEFAULT_TIMEOUT_S

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "OUTPUT_MODES",
    "PHASES",
    "CellError",
    "RankEngine",
    "RankFailure",
    "RankUsageError",
    "RanksInterrupted",
    "RunReport",
    "StrategySpec",
    "run_ranks",
]
