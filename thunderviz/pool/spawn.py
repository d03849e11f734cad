"""Run a function on N fresh local rank processes, as torchrun would, and bring each rank's result back.

The one-shot spawner beside the persistent engine (``engine.py``): the plain-Python path (scripts, the demo,
benchmarks, tests); notebooks use the persistent engine. Every rank is a fresh interpreter (spawn), its
environment carries ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` exactly as torchrun sets
them (``rendezvous.torchrun_environment``, shared with the engine, so Fabric sees processes created externally),
and everything listens on loopback. A rank that raises is reported with its rank and traceback, one that dies with
its exit code, and ranks that hang are killed after ``timeout`` — the caller never waits forever.
"""

from __future__ import annotations

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

__all__ = ["run_ranks"]


def _child(
    fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, queue: Any, threads: int
) -> None:
    os.environ.update(one_host_environment(rank, world_size, port, threads=threads))
    import torch

    torch.set_num_threads(threads)
    try:
        result = fn(rank, world_size, *args)
        payload = ("ok", pickle.dumps(result))
    except BaseException:
        payload = ("error", traceback.format_exc())
    queue.put((rank, payload))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def run_ranks(
    fn: Callable[..., Any], *args: Any, nproc: int = 2, timeout: float = 300.0, threads_per_rank: int = 1
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``nproc`` spawned processes; return the results ordered by rank.

    ``fn`` must be importable by name (a module-level function), as with any spawn-based launcher.
    """
    if nproc < 1:
        raise ValueError(f"run_ranks(nproc={nproc}): need at least one rank.")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(fn, r, nproc, port, args, queue, threads_per_rank), daemon=True)
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < nproc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stuck = sorted(set(range(nproc)) - set(results) - set(errors))
                raise RankError(f"ranks {stuck} did not finish within {timeout:.0f} s and were killed", rank=stuck[0])
            try:
                rank, (status, payload) = queue.get(timeout=min(remaining, 1.0))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results and r not in errors]
                if dead:
                    # Give the queue a moment: a rank may have exited right after putting its result.
                    try:
                        rank, (status, payload) = queue.get(timeout=2.0)
                    except queue_mod.Empty:
                        code = procs[dead[0]].exitcode
                        raise RankError(f"rank {dead[0]} died with exit code {code}", rank=dead[0]) from None
                else:
                    continue
            if status == "ok":
                results[rank] = pickle.loads(payload)
            else:
                errors[rank] = payload
                break
    finally:
        for p in procs:
            p.join(timeout=10 if not errors else 1)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        rank, tb = next(iter(sorted(errors.items())))
        raise RankError(f"rank {rank} raised:\n{tb}", rank=rank, remote_traceback=tb)
    return [results[r] for r in range(nproc)]
