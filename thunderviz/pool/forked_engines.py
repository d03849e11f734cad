"""ipyparallel launchers whose engines come from this process's zygote (``pool.zygote``) instead of a fresh
interpreter each: the same engine command, run by a fork of a process that already imported what it imports.

ipyparallel keeps doing everything else it does for a local engine (its log file, its stop by SIGTERM then SIGKILL,
noticing the exit): only the start differs, and the exit code comes from the zygote, the engine's parent. When the
zygote cannot fork (``ZygoteUnavailable``: stale code, another import-time environment, it died), the launcher starts
the fresh interpreter ipyparallel would, and writes why at the top of the engine's log.

The classes are built on first use (``ipyparallel`` imports IPython, which nothing below the notebook layer may load
at import): ``pool.cluster`` asks ``engine_set_launcher()`` when it starts a forked pool, and the names resolve
as module attributes, so ipyparallel's cluster file can name the class as any other launcher's.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import psutil

from thunderviz.pool.watchdog import TAG_VARIABLE
from thunderviz.pool.zygote import Zygote, ZygoteUnavailable

__all__ = ["engine_set_launcher"]

_LAUNCHERS = ("ForkedEngineLauncher", "ForkedEngineSetLauncher")


def engine_set_launcher() -> type:
    """``ForkedEngineSetLauncher``: a set of engines forked from this process's zygote (for ``ipp.Cluster``)."""
    return _launchers()["ForkedEngineSetLauncher"]


def __getattr__(name: str) -> type:
    if name in _LAUNCHERS:
        return _launchers()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _launchers() -> dict[str, type]:
    from ipyparallel.cluster.launcher import LocalEngineLauncher, LocalEngineSetLauncher

    class ForkedEngineLauncher(LocalEngineLauncher):
        """One engine: ``python -c CODE ARGS`` forked from the zygote, else started as that command."""

        _zygote: Zygote | None = None

        def start(self) -> Any:
            args = self.find_args()
            if len(args) < 3 or args[0] != sys.executable or args[1] != "-c":
                return super().start()  # not a `python -c` command: nothing a fork could stand for
            env = os.environ.copy()
            env.update(self.get_env())
            try:
                zygote = Zygote.shared()
                pid = zygote.fork(
                    code=args[2],
                    argv=["-c", *args[3:]],
                    env=env,
                    cwd=self.work_dir,
                    output=self.output_file,
                    name=env.get(TAG_VARIABLE, "thunderviz-rank"),
                )
            except ZygoteUnavailable as exc:
                with open(self.output_file, "a") as log:
                    log.write(f"[thunderviz] started as a fresh interpreter, not forked: {exc}\n")
                return super().start()
            self._zygote = zygote
            self.pid = pid
            self.process = psutil.Process(pid)
            self.notify_start(pid)
            self._start_waiting()
            return None

        def _exit_code(self) -> int | str | None:
            if self._zygote is None:
                return None
            code = self._zygote.exit_code(self.pid)
            return "unknown" if code is None else code

        def _wait(self) -> None:
            """As ipyparallel's, but a forked engine is not our child: its exit code is the zygote's to tell."""
            if self._zygote is None:
                return super()._wait()
            while not self._stop_waiting.is_set() and self.state == "running":
                try:
                    self.process.wait(timeout=self.poll_seconds)
                except psutil.TimeoutExpired:
                    continue
                break
            stop_data = {"exit_code": self._exit_code(), "pid": self.pid, "identifier": self.identifier}
            self.loop.add_callback(lambda: self.notify_stop(stop_data))
            return None

        def poll(self) -> int | str | None:
            if self._zygote is None:
                return super().poll()
            if self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE:
                return None
            status = self._exit_code()
            self.notify_stop({"exit_code": status, "pid": self.pid, "identifier": self.identifier})
            return status

    class ForkedEngineSetLauncher(LocalEngineSetLauncher):
        """A set of ``ForkedEngineLauncher`` engines (what ``ipp.Cluster(engine_launcher_class=...)`` takes)."""

        launcher_class = ForkedEngineLauncher

    classes = {"ForkedEngineLauncher": ForkedEngineLauncher, "ForkedEngineSetLauncher": ForkedEngineSetLauncher}
    for name, cls in classes.items():
        cls.__qualname__ = name  # named as module attributes (``__getattr__``), not as this function's locals
    return classes
