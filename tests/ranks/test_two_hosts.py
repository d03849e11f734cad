"""Two hosts made of network namespaces (``tests/helpers/netns.py``), a notebook on the first attaching to a cluster
whose engines land on both: ``ipcluster``, and a hand-started ``ipcontroller`` + ``ipengine``.

Each host's hostname resolves to 127.0.1.1 (Debian's default), so these tests also prove the rendezvous and gloo
never rely on the hostname. Covered: ranks spread over both hosts (ipcluster's launchers place one engine on each;
the hand-started cluster has two per host) with numerics equal to single-process training under FSDP and under
hybrid sharding (shard groups within each host, the report's traffic split within and between hosts); a rank on
the second host raising; restarts of the attached pool (fresh engines from ipcluster's launchers, or the
hand-started engines reset in place) followed by a working cell; set-up that cannot connect reported as such;
``ss`` in each namespace shows nothing listening on all interfaces; a cluster we attached to still runs after we
detach. Skipped, with the reason, where namespaces cannot be created.

Over a minute each: every engine set-up imports torch and thunder, on two cores shared by up to four engines (the
ipcluster test sets up its two engines twice; the hand-started test starts seven engines one at a time, ids
following registration order, which fixes the ranks' hosts, and its unreachable set-up waits for gloo to give up).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.netns import PLACEMENT_VARIABLE, NamespacesUnavailable, TwoHosts, wait_until, wildcard

pytestmark = pytest.mark.timeout(1200)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROFILE = "tv2h"
#: The heartbeat thunderviz's own pools use (ipyparallel's 3 s default made every engine here wait seconds after it
#: registered before a client listed it; the hand-started cluster starts nine, one after another).
HEARTBEAT = "--HeartMonitor.period=500"

# FSDP over 4 ranks on 2 hosts vs one process on the global batch: every dim-0 divisible by 4 (no padding).
NUMERICS = """
import socket
from thunderviz.thunder.comm.distribute import gather_full
host = socket.gethostname()
def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
full_x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
full_y = torch.randn(16, 4, generator=torch.Generator().manual_seed(2))
reference = make()
ref_loss = torch.nn.functional.mse_loss(reference(full_x), full_y)
ref_loss.backward()
model = fabric.setup(make())
x, y = full_x.chunk(world_size)[rank], full_y.chunk(world_size)[rank]
loss = torch.nn.functional.mse_loss(model(x), y)
fabric.backward(loss)
inner = getattr(model._forward_module, "_model", model._forward_module)
grads = [gather_full(p.grad, p) for p in inner.parameters()]
losses = fabric.all_gather(loss.detach())
grad_error = max((g - r.grad).abs().max().item() for g, r in zip(grads, reference.parameters()))
loss_error = abs(losses.mean().item() - ref_loss.item())
"""
# Hybrid sharding's groups as the ranks see them (after NUMERICS set the model up with --sharding hybrid).
HYBRID_GROUPS = """
from thunderviz.thunder import param_tags
mesh = [d.headline for d in fabric.strategy.decisions if str(d.action) == "choose the mesh"][-1]
p0 = next(inner.parameters())
groups = (
    torch.distributed.get_process_group_ranks(param_tags.param_group(p0)),
    torch.distributed.get_process_group_ranks(param_tags.replica_group(p0)),
)
"""
# the last rank on host b raises (with ipcluster, which host registers first and takes rank 0 is a race)
RAISE_ON_HOST_B = """
import socket
hosts = [None] * world_size
torch.distributed.all_gather_object(hosts, socket.gethostname())
on_b = [r for r, h in enumerate(hosts) if h == "tvhostb"]
if rank == on_b[-1]:
    raise ValueError("host b says no")
