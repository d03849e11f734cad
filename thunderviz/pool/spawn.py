"""Run a function on N new local rank processes, as torchrun would, and bring each rank's result back.

The one-shot launcher beside the persistent engine (``engine.py``): the plain-Python path (scripts, the demo,
benchmarks, tests); notebooks use the persistent engine. Every rank is a new process (``local_ranks``: forked from
the zygote that preloaded torch and thunder, prepared as spawn prepares a child, else spawned), its
environment carries ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` exactly as torchrun sets
them (``rendezvous.torchrun_environment``, shared with the engine, so Fabric sees processes created externally),
and everything listens on loopback. A rank that raises is reported with its rank and traceback, one that dies with
its exit code, and ranks that hang are killed after ``timeout`` — the caller never waits forever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thunderviz.pool.local_ranks import LocalRanks

__all__ = ["run_ranks"]


def run_ranks(
    fn: Callable[..., Any], *args: Any, nproc: int = 2, timeout: float = 300.0, threads_per_rank: int = 1
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``nproc`` new rank processes; return the results ordered by rank.

    ``fn`` must be importable by name (a module-level function), as with any spawn-based launcher. The processes
    end with the call (``pool.local_ranks``: forked from the zygote where it can, else spawned).
    """
    if nproc < 1:
        raise ValueError(f"run_ranks(nproc={nproc}): need at least one rank.")
    with LocalRanks(nproc, threads_per_rank=threads_per_rank) as ranks:
        return ranks.run(fn, *args, timeout=timeout)
