"""The engine zygote (thunderviz/pool/zygote.py): a forked engine is the `python -c` process the launcher would have
started, it is found and ended as a cluster's process, and the zygote refuses what a fork could not be equal in.

One zygote per test process (``Zygote.shared()``, as an owner uses it); the pool tests in this folder use it too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from thunderviz.pool.watchdog import TAG_VARIABLE, tagged_processes
from thunderviz.pool.zygote import Zygote, ZygoteUnavailable

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote forks (Linux only)"),
]

# What a forked child reports about itself: the same facts a fresh `python -c` would show.
PROBE = """
import json, os, signal, sys, time
preloaded = "thunder" in sys.modules  # before anything of the command's own imports
try:
    signal.raise_signal(signal.SIGINT)
    interrupt = "no KeyboardInterrupt"
except KeyboardInterrupt:
    interrupt = "KeyboardInterrupt"
print(json.dumps({
    "pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd(), "tag": os.environ.get("THUNDERVIZ_CLUSTER_TAG"),
    "only_env": os.environ.get("ZYGOTE_TEST_ONLY"), "main": sorted(k for k in vars(sys.modules["__main__"])
    if not k.startswith("__")), "interrupt": interrupt, "session": os.getsid(0) == os.getpid(),
    "comm": open("/proc/self/comm").read().strip(), "preloaded": preloaded,
}), flush=True)
if sys.argv[1] == "wait":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
"""


def _fork(zygote: Zygote, tmp_path: Path, *args: str, tag: str = "tv-0123456789ab") -> tuple[int, Path]:
    out = tmp_path / f"child-{len(list(tmp_path.iterdir()))}.log"
    env = {**os.environ, TAG_VARIABLE: tag, "ZYGOTE_TEST_ONLY": "yes"}
    pid = zygote.fork(code=PROBE, argv=["-c", *args], env=env, cwd=str(tmp_path), output=str(out), name=tag)
    return pid, out


def _report(out: Path) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = [line for line in out.read_text().splitlines() if line.startswith("{")] if out.exists() else []
        if lines:
            return json.loads(lines[0])
        time.sleep(0.05)
    raise AssertionError(f"the forked child wrote nothing: {out.read_text() if out.exists() else '(no file)'}")


def _exit_code(zygote: Zygote, pid: int) -> int | None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        code = zygote.exit_code(pid)
        if code is not None:
            return code
        time.sleep(0.05)
    return None


def test_a_forked_child_is_the_python_c_process_it_stands_for(tmp_path: Path) -> None:
    zygote = Zygote.shared()
    pid, out = _fork(zygote, tmp_path, "exit", "3")
    report = _report(out)
    assert report["pid"] == pid and report["argv"] == ["-c", "exit", "3"] and report["cwd"] == str(tmp_path)
    assert report["tag"] == "tv-0123456789ab" and report["only_env"] == "yes"  # the launcher's environment, not ours
    # a fresh __main__: the probe's own names only, none of the zygote's (`serve`)
    assert report["main"] == ["interrupt", "json", "os", "preloaded", "signal", "sys", "time"]
    assert report["interrupt"] == "KeyboardInterrupt" and report["session"]
    assert report["preloaded"] and report["comm"] == "tv-0123456789ab"
    assert _exit_code(zygote, pid) == 3


def test_a_forked_engine_is_found_by_its_tag_and_its_signal_death_is_told(tmp_path: Path) -> None:
    zygote = Zygote.shared()
    pid, out = _fork(zygote, tmp_path, "wait", "0", tag="tv-fedcba987654")
    _report(out)
    assert pid in [p.pid for p in tagged_processes("tv-fedcba987654")]  # its /proc environ is the zygote's
    os.kill(pid, signal.SIGSEGV)
    assert _exit_code(zygote, pid) == -signal.SIGSEGV


def test_what_a_fork_cannot_equal_is_refused_and_a_new_zygote_takes_over(tmp_path: Path) -> None:
    zygote = Zygote.shared()
    zygote.wait_ready()
    # a variable torch reads at import: the zygote's imports did not see it
    env = {**os.environ, "TORCH_SHOW_CPP_STACKTRACES": "1"}
    with pytest.raises(ZygoteUnavailable, match="TORCH_SHOW_CPP_STACKTRACES"):
        zygote.fork(code="pass", argv=["-c"], env=env, cwd=str(tmp_path), output=str(tmp_path / "x.log"), name="t")
    assert zygote.retired
    # code changed on disk since the imports: the next zygote refuses once a loaded module's file is touched
    fresh = Zygote.shared()
    assert fresh is not zygote
    _report(_fork(fresh, tmp_path, "exit", "0")[1])
    import thunderviz.rank.setup as preloaded  # one of the modules the zygote imported (PRELOAD's rank calls)

    module = Path(preloaded.__file__)
    before = module.stat()
    try:
        os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
        with pytest.raises(ZygoteUnavailable, match=r"rank/setup\.py"):
            _fork(fresh, tmp_path, "exit", "0")
    finally:
        os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))
    # the retired zygote exits once its last child has (it has none left)
    deadline = time.monotonic() + 10
    while fresh.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fresh.process.poll() is not None
    assert Zygote.shared() is not fresh


def test_a_zygote_that_dies_takes_its_children_with_it(tmp_path: Path) -> None:
    zygote = Zygote.shared()
    pid, out = _fork(zygote, tmp_path, "wait", "0")
    _report(out)
    child = psutil.Process(pid)
    zygote.process.kill()
    zygote.process.wait()
    assert psutil.wait_procs([child], timeout=10)[1] == []  # PR_SET_PDEATHSIG
    assert Zygote.shared() is not zygote  # the next engine gets a new one


def test_an_owner_that_exits_while_its_zygote_imports_leaves_nothing_behind() -> None:
    """The zygote finds its owner gone once its imports are done (its ready line has no reader): it exits and removes
    its directory (socket and log) itself, since nobody else is left to."""
    import subprocess

    from thunderviz.pool.cluster import process_gone

    code = "from thunderviz.pool.zygote import Zygote; z = Zygote.shared(); print(z._dir, z.process.pid, flush=True)"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    owner = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    directory, pid = owner.stdout.split()
    deadline = time.monotonic() + 120
    while (not process_gone(int(pid)) or Path(directory).exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process_gone(int(pid)), "the zygote outlived its owner"
    assert not Path(directory).exists(), sorted(p.name for p in Path(directory).iterdir())
