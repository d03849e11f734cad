"""Tests run real rank processes through the package's own spawner (``run_ranks``) on a free loopback port."""

from thunderviz.pool.rendezvous import free_port
from thunderviz.pool.spawn import run_ranks

__all__ = ["free_port", "run_ranks"]
