"""``%load_ext thunderviz`` starts a warm pool in the background (in a real kernel), the first cell uses it, and
``THUNDERVIZ_PRESTART=0`` turns it off."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.helpers.kernel import execute as _execute
from thunderviz.pool.watchdog import tagged_processes

ROOT = Path(__file__).resolve().parents[2]
MAGICS = "m = get_ipython().magics_manager.registry['ThundervizMagics']\n"


def _kernel(prestart: str):
    from jupyter_client import KernelManager

    env = {
        **os.environ,
        "THUNDERVIZ_PRESTART": prestart,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def _last_line(kc, code: str) -> str:
    reply, out = _execute(kc, code)
    assert reply["status"] == "ok", out
    return out.strip().splitlines()[-1]


@pytest.mark.timeout(400)
def test_the_first_cell_finds_warm_engines() -> None:
    km, kc = _kernel("1")
    try:
        assert _execute(kc, "%load_ext thunderviz")[0]["status"] == "ok"
        loaded_at = time.monotonic()
        deadline = loaded_at + 240
        while (state := _last_line(kc, MAGICS + "print(m.warm.state)")) == "starting":
            assert time.monotonic() < deadline, "the warm pool did not start within 240 s"
            time.sleep(0.2)
        print(f"\n[cold start] warm pool ready {time.monotonic() - loaded_at:.1f} s after %load_ext")
        assert state == "ready", state
        tag = _last_line(kc, MAGICS + "print(m.warm._cluster.tag)")
        warm_pids = {p.pid for p in tagged_processes(tag)}
        status = _last_line(kc, "%thunder_ranks status")
        assert "warm pool of 2 local engines (ready)" in status
        start = time.monotonic()
        reply, out = _execute(
            kc,
            "%%thunder_ddp --backend gloo --output none\nimport os\n"
            "cuda_before_set_up = torch.cuda.is_initialized()\npid = os.getpid()\n",
        )
        print(f"[cold start] first cell on the warm pool: {time.monotonic() - start:.2f} s")
        assert reply["status"] == "ok", out
        pids = _last_line(
            kc,
            MAGICS + "print(sorted(m.engine.pull('pid', r) for r in m.engine.ranks), "
            "[m.engine.pull('cuda_before_set_up', r) for r in m.engine.ranks])",
        )
        engine_pids, cuda = pids.split("] [")
        assert {int(p) for p in engine_pids.strip("[]").split(",")} <= warm_pids  # the warm engines were used
        assert "True" not in cuda
        assert _last_line(kc, MAGICS + "print(m.warm)") == "None"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


@pytest.mark.timeout(200)
def test_prestart_can_be_turned_off() -> None:
    km, kc = _kernel("0")
    try:
        assert _execute(kc, "%load_ext thunderviz")[0]["status"] == "ok"
        assert _last_line(kc, MAGICS + "print(m.warm)") == "None"
        assert "No rank pool is running" in _last_line(kc, "%thunder_ranks status")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
