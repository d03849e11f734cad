"""Where rank processes come from: a local ipyparallel cluster on loopback that cannot outlive its owner, or an
existing cluster (``ipcluster start -n 8 --engines slurm|mpi|ssh``) that we attach to and never stop.

Both expose the same small surface to the engine: an ipyparallel ``Client``, signals to engines, a restart that
yields fresh engines, and ``close``. The engine never needs to know which kind it has, except that only a local
cluster is ours to kill.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from thunderviz.errors import RankError
from thunderviz.ranks.watchdog import TAG_VARIABLE, kill_tagged, tagged_processes

__all__ = ["AttachedCluster", "LocalCluster", "RankCluster"]

# The controller's default heartbeat (3 s) makes a 2-engine start take 6.5 s instead of 2.5 s.
HEARTBEAT_MS = 500
ENGINE_START_TIMEOUT_S = 120.0


# Engines import torch and thunder (about 3 s) before they register, so the import overlaps the controller's
# start-up instead of following it; measured by bench/notebook_latency.py (cold first report).
_ENGINE_CMD = [
    sys.executable, "-c",
    # a broken torch must not keep the engine from registering: init_rank reports the import error per rank
    "try:\n    import torch, thunder\nexcept Exception:\n    pass\nfrom ipyparallel.engine.app import main\nmain()",
]


def _package_root() -> str:
    """The directory holding the ``thunderviz`` package, so engines import the same code as the kernel."""
    return str(Path(__file__).resolve().parents[2])


def _run(coro: Any) -> Any:
    """Run an ipyparallel coroutine from synchronous code, even inside a kernel whose loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # A running loop (Jupyter kernel): run on a private loop in a helper thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


