"""Run a function on N real rank processes with a real gloo process group, as torchrun would.

Tests use this instead of mocks: every rank is a fresh interpreter (spawn), the environment carries
``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` exactly as torchrun sets them, and Fabric
therefore sees processes that were created externally. Results come back pickled, per rank; a rank that raises
is reported with its rank and traceback, and a rank that hangs is killed after ``timeout``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import traceback
from typing import Any, Callable


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, queue: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        NODE_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    try:
        result = fn(rank, world_size, *args)
        payload = ("ok", pickle.dumps(result))
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        payload = ("error", traceback.format_exc())
    queue.put((rank, payload))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


class RankFailed(AssertionError):
    pass


def run_ranks(fn: Callable[..., Any], *args: Any, nproc: int = 2, timeout: float = 300.0) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``nproc`` spawned processes; return the results ordered by rank."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, nproc, port, args, queue), daemon=True) for r in range(nproc)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    import queue as queue_mod
    import time

    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < nproc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RankFailed(f"ranks {sorted(set(range(nproc)) - set(results) - set(errors))} timed out after {timeout}s")
            try:
                rank, (status, payload) = queue.get(timeout=min(remaining, 1.0))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results and r not in errors]
                if dead:
                    # Give the queue a moment: a rank may have exited right after putting its result.
                    try:
                        rank, (status, payload) = queue.get(timeout=2.0)
                    except queue_mod.Empty:
                        raise RankFailed(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}") from None
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
        raise RankFailed(f"rank {rank} raised:\n{tb}")
    return [results[r] for r in range(nproc)]
