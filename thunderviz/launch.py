"""Kept so ``from thunderviz.launch import run_ranks`` (README, scripts, tests) keeps working.

The spawner lives in ``thunderviz.ranks.spawn`` beside the persistent rank engine, and shares the torchrun
environment and port code (``thunderviz.ranks.rendezvous``) with it.
"""

from __future__ import annotations

from thunderviz.ranks.rendezvous import free_port
from thunderviz.ranks.spawn import run_ranks

__all__ = ["free_port", "run_ranks"]
