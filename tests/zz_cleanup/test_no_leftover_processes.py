"""Runs last (``zz_``): no ipyparallel or rank process started by this test session is still alive.

Processes are recognised by ``THUNDERVIZ_TEST_SESSION`` in their environment (set once per session by
``tests/conftest.py`` and inherited by everything the tests start), so clusters other people run on the same
machine do not count. The test refuses to pass without checking: it fails when the variable is unset, and first
proves on a canary process that the scan can see a process of ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from tests.conftest import SESSION_VARIABLE
from tests.helpers import rank_pool
from thunderviz.pool.zygote import Zygote


def _ours(proc: psutil.Process) -> str | None:
    environ = proc.environ()
    cmd = " ".join(proc.cmdline())
    # a forked rank or engine shows its zygote's command line (``thunderviz.pool.zygote``), a spawned rank spawn's
    if "ipyparallel" in cmd or "thunderviz.pool" in cmd or "ipykernel" in cmd or "spawn_main" in cmd:
        return cmd
    if "THUNDERVIZ_CLUSTER_TAG" in environ:
        return cmd
    return None


def _leftovers(session: str) -> list[str]:
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(SESSION_VARIABLE) != session:
                continue
            cmd = _ours(proc)
        except (psutil.Error, OSError):
            continue
        if cmd is not None:
            found.append(f"{proc.pid}: {cmd[:120]}")
    return found


def _session() -> str:
    session = os.environ.get(SESSION_VARIABLE)
    assert session, (
        f"{SESSION_VARIABLE} is not set, so this test cannot tell this session's processes from "
        "anyone else's: tests/conftest.py sets it; run the suite through pytest from the repository root"
    )
    return session


def test_the_scan_sees_a_process_of_this_session() -> None:
    session = _session()
    canary = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "THUNDERVIZ_CLUSTER_TAG": "canary"}
    )
    try:
        deadline = time.monotonic() + 10
        while not any(line.startswith(f"{canary.pid}:") for line in _leftovers(session)):
            assert time.monotonic() < deadline, "the leftover scan cannot see a process of this session"
            time.sleep(0.1)
    finally:
        canary.kill()
        canary.wait()


def leftovers_after_grace(session: str) -> list[str]:
    """The session's processes still alive after a short grace (a watchdog exits at most one poll, 0.5 s, after its
    work is done; allow a little more)."""
    deadline = time.monotonic() + 10
    left = _leftovers(session)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _leftovers(session)
    return left


def test_no_ipyparallel_or_rank_process_is_left() -> None:
    session = _session()
    # The shared pair of rank processes the scenario files ran on (tests/helpers/rank_pool.py) is the one thing
    # kept on purpose until the end: end it the way the session would, then nothing at all may be left.
    rank_pool.shutdown()
    Zygote.shutdown()  # this worker's engine zygote (thunderviz.pool.zygote) lives as long as its owner otherwise
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # the other worker may still be running a cluster of this session: the controller checks once both are done
        # (tests/conftest.py, pytest_sessionfinish); this worker's pool ends here and its own processes must be gone
        mine = [line for line in leftovers_after_grace(session) if _started_by_me(int(line.split(":", 1)[0]))]
        assert mine == [], "processes left behind by this worker's tests:\n" + "\n".join(mine)
        return
    left = leftovers_after_grace(session)
    assert left == [], "processes left behind by the tests:\n" + "\n".join(left)


def _started_by_me(pid: int) -> bool:
    """``pid`` descends from this process (this worker's tests started it)."""
    me = os.getpid()
    try:
        proc = psutil.Process(pid)
        return any(p.pid == me for p in proc.parents())
    except psutil.Error:
        return False
