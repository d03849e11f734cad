"""N rank processes on this machine that run jobs: ``fn(rank, world_size, *args)`` on every rank, results by rank.

What ``run_ranks`` (one job, then the processes end) stands on, and what a caller that runs many jobs on one process
group keeps (the test suite's rank pair). Each rank gets the variables torchrun sets (``one_host_environment``: a
gloo or NCCL rendezvous on loopback) and one job at a time over a private connection; a job's function travels by
reference, as with any spawn-based launcher, so it must be importable by name.

How a rank process starts: forked from this process's zygote (``pool.zygote``, which already imported torch, thunder
and Lightning) when it can, else spawned as a fresh interpreter (``multiprocessing``'s spawn). A forked rank is then
prepared exactly as spawn prepares its children (``multiprocessing.spawn.prepare``: the parent's ``sys.path``, working
directory and main module, imported as ``__mp_main__``) and prints to the launcher's own stdout and stderr; the
rendezvous variables are set before the first job, after the imports, in both ways. What the zygote cannot equal in
a fork it refuses (changed code, import-time variables, a GPU machine), and those ranks are spawned.

Why forked: a spawned rank imports torch, thunder and Lightning (5-8 s of CPU each on two cores) before it runs
anything; a script or test that starts 2-4 ranks pays that on every call.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from thunderviz.errors import RankError
from thunderviz.pool.rendezvous import free_port, one_host_environment
from thunderviz.pool.zygote import Zygote, ZygoteUnavailable, fork_enabled

__all__ = ["LocalRanks"]

#: What a forked rank runs (``python -c`` in the zygote's child; argv: the parent's socket and the rank).
_FORKED_CODE = "from thunderviz.pool.local_ranks import forked_rank_main; forked_rank_main()"
#: How long a forked rank may take to connect back (a fork and a few imports; the zygote's own imports are waited
#: for before the fork).
_CONNECT_TIMEOUT_S = 60.0


def _serve(conn: Connection, rank: int, setup: dict[str, Any]) -> None:
    """A rank: set the rendezvous variables, then run jobs until told to stop (``None``)."""
    os.environ.update(setup["environment"])
    import gc

    import torch

    torch.set_num_threads(setup["threads"])
    try:
        while True:
            try:
                message = conn.recv_bytes()
            except EOFError:  # the launcher is gone
                return
            if not message:
                return
            job_id, job = pickle.loads(message)
            try:
                fn, args = pickle.loads(job)  # inside the try: a function this process cannot import is the job's error
                payload = ("ok", pickle.dumps(fn(rank, setup["world_size"], *args)))
            except BaseException:
                payload = ("error", traceback.format_exc())
            gc.collect()  # a job's models and traces go now, not at some later job's allocation
            conn.send((job_id, payload))
    finally:
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _spawned_rank_main(conn: Connection, rank: int, setup: dict[str, Any]) -> None:
    _serve(conn, rank, setup)


def forked_rank_main() -> None:
    """In a rank forked from the zygote: connect to the launcher, become what spawn would have made, serve."""
    path, rank = sys.argv[1], int(sys.argv[2])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    conn = Connection(sock.detach())
    conn.send(rank)
    preparation, setup = conn.recv()
    from multiprocessing import spawn

    spawn.prepare(preparation)  # sys.path, cwd, the parent's main module as __mp_main__: as a spawned child
    _serve(conn, rank, setup)


def _launcher_streams() -> tuple[int, int] | None:
    """This process's stdout and stderr descriptors, which a spawned rank would inherit (None if either is closed)."""
    try:
        for fd in (1, 2):
            os.fstat(fd)
    except OSError:
        return None
    return (1, 2)


