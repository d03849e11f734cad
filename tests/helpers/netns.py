"""Two simulated hosts for multi-host tests: Linux network namespaces joined by a veth pair, each process also in
its own UTS namespace so ``socket.gethostname()`` says which host it is on.

What the test makes, it removes (``TwoHosts.close``, also called by the fixture's finalizer and on any error while
building): every process inside either namespace is killed by pid (``ip netns pids``), the namespaces are deleted,
and their ``/etc/netns/<name>/hosts`` files (``ip netns exec`` mounts them over ``/etc/hosts``) are removed. The
names carry this process's pid, so a test never touches namespaces it did not make. Addresses exist only inside the
two namespaces, and traffic only flows between them.

Each host's ``/etc/hosts`` maps its own hostname to 127.0.1.1, as Debian does by default: the case where gloo,
left to itself, advertises an address no other host can reach.

``NetnsEngineSetLauncher`` is an ipyparallel engine launcher that places engine ``i`` on host ``placement[i]``
(from ``THUNDERVIZ_TEST_PLACEMENT``), the way an SSH or Slurm launcher places engines on nodes; ``ipcluster`` uses it
as ``--Cluster.engine_launcher_class=tests.helpers.netns.NetnsEngineSetLauncher``, and so can a client that
restarts the cluster's engines later.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

PLACEMENT_VARIABLE = "THUNDERVIZ_TEST_PLACEMENT"
_SUBNET = "10.231.7"


class NamespacesUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``/``unshare``, or the kernel refuses)."""


def in_host(namespace: str, hostname: str, argv: list[str]) -> list[str]:
    """``argv`` run inside ``namespace`` with ``hostname`` (a private UTS namespace; exec keeps the pid)."""
    shell = 'hostname "$0" && exec "$@"'
    return ["ip", "netns", "exec", namespace, "unshare", "--uts", "--", "sh", "-c", shell, hostname, *argv]


@dataclass(frozen=True)
class Host:
    name: str  # the hostname its processes see
    namespace: str
    address: str
    interface: str


class TwoHosts:
    """Hosts ``a`` and ``b`` (``hosts["a"]``...); use as a context manager or call ``close()``."""

    def __init__(self) -> None:
        problem = _why_unavailable()
        if problem:
            raise NamespacesUnavailable(problem)
        tag = f"tv{os.getpid()}"
        self.hosts = {
            key: Host(f"tvhost{key}", f"{tag}{key}", f"{_SUBNET}.{i + 1}", f"tvv{os.getpid()}{key}")
            for i, key in enumerate("ab")
        }
        self._made: list[Host] = []
        self._procs: list[subprocess.Popen] = []
        self._made_etc_netns = not Path("/etc/netns").exists()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ building and removing

    def _build(self) -> None:
        a, b = self.hosts["a"], self.hosts["b"]
        for host in (a, b):
            _ip("netns", "add", host.namespace)
            self._made.append(host)
        _ip("link", "add", a.interface, "type", "veth", "peer", "name", b.interface)
        for host in (a, b):
            _ip("link", "set", host.interface, "netns", host.namespace)
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            other = b if host is a else a
            hosts_file = Path("/etc/netns") / host.namespace / "hosts"
            hosts_file.parent.mkdir(parents=True, exist_ok=True)
            hosts_file.write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n{other.address} {other.name}\n")

    def close(self) -> None:
        """Kill every process in the namespaces (by pid), delete the namespaces and their /etc/netns files."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        for host in self._made:
            self._kill_inside(host)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for host in reversed(self._made):
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, timeout=30)
            shutil.rmtree(Path("/etc/netns") / host.namespace, ignore_errors=True)
        self._made.clear()
        if self._made_etc_netns:
            with contextlib.suppress(OSError):  # rmdir only if empty: another session may be using it
                Path("/etc/netns").rmdir()

    def _kill_inside(self, host: Host) -> None:
        for _ in range(3):  # a process may start another while we kill: look again
            pids = self.pids(host.namespace)
            if not pids:
                return
            procs = []
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    proc.kill()
                    procs.append(proc)
                except psutil.Error:
                    continue
            psutil.wait_procs(procs, timeout=5)

    def __enter__(self) -> TwoHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ using

    @staticmethod
    def pids(namespace: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def command(self, key: str, argv: list[str]) -> list[str]:
        host = self.hosts[key]
        return in_host(host.namespace, host.name, argv)

    def launch(self, key: str, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` on host ``key``; it is killed by ``close`` if still running."""
        proc = subprocess.Popen(self.command(key, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, key: str, argv: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(key, argv), timeout=timeout, capture_output=True, text=True, **kwargs)

    def listening(self, key: str) -> list[str]:
        """Every listening TCP/UDP socket in host ``key``'s namespace, as ``ss`` prints its local address."""
        argv = ["ip", "netns", "exec", self.hosts[key].namespace, "ss", "-Hltun"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
        return [line.split()[4] for line in out.stdout.splitlines() if line.strip()]

    def placement(self, per_host: int) -> str:
        """The ``THUNDERVIZ_TEST_PLACEMENT`` value putting ``per_host`` engines on a, then as many on b."""
        return json.dumps([[h.namespace, h.name] for h in self.hosts.values() for _ in range(per_host)])


def wildcard(address: str) -> bool:
    """Whether an ``ss`` local address listens on every interface (``0.0.0.0:P``, ``*:P``, ``[::]:P``)."""
    host = address.rsplit(":", 1)[0].split("%")[0]
    return host in ("0.0.0.0", "*", "[::]", "::")


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode:
        raise NamespacesUnavailable(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")


def _why_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "unshare", "ss"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


def wait_until(check: Any, seconds: float, what: str) -> Any:
    """Poll ``check()`` until it returns something truthy; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {seconds:.0f} s")
        time.sleep(0.2)


try:  # the engine launcher needs ipyparallel; the namespaces above do not
    from ipyparallel.cluster.launcher import LocalEngineLauncher, LocalEngineSetLauncher
except ImportError:  # pragma: no cover
    pass
else:

    class NetnsEngineLauncher(LocalEngineLauncher):
        """One engine, started on the host ``placement[identifier]`` names."""

        def find_args(self) -> list[str]:
            placement = json.loads(os.environ[PLACEMENT_VARIABLE])
            namespace, hostname = placement[int(self.identifier) % len(placement)]
            return in_host(namespace, hostname, super().find_args())

    class NetnsEngineSetLauncher(LocalEngineSetLauncher):
        """``LocalEngineSetLauncher`` whose engines land on the simulated hosts."""

        launcher_class = NetnsEngineLauncher
        # ipyparallel writes a custom class to the cluster file as "module:Class", which it cannot import back;
        # a dotted name round-trips, so a client can restart these engines later.
        entrypoint_name = "tests.helpers.netns.NetnsEngineSetLauncher"
