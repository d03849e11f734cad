"""One pair of real rank processes for the whole test session, running job after job on one gloo process group.

Why: ``run_ranks`` starts fresh interpreters for every call, and each start costs 10-20 s on this 2-core machine
(spawn, ``import torch, thunder, lightning``, the gloo rendezvous, the exit) before a scenario compiles anything. The
2-rank scenario files (tests/strategies, the shared traces of tests/helpers, the timeline runs) made about twenty such
calls. Here the two ranks start once, with the environment ``run_ranks`` gives them (``torchrun_environment``, one
thread each), and every later ``run(fn, *args)`` is ``fn(rank, world_size, *args)`` on both, results back by rank,
exactly as ``run_ranks`` returns them. The process group, created by the first job that needs one (Fabric's
``launch`` or ``init_process_group``), stays up for the next jobs; scenarios already ran many Fabric set-ups per
process, so a job must not assume a fresh interpreter, only a fresh call.

A job that raises on any rank, dies, or runs past its timeout ends the pair (the other rank may be stuck in a
collective) and raises ``RankError`` as ``run_ranks`` would; the next job starts a new pair. ``shutdown`` ends the pair
(``tests/zz_cleanup`` calls it before checking that nothing is left; ``atexit`` too).

Still fresh processes, by design: the tests of the spawner itself (tests/ranks) and other world sizes.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import time
import traceback
from collections.abc import Callable
from typing import Any

from thunderviz.errors import RankError
from thunderviz.pool.rendezvous import free_port, one_host_environment

__all__ = ["run_on_pool", "shutdown"]

#: The number of ranks the shared pair has (a job for another world size uses ``run_ranks``).
WORLD_SIZE = 2
#: A marker in every pool rank's environment, so tests/zz_cleanup can recognise one left behind.
POOL_VARIABLE = "THUNDERVIZ_TEST_RANK_POOL"


def _serve(rank: int, world_size: int, port: int, jobs: Any, results: Any) -> None:
    """A pool rank: wait for a job, run it, send the result (or the traceback), until told to stop (``None``)."""
    os.environ.update(one_host_environment(rank, world_size, port, threads=1))
    import gc

    import torch

    torch.set_num_threads(1)
    while True:
        job = jobs.get()
        if job is None:
            break
        job_id, fn, args = job
        try:
            payload = ("ok", pickle.dumps(fn(rank, world_size, *args)))
        except BaseException:
            payload = ("error", traceback.format_exc())
        gc.collect()  # a job's models and traces go now, not at some later job's allocation
        results.put((job_id, rank, payload))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class _Pool:
    """The running pair: its processes, one job queue per rank, one result queue."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(WORLD_SIZE)]
        port = free_port()
        previous = os.environ.get(POOL_VARIABLE)
        os.environ[POOL_VARIABLE] = "1"  # spawn hands the children this environment
        try:
            self.procs = [
                ctx.Process(target=_serve, args=(r, WORLD_SIZE, port, self.jobs[r], self.results), daemon=True)
                for r in range(WORLD_SIZE)
            ]
            for p in self.procs:
                p.start()
        finally:
            if previous is None:
                os.environ.pop(POOL_VARIABLE, None)
            else:
                os.environ[POOL_VARIABLE] = previous
        self.next_id = 0

    def run(self, fn: Callable[..., Any], args: tuple, timeout: float) -> list[Any]:
        self.next_id += 1
        job_id = self.next_id
        for q in self.jobs:
            q.put((job_id, fn, args))
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(results) < WORLD_SIZE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stuck = sorted(set(range(WORLD_SIZE)) - set(results))
                raise RankError(f"ranks {stuck} did not finish within {timeout:.0f} s and were killed", rank=stuck[0])
            try:
                got_id, rank, (status, payload) = self.results.get(timeout=min(remaining, 1.0))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive() and r not in results]
                if dead:
                    code = self.procs[dead[0]].exitcode
                    raise RankError(f"rank {dead[0]} died with exit code {code}", rank=dead[0]) from None
                continue
            if got_id != job_id:  # cannot happen: a failed job ends the pool; say so rather than mix results
                raise RankError(f"rank {rank} answered job {got_id} while job {job_id} ran", rank=rank)
            if status == "error":
                raise RankError(f"rank {rank} raised:\n{payload}", rank=rank, remote_traceback=payload)
            results[rank] = pickle.loads(payload)
        return [results[r] for r in range(WORLD_SIZE)]

    def close(self, *, graceful: bool) -> None:
        if graceful:
            for q in self.jobs:
                q.put(None)
            for p in self.procs:
                p.join(timeout=20)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join()


_POOL: _Pool | None = None


def run_on_pool(fn: Callable[..., Any], *args: Any, timeout: float = 600.0) -> list[Any]:
    """``fn(rank, 2, *args)`` on the session's two rank processes (started on first use); results by rank.

    ``fn`` must be importable by name (a module-level function), as for ``run_ranks``. Any failure ends the pair
    and raises ``RankError``; the next call starts a new one.
    """
    global _POOL
    if _POOL is None:
        _POOL = _Pool()
    try:
        return _POOL.run(fn, args, timeout)
    except BaseException:
        pool, _POOL = _POOL, None
        pool.close(graceful=False)
        raise


def shutdown() -> None:
    """End the pair, if one runs (each rank leaves its process group and exits)."""
    global _POOL
    pool, _POOL = _POOL, None
    if pool is not None:
        pool.close(graceful=True)


atexit.register(shutdown)
