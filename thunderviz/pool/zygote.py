"""A preloaded process that forks the local engines: a new or restarted engine costs a fork, not a fresh interpreter
importing torch, thunder and Lightning again (5-6 s of CPU per engine on two cores, paid twice by every restart of a
2-rank pool, while its user waits for the next cell).

One zygote per owner (the kernel or script that starts local pools), started with the first pool and kept until the
owner exits. It imports what every engine imports (``PRELOAD``), listens on a Unix socket in a private directory
(mode 0700: nothing on the network), and on request forks a child that becomes ``python -c CODE ARGS`` exactly as the
engine command would: the owner's environment and working directory, a new session, stdout and stderr to the
engine's log, default signal handlers, a fresh ``__main__``. What a fork cannot be equal to a fresh interpreter in,
it refuses instead (the owner then starts a new zygote):

- code changed on disk since the imports (thunderviz's modules, or torch/thunder/lightning/ipyparallel reinstalled):
  a restart must run the code a fresh process would;
- a variable that libraries read at import (``IMPORT_TIME_PREFIXES``) differs from the zygote's;
- a GPU machine: a process that touched CUDA before forking cannot use it after (``fork_enabled``), so engines there
  stay fresh interpreters.

Who ends what: an engine is killed with its zygote (``PR_SET_PDEATHSIG``), the zygote kills its engines and exits
when its owner is gone (a pidfd, as the watchdog does), and a forked engine carries its cluster's tag as its process
name (``/proc/PID/comm``), so the watchdog's sweep finds it although its ``/proc/PID/environ`` is the zygote's.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["FORK_VARIABLE", "Zygote", "ZygoteUnavailable", "fork_enabled"]

#: ``THUNDERVIZ_ENGINE_FORK=0`` in the owner's environment: every engine is a fresh interpreter, as before.
FORK_VARIABLE = "THUNDERVIZ_ENGINE_FORK"
#: What every engine imports before its first cell (the engine command, ``rank.setup.warm_up``, the rank calls).
PRELOAD = ("torch", "thunder", "lightning.fabric", "ipyparallel.engine.app", "thunderviz.rank.calls")
#: Variables read when those modules are imported: a fork under other values would not be a fresh interpreter.
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "THUNDER_", "CUDA", "NCCL", "OMP_", "MKL", "KMP_", "LD_", "PYTHONHASHSEED")
#: Packages whose reinstallation makes the zygote's imports stale (their ``__init__`` is rewritten by pip).
PACKAGES = ("torch", "thunder", "lightning", "ipyparallel")
READY_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 30.0
_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1
#: How many exit codes of reaped children the zygote remembers for ``exit_code`` questions.
_KEEP_STATUSES = 1000


class ZygoteUnavailable(RuntimeError):
    """The zygote cannot fork this engine; the caller starts a fresh interpreter instead (and says why in its log)."""


def fork_enabled() -> bool:
    """Whether local engines may be forked: Linux, not switched off, and no NVIDIA device on this machine (a fork of a
    process that initialised CUDA cannot use CUDA; the zygote's imports must not be the ones that find out)."""
    if os.environ.get(FORK_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    return not (Path("/dev/nvidiactl").exists() or any(Path("/dev").glob("nvidia[0-9]*")))


def package_root() -> str:
    """The directory holding the ``thunderviz`` package, so engines import the same code as the kernel."""
    return str(Path(__file__).resolve().parents[2])


def engine_pythonpath() -> str:
    """``PYTHONPATH`` for the processes a pool starts: the package's root first, then the owner's own entries."""
    return os.pathsep.join(p for p in (package_root(), os.environ.get("PYTHONPATH", "")) if p)


def import_environment(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that the preloaded modules read while importing."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


# ---------------------------------------------------------------- the owner's side


class Zygote:
    """The owner's handle on its zygote process; ``Zygote.shared()`` is the one this process uses."""

    _shared: Zygote | None = None
    _retired: ClassVar[list[Zygote]] = []  # still serving their engines; closed by ``shutdown``
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="thunderviz-zygote-")  # mode 0700: only this user reaches the socket
        self.socket_path = os.path.join(self._dir, "fork.sock")
        self.log_path = os.path.join(self._dir, "zygote.log")
        self.owner = os.getpid()
        self.retired = False
        self._ready: bool | None = None
        self._ready_lock = threading.Lock()
        import psutil

        env = {
            **os.environ,
            "PYTHONPATH": engine_pythonpath(),
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
        }
        self.environment = import_environment(env)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from thunderviz.pool.zygote import serve; serve()",
                    "--owner",
                    str(self.owner),
                    "--owner-started",
                    repr(psutil.Process().create_time()),
                    "--socket",
                    self.socket_path,
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                bufsize=0,  # unbuffered: ``wait_ready`` selects on the pipe between lines
                stderr=log,
                start_new_session=True,  # a Ctrl-C in the owner's terminal is not the zygote's
            )

    @classmethod
    def shared(cls) -> Zygote:
        """This process's zygote, started if there is none or the last one died or retired (returns at once: the
        imports run in the background; ``fork`` waits for them)."""
        with cls._lock:
            current = cls._shared
            if current is None or current.owner != os.getpid() or current.retired or current.process.poll() is not None:
                if current is not None and current.owner == os.getpid():
                    current.retire()
                    cls._retired.append(current)
                cls._retired = [z for z in cls._retired if z.process.poll() is None or z.close()]
                cls._shared = current = cls()
            return current

    @classmethod
    def shutdown(cls) -> None:
        """End this process's zygote (tests check that nothing is left; an owner's exit ends it anyway)."""
        with cls._lock:
            for zygote in [*cls._retired, *([cls._shared] if cls._shared is not None else [])]:
                if zygote.owner == os.getpid():
                    zygote.close()
            cls._shared = None
            cls._retired = []

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait for the zygote's imports; ``ZygoteUnavailable`` (with its log's end) if it died or took too long."""
        with self._ready_lock:
            if self._ready:
                return
            if self._ready is False:
                raise ZygoteUnavailable(f"the engine zygote did not start: {self._log_tail()}")
            deadline = time.monotonic() + timeout
            readable: list[Any] = []
            while not self._ready:  # a library may print while it is imported: only our line counts
                readable, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
                line = self.process.stdout.readline() if readable else b""
                if not line:
                    break
                self._ready = line.rstrip() == b"ready"
            if not self._ready:
                self._ready = False
                self.retire()
                raise ZygoteUnavailable(
                    f"the engine zygote was not ready in {timeout:.0f} s: {self._log_tail()}"
                    if not readable
                    else f"the engine zygote exited while importing: {self._log_tail()}"
                )

    def fork(
        self,
        code: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        output: str | None,
        name: str,
        streams: tuple[int, int] | None = None,
    ) -> int:
        """A child running ``python -c code`` with ``sys.argv == argv``; returns its pid.

        Its stdout and stderr go to the file ``output`` or, with ``streams``, to these two descriptors of the caller
        (sent over the socket: a rank process prints where its launcher's output goes, as a spawned child would).
        """
        if import_environment(env) != self.environment:
            changed = sorted(set(import_environment(env).items()) ^ set(self.environment.items()))
            self.retire()
            raise ZygoteUnavailable(f"variables read at import changed since the zygote started: {changed[:4]}")
        self.wait_ready()
        answer = self._ask(streams, op="fork", code=code, argv=argv, env=env, cwd=cwd, output=output, name=name)
        if "stale" in answer:
            self.retire()
            raise ZygoteUnavailable(f"the engine zygote's imports are stale: {answer['stale']}")
        if "pid" not in answer:
            raise ZygoteUnavailable(f"the engine zygote could not fork: {answer.get('error', answer)}")
        return int(answer["pid"])

    def exit_code(self, pid: int) -> int | None:
        """How child ``pid`` exited (negative: the signal that ended it), or None while it runs or when unknown."""
        with contextlib.suppress(OSError, ValueError, ZygoteUnavailable):
            return self._ask(op="status", pid=pid).get("exit_code")
        return None

    def _ask(self, streams: tuple[int, int] | None = None, **request: Any) -> dict[str, Any]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(REQUEST_TIMEOUT_S)
                conn.connect(self.socket_path)
                socket.send_fds(conn, [b"F" if streams else b"-"], list(streams or ()))  # always one byte first
                conn.sendall(json.dumps(request).encode() + b"\n")
                with conn.makefile("rb") as reply:
                    line = reply.readline()
        except OSError as exc:
            raise ZygoteUnavailable(f"the engine zygote did not answer ({exc}): {self._log_tail()}") from exc
        if not line:
            raise ZygoteUnavailable(f"the engine zygote closed the connection: {self._log_tail()}")
        return json.loads(line)

    def _log_tail(self, lines: int = 8) -> str:
        with contextlib.suppress(OSError):
            text = Path(self.log_path).read_text(errors="replace").strip().splitlines()
            return "\n".join(text[-lines:]) or "(its log is empty)"
        return "(no log)"

    def retire(self) -> None:
        """Fork nothing more: the zygote exits once its last engine has (killing it would kill them)."""
        self.retired = True
        if self.process.poll() is None:
            with contextlib.suppress(ZygoteUnavailable, OSError, ValueError):
                self._ask(op="retire")

    def close(self) -> None:
        """Stop the zygote and every engine it forked (returns None, so a filter can close as it goes)."""
        self.retired = True
        if self.process.poll() is None:
            self.process.terminate()  # the zygote kills its children on SIGTERM
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        shutil.rmtree(self._dir, ignore_errors=True)


# ---------------------------------------------------------------- the zygote's side


def _code_stamp() -> dict[str, int]:
    """Modification times of the code a fork would reuse: thunderviz's loaded modules and the preloaded packages."""
    files = [
        getattr(module, "__file__", None)
        for name, module in list(sys.modules.items())
        if name == "thunderviz" or name.startswith("thunderviz.") or name in PACKAGES
    ]
    stamp = {}
    for path in files:
        if path:
            with contextlib.suppress(OSError):
                stamp[path] = os.stat(path).st_mtime_ns
    return stamp


def _prctl(option: int, value: int | bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


def _become(request: dict[str, Any], zygote_pid: int, keep_out: list[Any]) -> None:
    """In the forked child: become ``python -c CODE ARGS`` as the engine launcher would have run it; never returns."""
    code = 1
    try:
        os.setsid()
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != zygote_pid:  # the zygote died between the fork and the line above
            os._exit(1)
        _prctl(_PR_SET_NAME, str(request["name"]).encode()[:15])
        for thing in keep_out:
            with contextlib.suppress(OSError):
                thing.close()
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        streams = request.get("streams") or []
        if not streams:
            out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            streams = [out, out]
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(streams[0], 1)
        os.dup2(streams[1], 2)
        for fd in {devnull, *streams} - {0, 1, 2}:
            os.close(fd)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        if env.get("PYTHONFAULTHANDLER"):
            import faulthandler

            faulthandler.enable(file=sys.stderr, all_threads=True)
        # what a fresh interpreter would add: PYTHONPATH entries the owner has now and the zygote did not
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[1:1] = extra
        sys.argv = list(request["argv"])
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        try:
            exec(compile(request["code"], "<string>", "exec"), main.__dict__)  # the engine command's own code
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _read_request(conn: socket.socket) -> dict[str, Any] | None:
    """One request: the descriptors sent with its first byte (``streams``), then its JSON line; None if unreadable."""
    streams: list[int] = []
    try:
        _, streams, _, _ = socket.recv_fds(conn, 1, 2)
        with conn.makefile("rb") as stream:
            request = json.loads(stream.readline() or b"{}")
    except (OSError, ValueError):
        for fd in streams:
            os.close(fd)
        return None
    request["streams"] = streams
    return request


def serve(argv: list[str] | None = None) -> None:
    """The zygote process: preload, then fork on request until the owner is gone (``Zygote`` starts it)."""
    import argparse

    from thunderviz.pool.watchdog import OwnerWatch

    parser = argparse.ArgumentParser()
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--owner-started", type=float, required=True)
    parser.add_argument("--socket", required=True)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken import is each engine's to report (as the engine command does)
            print(f"zygote: preloading {name} failed: {exc!r}", file=sys.stderr)
    stamp = _code_stamp()
    owner = OwnerWatch(args.owner, args.owner_started)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    listener.listen(16)
    try:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
    except OSError:  # the owner exited while we imported (its end of the pipe is closed): the loop sees it, cleans up
        pass
    children: set[int] = set()
    statuses: dict[int, int] = {}
    retired = False

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                return
            if pid == 0:
                return
            children.discard(pid)
            statuses[pid] = os.waitstatus_to_exitcode(status)
            while len(statuses) > _KEEP_STATUSES:
                statuses.pop(next(iter(statuses)))

    while not stopping and not (retired and not children):
        if owner.wait_exited(0.0):
            break
        readable, _, _ = select.select([listener], [], [], 0.2)
        reap()
        if not readable:
            continue
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(REQUEST_TIMEOUT_S)
            request = _read_request(conn)
            if request is None:
                continue
            streams = request["streams"]
            op = request.get("op")
            if op == "fork":
                changed = sorted(p for p, t in _code_stamp().items() if stamp.get(p) != t)
                if retired or changed:
                    retired = True
                    answer: dict[str, Any] = {"stale": f"changed on disk: {changed[:3]}" if changed else "retired"}
                else:
                    pid = os.fork()
                    if pid == 0:
                        _become(request, os.getppid(), [conn, listener, owner])
                    children.add(pid)
                    answer = {"pid": pid}
            elif op == "status":
                reap()
                pid = int(request.get("pid", -1))
                answer = {"exit_code": statuses.get(pid), "running": pid in children}
            elif op == "retire":
                retired = True
                answer = {"ok": True}
            else:
                answer = {"error": f"unknown request {op!r}"}
            for fd in streams:  # the child has its own copies
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(answer).encode() + b"\n")
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        reap()
        time.sleep(0.02)
    listener.close()
    if owner.wait_exited(0.0):  # nobody is left to remove our directory (the owner's close does when it can)
        shutil.rmtree(os.path.dirname(args.socket), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.unlink(args.socket)
