"""Orphan guard: kills every process of a local rank cluster when the process that owns it disappears.

Why a separate process: a kernel that is SIGKILLed or restarted runs no ``atexit`` and no ``finally``, and
ipyparallel starts its controller and engines in their own sessions, so nothing else would stop them (measured:
13 processes survive a SIGKILLed client). Every process the cluster starts inherits the environment variable
``THUNDERVIZ_CLUSTER_TAG=<tag>`` (an engine forked by the owner's zygote carries it as its process name instead, see
``tagged_processes``); the watchdog follows the owner (``OwnerWatch``) and, once it is gone, kills all that carries
the tag. It knows no pids in advance, so engines restarted later and their children are covered too.

Run as ``python -m thunderviz.pool.watchdog --owner PID --owner-started T --tag TAG [--cluster-file F]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import time
from pathlib import Path

import psutil

TAG_VARIABLE = "THUNDERVIZ_CLUSTER_TAG"
POLL_SECONDS = 0.5


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``THUNDERVIZ_CLUSTER_TAG=tag`` (never this one), and every engine
    forked for the tag's cluster by a zygote (``pool.zygote``: its ``/proc`` environment is the zygote's, so the tag is
    its process name; tags are 15 characters, the most a process name holds)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(TAG_VARIABLE) == tag or proc.name() == tag:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_tagged(tag: str, *, grace: float = 1.0) -> list[int]:
    """Terminate, then kill after ``grace`` seconds (0: at once), every process carrying ``tag``; returns the pids
    that were found."""
    procs = tagged_processes(tag)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=max(grace, 1.0))  # returns as soon as they are gone: a SIGKILL is quick
    # A nanny may have spawned something between the scan and the kill: sweep once more.
    late = tagged_processes(tag)
    for proc in late:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return [p.pid for p in procs + late]


class OwnerWatch:
    """Whether the owner process exited, asked without the wall clock.

    Why not compare ``create_time()`` on every poll: psutil computes it from the boot time, which moves whenever the
    system clock is stepped (NTP on a freshly booted machine), and a step of more than a second made the watchdog
    take a live owner for a reused pid and kill every rank mid-cell. So the start time is checked once, when the
    watch begins (moments after the owner started us), and from then on the owner is followed by a pidfd on Linux
    (readable once it exits; never confused with a later process of the same pid), else by psutil's own identity
    check.
    """

    def __init__(self, pid: int, started: float) -> None:
        self._process: psutil.Process | None = None
        self._pidfd: int | None = None
        try:
            process = psutil.Process(pid)
            if abs(process.create_time() - started) < 1.0:  # pid reuse before we began: not our owner
                self._process = process
        except psutil.Error:
            return
        if self._process is not None and hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self._pidfd = os.pidfd_open(pid)

    def wait_exited(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True once the owner has exited (a zombie has)."""
        if self._process is None:
            return True
        if self._pidfd is not None:
            readable, _, _ = select.select([self._pidfd], [], [], seconds)
            return bool(readable)
        time.sleep(seconds)
        try:
            return not self._process.is_running() or self._process.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def close(self) -> None:
        """Let go of the pidfd (a process forked from the watcher must not keep it)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--owner-started", type=float, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--cluster-file", default="")
    args = parser.parse_args(argv)

    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    # SIGTERM from the owner means "the cluster was stopped cleanly, exit without killing anything".
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    owner = OwnerWatch(args.owner, args.owner_started)
    while not stop:
        if owner.wait_exited(POLL_SECONDS) and not stop:
            kill_tagged(args.tag)
            if args.cluster_file:
                Path(args.cluster_file).unlink(missing_ok=True)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
