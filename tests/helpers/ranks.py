"""Tests run real rank processes through the package's own launcher; this keeps the old import path working."""

from thunderviz.errors import RankError as RankFailed
from thunderviz.launch import free_port, run_ranks

__all__ = ["RankFailed", "free_port", "run_ranks"]
