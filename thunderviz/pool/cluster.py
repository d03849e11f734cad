"""Where rank processes come from: a local ipyparallel cluster on loopback that cannot outlive its owner, or an
existing cluster (``ipcluster start -n 8 --engines slurm|mpi|ssh``) that we attach to and never stop.

Both expose the same small surface to the engine: an ipyparallel ``Client``, signals to engines, a restart that
yields fresh engines, and ``close``. The engine never needs to know which kind it has, except that only a local
cluster is ours to kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from thunderviz.errors import RankError
from thunderviz.pool.watchdog import TAG_VARIABLE, kill_tagged, tagged_processes
from thunderviz.pool.zygote import Zygote, engine_pythonpath, fork_enabled

__all__ = ["IPP_LOG_VARIABLE", "AttachedCluster", "LocalCluster", "RankCluster", "controller_address", "ipp_log_level"]

# The controller's default heartbeat (3 s) makes a 2-engine start take 6.5 s instead of 2.5 s.
HEARTBEAT_MS = 500
ENGINE_START_TIMEOUT_S = 120.0
# How long attaching waits for the engines --nproc asks for, and a restart for engines an owner replaced.
ATTACH_WAIT_S = 60.0
RESTART_WAIT_S = 10.0
#: How many of its last log lines a rank that died brings into the cell's error.
LAST_WORDS_LINES = 30
#: How long a dead rank's log may take to be filed by ipyparallel (see ``LocalCluster.last_words``).
LAST_WORDS_WAIT_S = 2.0
UNREGISTER_WAIT_S = 10.0
#: Raise ipyparallel's log level (INFO, DEBUG) to see what its controller, engines and Cluster object do.
IPP_LOG_VARIABLE = "THUNDERVIZ_IPP_LOG_LEVEL"


def ipp_log_level() -> tuple[int, bool]:
    """ipyparallel's log level and whether someone asked for it (``IPP_LOG_VARIABLE``); WARNING by default.

    Why: at its default, INFO, the controller logs about a hundred lines per pool start and stop, and a launcher
    whose process exits non-zero (we kill engines on a restart) replays the last hundred of them as a warning, which
    a JupyterLab server prints in its terminal.
    """
    asked = os.environ.get(IPP_LOG_VARIABLE, "").strip()
    if not asked:
        return logging.WARNING, False
    level = logging.getLevelName(asked.upper()) if not asked.isdigit() else int(asked)
    if not isinstance(level, int):
        raise RankError(f"{IPP_LOG_VARIABLE}={asked!r}: use a logging level name (DEBUG, INFO, WARNING, ERROR)")
    return level, True


# Engines import torch and thunder (about 3 s) before they register, so the import overlaps the controller's
# start-up and the registration instead of following them; measured by bench/notebook_latency.py (truly cold).
_ENGINE_CMD = [
    sys.executable,
    "-c",
    # a broken torch must not keep the engine from registering: init_rank reports the import error per rank
    "try:\n    import torch, thunder\nexcept Exception:\n    pass\nfrom ipyparallel.engine.app import main\nmain()",
]


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


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` exited (a zombie not yet reaped by its parent counts as gone)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


@dataclass(frozen=True)
class _EngineProcess:
    pid: int | None
    exit_code: int | None  # known once ipyparallel noticed the exit
    tail: Callable[[int], str]  # lines -> the end of what it wrote


def _log_tail_reader(path: str) -> Callable[[int], str]:
    def read(lines: int) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                return _last_words(f.read().decode("utf-8", errors="replace"), lines)
        except OSError:
            return ""

    return read


def _text_tail_reader(text: str) -> Callable[[int], str]:
    return lambda lines: _last_words(text, lines)


def _last_words(text: str, lines: int) -> str:
    """The last ``lines`` lines of a log; from its last fatal-signal dump on when it has one (a dump lists every
    thread, so its own first line is often further back than ``lines``)."""
    # the nanny's lines after a death only say that its engine exited, with status None (it is not the parent);
    # faulthandler's list of loaded extension modules is one very long line that says nothing about the death
    kept = [
        line
        for line in text.rstrip().splitlines()
        if "[KernelNanny." not in line and not line.startswith("Extension modules:")
    ]
    fatal = [i for i, line in enumerate(kept) if line.startswith("Fatal Python error")]
    if fatal:
        return "\n".join(kept[fatal[-1] :][: 3 * lines])
    return "\n".join(kept[-lines:])


def memory_note() -> str:
    """How much memory this machine has left, for messages about processes that vanished or never started."""
    memory = psutil.virtual_memory()
    return f"{memory.available / 2**30:.1f} GiB of {memory.total / 2**30:.1f} GiB memory available now"


def controller_address(client: Any) -> tuple[str, int]:
    """Where the controller listens for registrations, as this client reaches it (engines reach the same one).

    ipyparallel keeps it only in the client's private ``_config`` (from the connection file); ``("127.0.0.1", 0)``
    when it is missing, which makes every engine report its loopback side.
    """
    url = str(getattr(client, "_config", {}).get("registration", ""))
    if "://" not in url:
        return "127.0.0.1", 0
    host, _, port = url.split("://", 1)[1].rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else 0


class RankCluster:
    """What the engine needs from a cluster; see ``LocalCluster`` and ``AttachedCluster``."""

    client: Any
    is_local: bool = False
    description: str = ""

    def engine_ids(self) -> list[int]:
        """The engines that are the ranks (sorted ids)."""
        return sorted(self.client.ids)

    def signal_engines(self, sig: int, engine_ids: list[int]) -> None:
        """Deliver ``sig`` to the engine processes (through their nannies, so it works across machines)."""
        if not engine_ids:
            return
        with contextlib.suppress(Exception):  # an engine that is already gone cannot be signalled; that is fine
            self.client.send_signal(sig, targets=list(engine_ids), block=True)

    def kill_engines(self, engine_ids: list[int]) -> None:
        self.signal_engines(signal.SIGKILL, engine_ids)

    def restart(self, where: dict[int, str] | None = None) -> str:
        """Fresh engines (returns ``"fresh"``), or ``"in-place"`` when the engines stay and only need a reset;
        ``where`` (engine id -> "rank r on host h") only words messages."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def local_ipp_cluster(n: int, tag: str, level: int, asked: bool, *, forked: bool = False) -> Any:
    """The ``ipyparallel.Cluster`` a local pool runs (nothing started yet): loopback only, our heartbeat, our id, and
    with ``forked`` engines forked from this process's zygote (``pool.zygote``).

    Why our own id: ipyparallel's default is the time in seconds and four characters from the ``random`` module,
    whose state a seeded test or training script makes the same in every process, so two kernels (or two pytest
    workers) starting a cluster in the same second shared one connection file: one's engines registered with the
    other's controller and starved when it stopped (CI: "0 of 2 rank engines registered", heartbeats missed).
    ``tag`` comes from ``uuid4`` (os.urandom).
    """
    import ipyparallel as ipp

    launchers: dict[str, Any] = {}
    if forked:
        from thunderviz.pool.forked_engines import engine_set_launcher

        launchers["engine_launcher_class"] = engine_set_launcher()
    return ipp.Cluster(
        **launchers,
        n=n,
        cluster_id=tag,
        controller_ip="127.0.0.1",
        controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}", f"--log-level={level}"],
        engine_timeout=int(ENGINE_START_TIMEOUT_S),
        delay=0.1,
        shutdown_atexit=True,
        # ERROR unless asked: its "did not exit in 5 seconds after TERM" warnings would land in the cell (close()
        # makes sure every process stops), and its replay of a killed engine's log in the server's terminal
        log_level=level if asked else logging.ERROR,
    )


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

    @staticmethod
    def new_tag() -> str:
        """A fresh cluster tag (also its ipyparallel cluster id): from ``uuid4``, so no seeded ``random`` repeats it."""
        return f"tv-{uuid.uuid4().hex[:12]}"

    def _open(self) -> None:
        self.tag = self.new_tag()
        self.engine_pids = {}
        self._environment = {
            TAG_VARIABLE: self.tag,
            "PYTHONPATH": engine_pythonpath(),
            # Gloo picks its listening interface from the hostname unless told: keep it on loopback.
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONUNBUFFERED": "1",
            # A rank killed by a fatal signal (segfault, abort) writes its Python stacks to its log: the engine
            # reads them back into the cell's error (``last_words``) instead of a bare "the process exited".
            "PYTHONFAULTHANDLER": "1",
        }
        self._log_level, asked = ipp_log_level()  # a number: ipyparallel spells WARNING "WARN"
        self._forked = fork_enabled()
        if self._forked:
            Zygote.shared()  # its imports run while the controller starts
        self._cluster = local_ipp_cluster(self.n, self.tag, self._log_level, asked, forked=self._forked)
        self.description = f"local cluster {self._cluster.cluster_id} ({self.n} engines on 127.0.0.1)"
        try:
            self._start_watchdog()
            self.client = _run(self._start())
        except BaseException:
            self.close()
            raise

    async def _start(self) -> Any:
        # Fresh interpreters first: they spend seconds importing torch and thunder, then wait for the controller's
        # connection file, so the controller's start-up (about a second) happens during their imports instead of
        # before them. Forked engines import nothing: the controller first (the zygote imports meanwhile).
        if self._forked:
            await self._cluster.start_controller(environment=dict(self._environment))
        await self._cluster.start_engines(
            self.n,
            environment=dict(self._environment),
            engine_cmd=_ENGINE_CMD,
            engine_args=[f"--IPEngine.wait_for_url_file={ENGINE_START_TIMEOUT_S:g}", f"--log-level={self._log_level}"],
        )
        if not self._forked:
            await self._cluster.start_controller(environment=dict(self._environment))
        client = await self._cluster.connect_client()
        return client

    def wait_for_engines(self, timeout: float = ENGINE_START_TIMEOUT_S) -> None:
        """Wait (bounded) until all ``n`` engines registered; fail as soon as too few engine processes are alive
        for that to happen (an engine that crashed at start-up never registers: waiting out the bound helps no one).
        """
        started = time.monotonic()
        from ipyparallel.error import EngineError

        deadline = started + timeout
        while True:
            try:
                self.client.wait_for_engines(self.n, timeout=min(1.0, timeout), interactive=False)
                return
            except TimeoutError:
                alive = sum(1 for p in self._engine_processes_seen() if p.exit_code is None and not process_gone(p.pid))
                if alive >= self.n and time.monotonic() < deadline:
                    continue
            except EngineError:  # every engine process exited: their exit codes and last words are listed below
                pass
            registered = len(self.client.ids)
            raise RankError(
                f"{registered} of {self.n} rank engines registered in {time.monotonic() - started:.0f} s "
                f"(the bound is {timeout:.0f} s). "
                f"{self._engine_processes()} Check that ipyparallel works here (`ipcluster start -n 2`) and that "
                "the machine is not out of memory, then run the cell again."
            )

    def _engine_processes_seen(self) -> list[_EngineProcess]:
        """Every engine process ipyparallel started for this cluster: the running ones with their log files, the
        ones whose exit it noticed with their exit code and the output it kept (it drops their launchers)."""
        seen = []
        for engine_set in (getattr(self._cluster, "engines", None) or {}).values():
            for launcher in engine_set.launchers.values():
                if launcher.pid:
                    seen.append(_EngineProcess(launcher.pid, None, _log_tail_reader(launcher.output_file)))
            stopped = (getattr(engine_set, "stop_data", None) or {}).get("engines", {})
            for identifier, data in stopped.items():
                output = engine_set.outputs.get(identifier, "") if hasattr(engine_set, "outputs") else ""
                seen.append(_EngineProcess(data.get("pid"), data.get("exit_code"), _text_tail_reader(output)))
        return seen

    def last_words(self, pid: int, lines: int = LAST_WORDS_LINES, wait_s: float = LAST_WORDS_WAIT_S) -> str:
        """The end of what engine process ``pid`` wrote (ipyparallel sends an engine's stdout and stderr to a log
        file): faulthandler's stacks after a fatal signal, a traceback, or ipyparallel's reason for shutting the
        engine down. Empty when it wrote nothing, as after a SIGKILL.

        Waits up to ``wait_s`` for the process to be listed: when an engine exits, ipyparallel's own thread takes its
        launcher out of the running ones before it files the output under the stopped ones, and a death noticed in
        between found no process and said "no fatal error in its log" of a segfault (once, under load)."""
        deadline = time.monotonic() + wait_s
        while True:
            for process in self._engine_processes_seen():
                if process.pid == pid:
                    return process.tail(lines)
            if time.monotonic() >= deadline:
                return ""
            time.sleep(0.05)

    def _engine_processes(self) -> str:
        """One sentence per engine process that is gone, with its last words: why a start did not complete."""
        gone = []
        for process in self._engine_processes_seen():
            if process.pid is None or (process.exit_code is None and not process_gone(process.pid)):
                continue
            status = "" if process.exit_code is None else f" with status {process.exit_code}"
            words = process.tail(6).strip()
            ends = f"; its log ends:\n{words}\n" if words else "."
            gone.append(f"Engine process {process.pid} exited{status}{ends}")
        return " ".join(gone) if gone else f"Their processes are running ({memory_note()})."

    def _start_watchdog(self) -> None:
        me = psutil.Process()
        cluster_file = getattr(self._cluster, "cluster_file", "") or ""
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "thunderviz.pool.watchdog",
                "--owner",
                str(me.pid),
                "--owner-started",
                repr(me.create_time()),
                "--tag",
                self.tag,
                "--cluster-file",
                cluster_file,
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
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            super().kill_engines(engine_ids)

    def restart(self, where: dict[int, str] | None = None) -> str:
        """Fresh engines (and controller): the only way to release ranks stuck in a gloo collective."""
        self.close()
        self._open()
        return "fresh"

    def close(self) -> None:
        # Our engines hold nothing worth a graceful exit, and torch's static destructors make one take seconds
        # (on a loaded machine long enough for ipyparallel to warn into the cell after 5 s): kill them first.
        if self.engine_pids:
            self.kill_engines(list(self.engine_pids))
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
            self.client = None
        cluster = getattr(self, "_cluster", None)
        if cluster is not None:
            with contextlib.suppress(BaseException):
                _run(asyncio.wait_for(cluster.stop_cluster(), timeout=10))
            self._cluster = None
        # Whatever ipyparallel did not stop: the engines' nannies outlive them (they are the engines' children and
        # take their time over SIGTERM: a second per restart waiting for them), and hold nothing, so no grace.
        if getattr(self, "tag", None):
            kill_tagged(self.tag, grace=0.0)
        if self._watchdog is not None:
            # it holds nothing either; a SIGTERM would end it only at its next poll (up to 0.5 s later)
            if self._watchdog.poll() is None:
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
    """An ipyparallel cluster someone else started (the multi-node path). We never stop it.

    Found by ``profile``/``cluster_id`` (the cluster file ``ipcluster`` writes, else the client connection file a
    hand-started ``ipcontroller`` writes) or by the path of that connection file. Every registered engine becomes a
    rank; with ``nproc`` we wait (bounded) until that many have registered and refuse any other count.
    """

    is_local = False

    def __init__(
        self,
        *,
        cluster_id: str | None = None,
        profile: str | None = None,
        connection_file: str | None = None,
        nproc: int | None = None,
        wait_s: float = ATTACH_WAIT_S,
    ) -> None:
        import ipyparallel as ipp

        self._cluster: Any = None  # ipcluster's Cluster when it wrote a cluster file: it can restart engines
        self.client = None
        self._killed: set[int] = set()
        where = (
            f"connection file {connection_file}"
            if connection_file
            else f"profile {profile or 'default'!r}, cluster id {cluster_id or '(none)'!r}"
        )
        try:
            if connection_file:
                self.client = ipp.Client(connection_file)
            else:
                self._cluster = self._cluster_file(ipp, profile, cluster_id)
                if self._cluster is not None:
                    self.client = _run(self._cluster.connect_client())
                else:
                    kwargs: dict[str, Any] = {"cluster_id": cluster_id} if cluster_id else {}
                    self.client = ipp.Client(profile=profile or "default", **kwargs)
        except Exception as exc:
            raise RankError(
                f"Cannot attach to the ipyparallel cluster ({where}): {exc}. Start one with `ipcluster start -n N "
                "--engines slurm|mpi|ssh` (or `ipcontroller` + `ipengine`) and pass its --profile/--cluster-id, or "
                "--connection-file with the controller's ipcontroller-client.json."
            ) from exc
        kind = "ipcluster" if self._cluster is not None else "controller"
        self.description = f"attached {kind} ({where})"
        self.wanted = nproc
        try:
            self._ids = self._wait_for_engines(nproc, wait_s)
        except BaseException:
            self.close()
            raise
        self.n = len(self._ids)
        self.description = f"attached {kind} ({where}, {self.n} engines)"

    @staticmethod
    def _cluster_file(ipp: Any, profile: str | None, cluster_id: str | None) -> Any:
        kwargs: dict[str, Any] = {"cluster_id": cluster_id or ""}
        if profile:
            kwargs["profile"] = profile
        try:
            return ipp.Cluster.from_file(**kwargs)
        except FileNotFoundError:  # no ipcluster: maybe a hand-started ipcontroller
            return None

    def kill_engines(self, engine_ids: list[int]) -> None:
        # remembered: the controller may list a killed engine for a few heartbeats more
        self._killed.update(engine_ids)
        super().kill_engines(engine_ids)

    @property
    def can_restart_engines(self) -> bool:
        """Whether ipyparallel knows how to start this cluster's engines again (``ipcluster`` launched them)."""
        return self._cluster is not None and bool(getattr(self._cluster, "engines", None))

    def engine_ids(self) -> list[int]:
        return list(self._ids)

    def _hosts(self, ids: list[int]) -> str:
        """``2 on node-a, 1 on node-b`` for the given engines (asked with a short bound; busy engines are counted
        as ``busy``)."""
        counts: dict[str, int] = {}
        for eid in ids:
            try:
                host = self.client[eid].apply_async(socket.gethostname).get(timeout=5)
            except Exception:
                host = "busy or unreachable"
            counts[host] = counts.get(host, 0) + 1
        return ", ".join(f"{n} on {h}" for h, n in counts.items()) or "none"

    def _wait_for_engines(self, nproc: int | None, wait_s: float, exclude: set[int] = frozenset()) -> list[int]:
        """Wait (bounded) until ``nproc`` engines (at least one when None) are registered; return their ids.

        Raises:
            RankError: fewer registered within ``wait_s`` (says how many and where).
            RankUsageError: more registered than ``nproc`` (every engine becomes a rank).
        """
        from thunderviz.cell.failures import RankUsageError

        wanted = nproc or 1
        started = time.monotonic()
        ids = sorted(set(self.client.ids) - exclude)
        # fewer: wait for engines still starting; more: give engines that just died a few heartbeats to unregister
        while time.monotonic() - started < (wait_s if len(ids) < wanted else min(wait_s, UNREGISTER_WAIT_S)):
            if len(ids) == wanted or (nproc is None and ids):
                break
            time.sleep(0.2)
            ids = sorted(set(self.client.ids) - exclude)
        if len(ids) < wanted:
            raise RankError(
                f"Waited {wait_s:.0f} s for {wanted} engine(s) of the {self.description}: {len(ids)} registered "
                f"({self._hosts(ids)}). Start the missing engines (e.g. `ipengine` on each host, or `ipcluster "
                f"engines -n K`), or pass --nproc {len(ids)}."
                if ids
                else f"Waited {wait_s:.0f} s for {wanted} engine(s) of the {self.description}: none registered. Start "
                "engines (e.g. `ipengine` on each host) and run the cell again."
            )
        if nproc is not None and len(ids) > nproc:
            raise RankUsageError(
                f"--nproc {nproc} asks for {nproc} ranks, but {len(ids)} engines are registered in the "
                f"{self.description} ({self._hosts(ids)}); every engine of an attached cluster becomes a rank. Pass "
                f"--nproc {len(ids)}, or leave --nproc out to use them all."
            )
        return ids

    def restart(self, where: dict[int, str] | None = None) -> str:
        """Fresh engines when ipyparallel can start them (``ipcluster``); otherwise reuse the live engines in place,
        or say that the cluster's owner must restart the ones that are gone (``where``: engine id -> "rank r on
        host h", for that message)."""
        old = set(self._ids)
        if self.can_restart_engines:
            try:
                _run(self._cluster.restart_engines())
            except Exception as exc:
                raise RankError(
                    f"Could not restart the engines of the {self.description}: {exc}. Restart the cluster with "
                    "`ipcluster stop` / `ipcluster start`, then run the cell again."
                ) from exc
            self._ids = self._wait_for_engines(self.n, ENGINE_START_TIMEOUT_S, exclude=old)
            self._killed.clear()
            return "fresh"
        gone = sorted((old - set(self.client.ids)) | (old & self._killed))
        if not gone:
            return "in-place"
        try:  # the owner may have started replacements already
            self._ids = self._wait_for_engines(self.n, RESTART_WAIT_S, exclude=self._killed)
        except RankError:
            live = sorted(set(self.client.ids) - self._killed)
            lost = "; ".join(f"engine {eid}" + (f" ({where[eid]})" if where and eid in where else "") for eid in gone)
            raise RankError(
                f"{len(gone)} of the {self.n} engines of the {self.description} are gone ({lost}); {len(live)} "
                f"registered now ({self._hosts(live)}). thunderviz cannot start engines in a cluster it did not "
                "launch (ipcontroller + ipengine started by hand): its owner must restart them (e.g. `ipengine` on "
                "the hosts they ran on), then run the cell again."
            ) from None
        self._killed -= set(gone)
        # the survivors still hold the old namespace and process group: reset them too
        return "in-place"

    def close(self) -> None:
        """Detach: close our client only; the controller and engines keep running."""
        if self.client is not None:
            self.client.close()
            self.client = None