class RankCluster:
    """What the engine needs from a cluster; see ``LocalCluster`` and ``AttachedCluster``."""

    client: Any
    is_local: bool = False
    description: str = ""

    def signal_engines(self, sig: int, engine_ids: list[int]) -> None:
        """Deliver ``sig`` to the engine processes (through their nannies, so it works across machines)."""
        if not engine_ids:
            return
        try:
            self.client.send_signal(sig, targets=list(engine_ids), block=True)
        except Exception:  # an engine that is already gone cannot be signalled; that is fine
            pass

    def kill_engines(self, engine_ids: list[int]) -> None:
        self.signal_engines(signal.SIGKILL, engine_ids)

    def restart(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class LocalCluster(RankCluster):
    """A controller and ``n`` engines on this machine, listening on 127.0.0.1 only, guarded by a watchdog."""

    is_local = True

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"LocalCluster(n={n}): need at least one engine")
        self.n = n
        self.client = None
        self._watchdog: subprocess.Popen | None = None
        self._cluster: Any = None
        self.engine_pids: dict[int, int] = {}
        self._open()

    def _open(self) -> None:
        import ipyparallel as ipp

        self.tag = f"tv-{uuid.uuid4().hex[:12]}"
        self.engine_pids = {}
        self._environment = {
            TAG_VARIABLE: self.tag,
            "PYTHONPATH": os.pathsep.join(p for p in (_package_root(), os.environ.get("PYTHONPATH", "")) if p),
            # Gloo picks its listening interface from the hostname unless told: keep it on loopback.
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONUNBUFFERED": "1",
        }
        self._cluster = ipp.Cluster(
            n=self.n,
            controller_ip="127.0.0.1",
            controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}"],
            engine_timeout=int(ENGINE_START_TIMEOUT_S),
            delay=0.1,
            shutdown_atexit=True,
            log_level=logging.WARNING,
        )
        self.description = f"local cluster {self._cluster.cluster_id} ({self.n} engines on 127.0.0.1)"
        try:
            self._start_watchdog()
            self.client = _run(self._start())
        except BaseException:
            self.close()
            raise

    async def _start(self) -> Any:
        await self._cluster.start_controller(environment=dict(self._environment))
        await self._cluster.start_engines(self.n, environment=dict(self._environment), engine_cmd=_ENGINE_CMD)
        client = await self._cluster.connect_client()
        return client

    def wait_for_engines(self, timeout: float = ENGINE_START_TIMEOUT_S) -> None:
        try:
            self.client.wait_for_engines(self.n, timeout=timeout, interactive=False)
        except Exception as exc:
            raise RankError(
                f"{self.n} rank engines did not register within {timeout:.0f} s. Check that ipyparallel works here "
                "(`ipcluster start -n 2`) and that the machine is not out of memory."
            ) from exc

    def _start_watchdog(self) -> None:
        me = psutil.Process()
        cluster_file = getattr(self._cluster, "cluster_file", "") or ""
        self._watchdog = subprocess.Popen(
            [
                sys.executable, "-m", "thunderviz.ranks.watchdog",
                "--owner", str(me.pid), "--owner-started", repr(me.create_time()),
                "--tag", self.tag, "--cluster-file", cluster_file,
            ],
            env={**os.environ, "PYTHONPATH": self._environment["PYTHONPATH"]},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in a terminal must not take the guard down with the kernel
        )

    @property
    def watchdog_pid(self) -> int | None:
        return self._watchdog.pid if self._watchdog else None

    def process_pids(self) -> list[int]:
        """Every live process of this cluster (controller, its schedulers, engines, nannies)."""
        return [p.pid for p in tagged_processes(self.tag)]

    def kill_engines(self, engine_ids: list[int]) -> None:
        # Direct kill by pid: immediate, and works even if the engine's nanny is wedged.
        pids = []
        for eid in engine_ids:
            pid = self.engine_pids.get(eid)
            if pid:
                pids.append(pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not pids:
            super().kill_engines(engine_ids)

    def restart(self) -> None:
        """Fresh engines (and controller): the only way to release ranks stuck in a gloo collective."""
        self.close()
        self._open()

    def close(self) -> None:
        # Our engines hold nothing worth a graceful exit, and torch's static destructors make one take seconds
        # (on a loaded machine long enough for ipyparallel to warn into the cell after 5 s): kill them first.
        if self.engine_pids:
            self.kill_engines(list(self.engine_pids))
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
            self.client = None
        cluster = getattr(self, "_cluster", None)
        if cluster is not None:
            try:
                _run(asyncio.wait_for(cluster.stop_cluster(), timeout=10))
            except BaseException:
                pass
            self._cluster = None
        # Whatever ipyparallel did not stop (an engine killed mid-collective leaves its nanny for a moment).
        if getattr(self, "tag", None):
            kill_tagged(self.tag, grace=1.0)
        if self._watchdog is not None:
            if self._watchdog.poll() is None:
                self._watchdog.terminate()
                try:
                    self._watchdog.wait(5)
                except subprocess.TimeoutExpired:
                    self._watchdog.kill()
                    self._watchdog.wait()
            self._watchdog = None

    def __del__(self) -> None:
        try:
            if getattr(self, "_watchdog", None) is not None or getattr(self, "client", None) is not None:
                self.close()
        except Exception:
            pass


class AttachedCluster(RankCluster):
    """An ipyparallel cluster someone else started (the multi-node path). We never stop it."""

    is_local = False

    def __init__(self, *, cluster_id: str | None = None, profile: str | None = None, timeout: float = 30.0) -> None:
        import ipyparallel as ipp

        kwargs: dict[str, Any] = {}
        if profile:
            kwargs["profile"] = profile
        if cluster_id is not None:
            kwargs["cluster_id"] = cluster_id
        try:
            self._cluster = ipp.Cluster.from_file(**kwargs)
        except Exception as exc:
            raise RankError(
                f"Cannot attach to the ipyparallel cluster (cluster_id={cluster_id!r}, profile={profile!r}): {exc}. "
                "Start one with `ipcluster start -n N --engines slurm|mpi|ssh` and pass its --cluster-id/--profile."
            ) from exc
        self.client = _run(self._cluster.connect_client())
        deadline = time.monotonic() + timeout
        while not self.client.ids and time.monotonic() < deadline:
            time.sleep(0.2)
        if not self.client.ids:
            raise RankError(f"The cluster {cluster_id!r} has no engines registered after {timeout:.0f} s.")
        self.n = len(self.client.ids)
        self.description = f"attached cluster {self._cluster.cluster_id or '(default)'} ({self.n} engines)"

    def restart(self) -> None:
        """Ask the cluster's launchers for fresh engines; needs the cluster file written by ``ipcluster``."""
        try:
            _run(self._cluster.restart_engines())
        except Exception as exc:
            raise RankError(
                f"Could not restart the engines of {self.description}: {exc}. Restart the cluster with "
                "`ipcluster stop` / `ipcluster start`, then run the cell again."
            ) from exc
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while len(self.client.ids) < self.n and time.monotonic() < deadline:
            time.sleep(0.2)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