class _Rank:
    """One rank process: its connection, and how to ask whether it still runs and to end it."""

    def __init__(self, conn: Connection, pid: int, process: Any = None, zygote: Zygote | None = None) -> None:
        self.conn = conn
        self.pid = pid
        self._process = process  # a spawned rank's multiprocessing.Process
        self._zygote = zygote  # a forked rank's parent

    def exit_code(self) -> int | None:
        if self._process is not None:
            return self._process.exitcode
        assert self._zygote is not None
        return self._zygote.exit_code(self.pid)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the process to end; whether it did."""
        if self._process is not None:
            self._process.join(timeout)
            return self._process.exitcode is not None
        deadline = time.monotonic() + timeout
        while self.exit_code() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True


class LocalRanks:
    """``nproc`` rank processes on this machine meeting on loopback; ``run`` one job on all of them at a time.

    A job that raises on any rank, a rank that dies, or a job past its timeout ends every rank (a peer may be stuck
    in a collective) and raises ``RankError``; the instance cannot run more jobs after that. ``forked`` says how the
    ranks started.
    """

    def __init__(self, nproc: int, *, threads_per_rank: int = 1) -> None:
        if nproc < 1:
            raise ValueError(f"LocalRanks(nproc={nproc}): need at least one rank.")
        self.world_size = nproc
        port = free_port()
        self._setups = [
            {
                "environment": one_host_environment(r, nproc, port, threads=threads_per_rank),
                "threads": threads_per_rank,
                "world_size": nproc,
            }
            for r in range(nproc)
        ]
        self._ranks: list[_Rank] = []
        self._next_id = 0
        self.closed = False
        self.forked = False
        try:
            if fork_enabled():
                with contextlib.suppress(ZygoteUnavailable):
                    self._ranks = self._fork()
                    self.forked = True
            if not self._ranks:
                self._ranks = self._spawn()
        except BaseException:
            self.close(graceful=False)
            raise

    def _spawn(self) -> list[_Rank]:
        ctx = mp.get_context("spawn")
        ranks = []
        for r, setup in enumerate(self._setups):
            ours, theirs = ctx.Pipe()
            process = ctx.Process(target=_spawned_rank_main, args=(theirs, r, setup), daemon=True)
            process.start()
            theirs.close()
            ranks.append(_Rank(ours, process.pid, process=process))
        return ranks

    def _fork(self) -> list[_Rank]:
        from multiprocessing import spawn

        zygote = Zygote.shared()
        folder = tempfile.mkdtemp(prefix="thunderviz-ranks-")  # mode 0700: only this user reaches the socket
        path = os.path.join(folder, "ranks.sock")
        streams = _launcher_streams()
        pids: dict[int, int] = {}
        connected: dict[int, Connection] = {}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                listener.bind(path)
                listener.listen(self.world_size)
                for r in range(self.world_size):
                    pids[r] = zygote.fork(
                        code=_FORKED_CODE,
                        argv=["-c", path, str(r)],
                        env=dict(os.environ),
                        cwd=os.getcwd(),
                        output=None if streams else os.devnull,
                        name=f"tv-rank-{r}",
                        streams=streams,
                    )
                deadline = time.monotonic() + _CONNECT_TIMEOUT_S
                while len(connected) < self.world_size:
                    listener.settimeout(max(0.1, min(1.0, deadline - time.monotonic())))
                    try:
                        sock, _ = listener.accept()
                    except TimeoutError:
                        missing = sorted(set(pids) - set(connected))
                        if time.monotonic() >= deadline or any(zygote.exit_code(pids[r]) is not None for r in missing):
                            raise ZygoteUnavailable(f"forked rank(s) {missing} did not connect") from None
                        continue
                    sock.setblocking(True)
                    conn = Connection(sock.detach())
                    try:
                        r = conn.recv()
                    except (EOFError, OSError) as exc:
                        raise ZygoteUnavailable(f"a forked rank closed its connection: {exc!r}") from None
                    connected[r] = conn
                    preparation = spawn.get_preparation_data(f"rank-{r}")
                    preparation["authkey"] = bytes(preparation["authkey"])  # prepare() makes it an AuthenticationString
                    conn.send((preparation, self._setups[r]))
        except BaseException:
            for pid in pids.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for conn in connected.values():
                conn.close()
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return [_Rank(connected[r], pids[r], zygote=zygote) for r in range(self.world_size)]

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> list[Any]:
        """``fn(rank, world_size, *args)`` on every rank; the results ordered by rank."""
        if self.closed:
            raise RankError("these rank processes have ended (a job failed, or they were closed)", rank=0)
        self._next_id += 1
        job_id = self._next_id
        try:
            message = pickle.dumps((job_id, pickle.dumps((fn, args))))
            for rank in self._ranks:
                rank.conn.send_bytes(message)
            return self._collect(job_id, timeout)
        except BaseException:
            self.close(graceful=False)
            raise

    def _collect(self, job_id: int, timeout: float) -> list[Any]:
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        waiting = {rank.conn: r for r, rank in enumerate(self._ranks)}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stuck = sorted(waiting.values())
                raise RankError(f"ranks {stuck} did not finish within {timeout:.0f} s and were killed", rank=stuck[0])
            for conn in wait(list(waiting), timeout=min(remaining, 1.0)):
                r = waiting.pop(conn)
                try:
                    got_id, (status, payload) = conn.recv()
                except (EOFError, OSError):
                    code = self._exit_code_soon(self._ranks[r])
                    raise RankError(f"rank {r} died with exit code {code}", rank=r) from None
                if got_id != job_id:  # cannot happen: a failed job ends the ranks; say so rather than mix results
                    raise RankError(f"rank {r} answered job {got_id} while job {job_id} ran", rank=r)
                if status == "error":
                    raise RankError(f"rank {r} raised:\n{payload}", rank=r, remote_traceback=payload)
                results[r] = pickle.loads(payload)
        return [results[r] for r in range(self.world_size)]

    @staticmethod
    def _exit_code_soon(rank: _Rank) -> int | None:
        """A rank whose connection closed is exiting: its exit code, once known (a moment at most)."""
        rank.join(2.0)
        return rank.exit_code()

    def close(self, *, graceful: bool = True) -> None:
        """End the ranks: told to stop and waited for (``graceful``, their process groups left), else killed."""
        if self.closed:
            return
        self.closed = True
        if graceful:
            for rank in self._ranks:
                with contextlib.suppress(OSError, ValueError):
                    rank.conn.send_bytes(b"")
            for rank in self._ranks:
                rank.join(20.0)
        for rank in self._ranks:
            if rank.exit_code() is None:
                rank.kill()
                rank.join(10.0)
            rank.conn.close()

    def __enter__(self) -> LocalRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(graceful=exc[0] is None)
