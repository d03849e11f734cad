"""Tests run real rank processes through the package's own spawner; this keeps the old import path working."""

from thunderviz.errors import RankError as RankFailed
from thunderviz.ranks.rendezvous import free_port
from thunderviz.ranks.spawn import run_ranks

__all__ = ["RankFailed", "free_port", "run_ranks"]
