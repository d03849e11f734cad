"""Runs last (``zz_``): no ipyparallel or rank process started by this test session is still alive.

Processes are recognised by ``THUNDERVIZ_TEST_SESSION`` in their environment (set by the test conftests and
inherited by everything they start), so clusters other people run on the same machine do not count.
"""

from __future__ import annotations

import os
import time

import psutil


def _leftovers(session: str) -> list[str]:
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get("THUNDERVIZ_TEST_SESSION") != session:
                continue
            cmd = " ".join(proc.cmdline())
        except (psutil.Error, OSError):
            continue
        if "ipyparallel" in cmd or "thunderviz.ranks" in cmd or "ipykernel" in cmd or "THUNDERVIZ_CLUSTER_TAG" in str(
            proc.environ()
        ):
            found.append(f"{proc.pid}: {cmd[:120]}")
    return found


def test_no_ipyparallel_or_rank_process_is_left() -> None:
    session = os.environ.get("THUNDERVIZ_TEST_SESSION")
    if session is None:
        os.environ["THUNDERVIZ_TEST_SESSION"] = "unused"
        session = "unused"
    # a watchdog exits at most one poll (0.5 s) after its work is done; allow a little more
    deadline = time.monotonic() + 10
    left = _leftovers(session)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _leftovers(session)
    assert left == [], "processes left behind by the tests:\n" + "\n".join(left)