torch.distributed.all_reduce(torch.ones(1))
"""
WHO = "import os, socket\nwho = (socket.gethostname(), os.getpid(), rank, world_size)\n"


@pytest.fixture
def hosts() -> Iterator[TwoHosts]:
    try:
        two = TwoHosts()
    except NamespacesUnavailable as exc:
        pytest.skip(f"the two-host test needs Linux network namespaces: {exc}")
    try:
        yield two
    finally:
        two.close()


def _env(tmp_path: Path, hosts: TwoHosts, per_host: int = 2) -> dict[str, str]:
    return {
        **os.environ,
        "IPYTHONDIR": str(tmp_path / "ipython"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        PLACEMENT_VARIABLE: hosts.placement(per_host),
        "PYTHONUNBUFFERED": "1",
    }


class Notebook:
    """``tests/ranks/two_hosts_client.py`` running on host a: one JSON command in, one answer out, bounded."""

    def __init__(self, hosts: TwoHosts, env: dict[str, str], log: Path) -> None:
        self.proc = hosts.launch(
            "a",
            [sys.executable, "-u", "-m", "tests.ranks.two_hosts_client"],
            env=env,
            cwd=str(ROOT),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.log = log.open("a")
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._next(120, "the notebook process starting")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith("@@tv@@ "):
                self.answers.put(json.loads(line[len("@@tv@@ ") :]))

    def _next(self, seconds: float, what: str) -> dict[str, Any]:
        try:
            return self.answers.get(timeout=seconds)
        except queue.Empty:
            raise AssertionError(
                f"no answer from the notebook on host a within {seconds:.0f} s ({what}); "
                f"its output is in {self.log.name}"
            ) from None

    def ask(self, seconds: float = 400, **command: Any) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._next(seconds, repr(command)[:200])

    def cell(self, flags: str, source: str, seconds: float = 400) -> dict[str, Any]:
        return self.ask(seconds, cell=f"%%thunder_fsdp {flags}\n{source}")

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(AssertionError, OSError):
                self.ask(60, quit=True)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def _ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["ok"], answer
    return answer


def _nothing_listens_on_all_interfaces(hosts: TwoHosts) -> None:
    for key in "ab":
        listening = hosts.listening(key)
        assert [a for a in listening if wildcard(a)] == [], f"host {key} listens on every interface: {listening}"
    assert any(a.startswith(hosts.hosts["a"].address + ":") for a in hosts.listening("a"))  # the scan sees ours


def _numerics_match_and_ranks_span_both_hosts(nb: Notebook, flags: str) -> None:
    _ok(nb.cell(f"{flags} --output none", NUMERICS))
    assert _ok(nb.ask(pull="host"))["values"] == ["tvhosta", "tvhosta", "tvhostb", "tvhostb"]
    assert max(_ok(nb.ask(pull="grad_error"))["values"]) < 1e-6
    assert max(_ok(nb.ask(pull="loss_error"))["values"]) < 1e-6


def _hybrid_shards_within_each_host(nb: Notebook, flags: str) -> None:
    """By default the shard group is each host's ranks, numerics still equal one process, and the report
    splits the traffic: the shard group's collectives stay inside a host, only the replica all_reduce leaves it."""
    answer = _ok(nb.cell(f"{flags} --sharding hybrid --output none", NUMERICS + HYBRID_GROUPS))
    assert max(_ok(nb.ask(pull="grad_error"))["values"]) < 1e-6
    assert max(_ok(nb.ask(pull="loss_error"))["values"]) < 1e-6
    assert set(_ok(nb.ask(pull="mesh"))["values"]) == {
        "mesh 2 x 2: shard within each host (2 ranks), replicate across 2 hosts"
    }
    assert _ok(nb.ask(pull="groups"))["values"] == [
        [[0, 1], [0, 2]],
        [[0, 1], [1, 3]],
        [[2, 3], [0, 2]],
        [[2, 3], [1, 3]],
    ]
    traffic = answer["traffic"]
    assert traffic.startswith("each rank sends ") and " of it within its host; each host sends " in traffic, traffic
    within, across = traffic.split(" of it within its host")[0], traffic.split("each host sends ")[1]
    assert not within.endswith(" 0 B") and not across.startswith("0 B"), traffic


