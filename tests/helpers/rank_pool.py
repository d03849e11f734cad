"""One pair of real rank processes for the whole test session, running job after job on one gloo process group.

Why: ``run_ranks`` starts new processes for every call, and each start costs seconds on this 2-core machine (a
fork from the zygote or a spawn with ``import torch, thunder, lightning``, the gloo rendezvous, the exit). The
2-rank scenario files (tests/strategies, the shared traces of tests/helpers, the timeline runs) made about twenty such
calls. Here the two ranks start once, as ``run_ranks`` starts them (``pool.local_ranks``: ``torchrun_environment``,
one thread each), and every later ``run(fn, *args)`` is ``fn(rank, world_size, *args)`` on both, results back by rank,
exactly as ``run_ranks`` returns them. The process group, created by the first job that needs one (Fabric's
``launch`` or ``init_process_group``), stays up for the next jobs; scenarios already ran many Fabric set-ups per
process, so a job must not assume a fresh interpreter, only a fresh call.

A job that raises on any rank, dies, or runs past its timeout ends the pair (the other rank may be stuck in a
collective) and raises ``RankError`` as ``run_ranks`` would; the next job starts a new pair. ``shutdown`` ends the pair
(``tests/zz_cleanup`` calls it before checking that nothing is left; ``atexit`` too).

Still new processes per call, by design: the tests of the launcher itself (tests/ranks) and other world sizes.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

from thunderviz.pool.local_ranks import LocalRanks

__all__ = ["run_on_pool", "shutdown"]

#: The number of ranks the shared pair has (a job for another world size uses ``run_ranks``).
WORLD_SIZE = 2

_POOL: LocalRanks | None = None


def run_on_pool(fn: Callable[..., Any], *args: Any, timeout: float = 600.0) -> list[Any]:
    """``fn(rank, 2, *args)`` on the session's two rank processes (started on first use); results by rank.

    ``fn`` must be importable by name (a module-level function), as for ``run_ranks``. Any failure ends the pair
    and raises ``RankError``; the next call starts a new one.
    """
    global _POOL
    if _POOL is None or _POOL.closed:
        _POOL = LocalRanks(WORLD_SIZE)
    return _POOL.run(fn, *args, timeout=timeout)


def shutdown() -> None:
    """End the pair, if one runs (each rank leaves its process group and exits)."""
    global _POOL
    pool, _POOL = _POOL, None
    if pool is not None:
        pool.close(graceful=True)


atexit.register(shutdown)
