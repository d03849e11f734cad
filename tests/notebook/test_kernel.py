"""The extension inside a real Jupyter kernel (jupyter_client): Ctrl-C reaches every rank, and a SIGKILLed kernel
leaves no rank, controller or helper process behind (the issue's bound: 10 s)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.kernel import execute as _execute
from tests.helpers.kernel import reply_to as _reply_to
from tests.helpers.kernel import wait_for_output as _wait_for_output
from thunderviz.pool.watchdog import tagged_processes

ROOT = Path(__file__).resolve().parents[2]


def _pool_tag(kc) -> str:
    _, out = _execute(
        kc, "magics = get_ipython().magics_manager.registry['ThundervizMagics']\nprint(magics.engine.cluster.tag)"
    )
    tag = out.strip().splitlines()[-1]
    assert tag.startswith("tv-") and len(tagged_processes(tag)) >= 5
    return tag


@pytest.mark.timeout(400)
def test_interrupt_and_sigkill_in_a_real_kernel() -> None:
    from jupyter_client import KernelManager

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply, _ = _execute(kc, "%load_ext thunderviz")
        assert reply["status"] == "ok"
        reply, out = _execute(kc, "%%thunder_ddp --nproc 2 --backend gloo\nprint('ready on', rank)\nkept = rank\n")
        assert reply["status"] == "ok", out
        assert "[rank 0] ready on 0" in out and "[rank 1] ready on 1" in out

        # Ctrl-C while both ranks run Python: the kernel forwards it, both stop, state is kept. Interrupt once every
        # rank says it is inside the loop, not after a fixed sleep (too short on a loaded machine, wasted otherwise).
        # stop_on_error=False: ipykernel 7 aborts requests that arrive while it still unwinds a failed one (a race
        # the next cell below lost on CI, reply "aborted"); a notebook user re-runs later, this test at once.
        msg_id = kc.execute(
            "%%thunder_ddp --nproc 2 --backend gloo\nimport time\nprint('looping on', rank, flush=True)\n"
            "for _ in range(1200):\n    time.sleep(0.05)\n",
            stop_on_error=False,
        )
        _wait_for_output(kc, msg_id, ["[rank 0] looping on 0", "[rank 1] looping on 1"], timeout=120)
        interrupted_at = time.monotonic()
        km.interrupt_kernel()
        reply = _reply_to(kc, msg_id, timeout=60)
        stopped_in = time.monotonic() - interrupted_at
        print(f"\n[fault latency] kernel interrupt -> cell stopped in {stopped_in:.2f} s")
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "RanksInterrupted"
        assert stopped_in < 10
        reply, out = _execute(kc, "%%thunder_ddp --nproc 2 --backend gloo\nprint('still', kept)\n")
        assert reply["status"] == "ok" and "[rank 1] still 1" in out, out

        tag = _pool_tag(kc)

        # Restart the kernel (a clean shutdown of the old one): its pool goes with it.
        km.restart_kernel(now=False)
        restarted_at = time.monotonic()
        while tagged_processes(tag) and time.monotonic() - restarted_at < 10:
            time.sleep(0.1)
        print(f"[fault latency] kernel restart -> old pool gone in {time.monotonic() - restarted_at:.2f} s")
        assert tagged_processes(tag) == []
        kc.wait_for_ready(timeout=60)
        assert _execute(kc, "%load_ext thunderviz")[0]["status"] == "ok"
        reply, out = _execute(kc, "%%thunder_ddp --nproc 2 --backend gloo --output none\nx = 1\n")
        assert reply["status"] == "ok", out
        tag = _pool_tag(kc)

        # SIGKILL the kernel: no cleanup code runs in it; the watchdog must take everything down.
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while tagged_processes(tag) and time.monotonic() - killed_at < 10:
            time.sleep(0.1)
        elapsed = time.monotonic() - killed_at
        print(f"[fault latency] kernel SIGKILL -> all cluster processes gone in {elapsed:.2f} s")
        assert tagged_processes(tag) == []
    finally:
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