def _rank_on_host_b_raises(nb: Notebook, flags: str, placed: list[str]) -> None:
    """``placed``: each rank's host, by rank (from ``_who``)."""
    last = max(r for r, host in enumerate(placed) if host == "tvhostb")
    answer = nb.cell(f"{flags} --output none", RAISE_ON_HOST_B)
    print(f"\n[fault latency] two hosts: rank {last} on host b raised -> cell failed in {answer['seconds']:.2f} s")
    assert not answer["ok"] and answer["error_type"] == "CellError", answer
    assert f"rank {last} raised ValueError: host b says no" in answer["error"]
    others = {answer["kinds"][str(r)] for r in range(len(placed)) if r != last}
    assert answer["kinds"][str(last)] == "raised" and others == {"killed"}, answer["kinds"]
    assert answer["seconds"] < 30  # generous: the peers are released by signals, not by the 60 s timeout


def _who(nb: Notebook, flags: str) -> list[Any]:
    _ok(nb.cell(f"{flags} --output none", WHO))
    return _ok(nb.ask(pull="who"))["values"]


def test_ipcluster_across_two_hosts(hosts: TwoHosts, tmp_path: Path) -> None:
    """One engine per host: what is ipcluster's here (its launchers place the engines, and start fresh ones on a
    restart) needs no more; sharding across hosts is the hand-started cluster's, on four engines."""
    env = _env(tmp_path, hosts, per_host=1)
    a = hosts.hosts["a"]
    common = [f"--profile={PROFILE}", "--cluster-id=c1"]
    started = hosts.run(
        "a",
        [
            str(BIN / "ipcluster"),
            "start",
            "-n",
            "2",
            "--daemonize",
            *common,
            f"--ip={a.address}",
            "--Cluster.engine_launcher_class=tests.helpers.netns.NetnsEngineSetLauncher",
            HEARTBEAT,
        ],
        timeout=180,
        env=env,
        cwd=str(ROOT),
    )
    assert started.returncode == 0, started.stderr[-3000:]
    flags = f"--nproc 2 {' '.join(common).replace('=', ' ')} --backend gloo --timeout 30"
    nb = Notebook(hosts, env, tmp_path / "notebook.log")
    try:
        before = _who(nb, flags)
        # the launchers put a rank on each host; which registers first (and is rank 0) is a race between the hosts
        assert sorted(w[0] for w in before) == ["tvhosta", "tvhostb"], before
        _nothing_listens_on_all_interfaces(hosts)
        _rank_on_host_b_raises(nb, flags, [w[0] for w in before])
        # the pool restarts itself before this cell: fresh engines from the launchers, a rank on each host again
        # (``%thunder_ranks restart`` takes the same way: tests/ranks/test_attach.py)
        after = _who(nb, flags)
        assert sorted(w[0] for w in after) == ["tvhosta", "tvhostb"], after
        assert {w[1] for w in after}.isdisjoint({w[1] for w in before}) and [w[2:] for w in after] == [
            [r, 2] for r in range(2)
        ]
        _nothing_listens_on_all_interfaces(hosts)
        _ok(nb.ask(line="thunder_ranks stop"))  # detaches; the cluster is not ours to stop
        client_file = tmp_path / "ipython" / f"profile_{PROFILE}" / "security" / "ipcontroller-c1-client.json"
        assert _ok(nb.ask(engines=str(client_file)))["engines"] == 2
    finally:
        nb.close()
        hosts.run("a", [str(BIN / "ipcluster"), "stop", *common], timeout=120, env=env, cwd=str(ROOT))


