"""Attaching to a cluster someone else started with ``ipcluster`` (the multi-node path), here on one host."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from thunderviz.cell.failures import RankUsageError
from thunderviz.errors import RankError
from thunderviz.pool.engine import RankEngine

ROOT = Path(__file__).resolve().parents[2]


def _attach_when_both_engines_registered(cluster_id: str, seconds: float = 90.0) -> RankEngine:
    """``ipcluster --daemonize`` returns before its engines register: retry until both are there, then fail clearly
    (never loop until pytest's timeout, never leave an engine attached with the wrong world size)."""
    deadline = time.monotonic() + seconds
    last = "nothing tried yet"
    while time.monotonic() < deadline:
        try:
            engine = RankEngine.attach(
                cluster_id=cluster_id, profile="tvtest", backend="gloo", timeout=20, on_output=lambda *a: None
            )
        except Exception as exc:  # the cluster file or the engines may not be there yet
            last = f"attach raised {type(exc).__name__}: {exc}"
        else:
            if engine.world_size == 2:
                return engine
            last = f"attached with world size {engine.world_size}, on hosts {engine.rank_hosts}"
            engine.stop()
        time.sleep(1.0)
    pytest.fail(
        f"the 2-engine ipcluster {cluster_id} was not attachable with 2 ranks within {seconds:.0f} s; last try: {last}"
    )


@pytest.mark.timeout(300)
def test_attach_to_an_ipcluster_maps_ranks_and_never_stops_it(tmp_path: Path) -> None:
    ipcluster = str(Path(sys.executable).with_name("ipcluster"))
    cluster_id = f"tv-attach-{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "IPYTHONDIR": str(tmp_path / "ipython"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    # A named profile under our own IPYTHONDIR: without a name, ipyparallel looks in the profile of any IPython
    # shell alive in this process (earlier tests start real shells), not where ipcluster wrote its file.
    common = [f"--cluster-id={cluster_id}", "--profile=tvtest"]
    subprocess.run(
        [
            ipcluster,
            "start",
            "-n",
            "2",
            "--daemonize",
            "--ip=127.0.0.1",
            *common,
            "--IPController.ip=127.0.0.1",
            "--HeartMonitor.period=500",
        ],
        env=env,
        check=True,
        cwd=str(ROOT),
        capture_output=True,
        timeout=120,
    )
    old = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = env["IPYTHONDIR"]
    engine = None
    try:
        engine = _attach_when_both_engines_registered(cluster_id)
        engine.run(
            "t = torch.tensor([float(rank)])\ntorch.distributed.all_reduce(t)\n"
            "import os\nenv = (os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR'])",
            collect=False,
        )
        assert engine.pull("t", 1).tolist() == [1.0]
        assert [engine.pull("env", r)[:2] for r in (0, 1)] == [("0", "2"), ("1", "2")]
        # rank 0's address facing the controller (here the controller listens on 127.0.0.1)
        assert engine.pull("env", 1)[2] == "127.0.0.1"
        # a restart gets fresh engines from ipcluster's launchers, and the next cell works on them (it used to fail
        # with `IndexError: No such engine: 0`: per-rank views outlived the restart)
        pids = {r: s.pid for r, s in engine.status().items()}
        engine.restart()
        engine.run("after = rank + world_size", collect=False)
        assert [engine.pull("after", r) for r in (0, 1)] == [2, 3]
        assert set(pids.values()).isdisjoint(s.pid for s in engine.status().values())
        engine.stop()  # detaches only
        # --nproc is honoured: a bounded wait, then the counts and where they are
        start = time.monotonic()
        with pytest.raises(RankError, match=r"Waited 3 s for 3 engine\(s\) .*: 2 registered \(2 on "):
            RankEngine.attach(cluster_id=cluster_id, profile="tvtest", nproc=3, wait_s=3, on_output=lambda *a: None)
        assert time.monotonic() - start < 60
        with pytest.raises(RankUsageError, match="--nproc 1 asks for 1 ranks, but 2 engines are registered"):
            RankEngine.attach(cluster_id=cluster_id, profile="tvtest", nproc=1, wait_s=3, on_output=lambda *a: None)
        again = RankEngine.attach(
            cluster_id=cluster_id, profile="tvtest", backend="gloo", timeout=20, on_output=lambda *a: None
        )
        assert again.world_size == 2
        again.stop()
    finally:
        if old is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = old
        subprocess.run([ipcluster, "stop", *common], env=env, cwd=str(ROOT), capture_output=True, timeout=60)
