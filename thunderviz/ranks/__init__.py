"""Rank processes for notebooks and scripts: a persistent pool of ipyparallel engines that are the ranks of one
process group. No IPython here: the notebook layer is a thin shell over ``RankEngine`` and ``RunReport``.
"""

from __future__ import annotations

from thunderviz.ranks.engine import (
    CellError,
    RankEngine,
    RankFailure,
    RanksInterrupted,
    RankUsageError,
    StrategySpec,
)
from thunderviz.ranks.report import RunReport

__all__ = ["CellError", "RankEngine", "RankFailure", "RankUsageError", "RanksInterrupted", "RunReport", "StrategySpec"]