def test_hand_started_controller_and_engines_across_two_hosts(hosts: TwoHosts, tmp_path: Path) -> None:
    env = _env(tmp_path, hosts)
    a = hosts.hosts["a"]
    log = (tmp_path / "cluster.log").open("w")
    security = tmp_path / "ipython" / f"profile_{PROFILE}" / "security"
    controller = hosts.launch(
        "a",
        [str(BIN / "ipcontroller"), f"--profile={PROFILE}", f"--ip={a.address}", HEARTBEAT],
        env=env,
        cwd=str(ROOT),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_until(lambda: (security / "ipcontroller-engine.json").exists(), 120, "the controller's connection file")
    engine = [str(BIN / "ipengine"), f"--profile={PROFILE}"]

    def start_engine(key: str) -> None:
        hosts.launch(key, engine, env=env, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT)

    connection = f"--connection-file {security / 'ipcontroller-client.json'}"
    client_file = str(security / "ipcontroller-client.json")
    flags = f"--nproc 4 {connection} --backend gloo --timeout 30"
    nb = Notebook(hosts, env, tmp_path / "notebook.log")

    def start_in_order(keys: str) -> None:
        """Engine ids follow registration order, and ranks follow the host of the lowest id: started together, a
        host-b engine could register first and take rank 0. One at a time, each waited for, the order is fixed."""
        for key in keys:
            before = _ok(nb.ask(engines=client_file))["engines"]
            start_engine(key)
            wait_until(lambda n=before: _ok(nb.ask(engines=client_file))["engines"] == n + 1, 300, f"engine on {key}")

    try:
        wait_until(lambda: (security / "ipcontroller-client.json").exists(), 120, "the client connection file")
        start_in_order("aab")
        uneven = nb.cell(f"--nproc 3 {connection} --backend gloo", "pass")
        assert uneven["error_type"] == "UsageError" and "{'tvhosta': 2, 'tvhostb': 1}" in uneven["error"], uneven
        start_in_order("b")
        _numerics_match_and_ranks_span_both_hosts(nb, flags)
        _hybrid_shards_within_each_host(nb, flags)
        _ok(nb.cell(f"{flags} --output none", "kept = rank"))
        _ok(nb.ask(line="thunder_ranks restart"))  # the engines are not ours to replace: reset in place
        _ok(nb.cell(f"{flags} --output none", "assert 'kept' not in globals() and world_size == 4"))
        _nothing_listens_on_all_interfaces(hosts)

        # ranks 0-2 had to be killed; nobody can start them but their owner
        _rank_on_host_b_raises(nb, flags, ["tvhosta", "tvhosta", "tvhostb", "tvhostb"])
        owner_must = nb.cell(f"{flags} --output none", "pass")
        assert not owner_must["ok"] and "its owner must restart them" in owner_must["error"], owner_must
        assert (
            "engine 0 (rank 0 on tvhosta)" in owner_must["error"]
            and "1 registered now (1 on tvhostb)" in (owner_must["error"])
        )
        for key in "aab":  # the owner does, and waits for them as the message says
            start_engine(key)
        wait_until(lambda: _ok(nb.ask(engines=client_file))["engines"] == 4, 300, "4 engines registered")
        placed = [w[0] for w in _who(nb, flags)]  # the survivor (lowest engine id) is on b: b's ranks come first
        assert sorted(placed) == ["tvhosta", "tvhosta", "tvhostb", "tvhostb"] and placed[0] == placed[1], placed
        _nothing_listens_on_all_interfaces(hosts)

        # engines whose environment tells gloo to use loopback (the user's setting wins over ours; set by a cell, as a
        # user would, and kept by the reset in place that new flags cause): set-up cannot connect across hosts, and
        # says where and why
        _ok(nb.cell(f"{flags} --output none", "import os\nos.environ['GLOO_SOCKET_IFNAME'] = 'lo'"))
        # a short timeout: gloo retries a refused connection well past it (4 s gave up after 23 s, 10 s after 53 s)
        broken = nb.cell(f"--nproc 4 {connection} --backend gloo --timeout 4 --output none", "pass", seconds=300)
        assert not broken["ok"] and set(broken["kinds"].values()) == {"unreachable"}, broken
        seconds = broken["seconds"]
        print(f"[fault latency] two hosts: set-up that cannot connect (--timeout 4) failed in {seconds:.1f} s")
        text = broken["error"]
        assert "could not join the gloo process group within 4 s (it gave up after " in text, text
        assert "The rendezvous is 10.231.7." in text
        assert "GLOO_SOCKET_IFNAME=lo (set in the engine's environment)" in text and "Fix:" in text
        assert "resolves to 127.0.1.1, a loopback address" in text
        _ok(nb.ask(line="thunder_ranks stop"))
        assert controller.poll() is None  # we never stop a cluster we attached to
    finally:
        nb.close()
        log.close()
