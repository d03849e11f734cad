"""bench/device_check.sh, the one-go GPU check: clear refusal without CUDA, and its steps rehearsed on CPU.

No GPU is lent to this project's test runs, so the GPU run itself happens by hand on a GPU machine; what can be
checked here is that the script refuses clearly without CUDA and that every step it takes works (``--cpu-rehearsal``
runs the same strategies, checks and real-kernel cell with gloo on CPU).

Over a minute (about 70 s beside the other pytest worker): the rehearsal is the script itself, end to end (fresh rank
processes, a real Jupyter kernel, a memory plan), which is what it guards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "device_check.sh"


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would run for real")
def test_refuses_without_cuda_and_names_the_way_out():
    proc = _run(timeout=120)
    assert proc.returncode == 2
    assert "needs a CUDA GPU, but torch.cuda.is_available() is False" in proc.stderr
    assert "--cpu-rehearsal" in proc.stderr


@pytest.mark.timeout(390)
def test_cpu_rehearsal_runs_every_step_and_passes():
    proc = _run("--cpu-rehearsal", timeout=380)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    for line in (
        "1. strategies in a fresh rank process (world size 1):",
        "- ThunderDDPStrategy on cpu (gloo)",
        "- ThunderFSDPStrategy ZERO3 BLOCK on cpu (gloo)",
        "backward bucket: all_gather blocks.1",
        "2. %%thunder_fsdp --nproc 1 --backend gloo in a real Jupyter kernel:",
        "report: <RunReport device_report: thunder_fsdp (FSDP ZERO3 BLOCK) on 1 ranks (gloo)",
        "3. memory plan against the measured step peak on cpu (world size 1):",
        "- fsdp-zero2-block: predicted",
        "4. speed and memory against eager on cpu (world size 1; small GPT, no gates on CPU):",
        "- ours FSDP ZERO2 BLOCK: first step",
        "executors: sdpa, torchcompile_xentropy (thunder's defaults on CPU",
        "device_check: all checks passed",
    ):
        assert line in out, out


def test_speed_gates_hold_zero3_to_its_own_bar():
    """Step 4's gates on CUDA rows: ZERO3 BLOCK may take 1.20x eager's step, DDP and ZERO2 BLOCK 1.10x; no more peak."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_check", ROOT / "bench" / "device_check.py")
    device_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device_check)

    def rows(ddp: float, zero2: float, zero3: float, zero3_peak: float = 1.0) -> list[dict]:
        def row(name: str, step: float, peak: float = 1.0) -> dict:
            return {"name": name, "step_ms": 20.0 * step, "peak": int(1000 * peak), "decided": "executors: x"}

        return [
            row("eager", 1.0),
            row("ours DDP", ddp),
            row("ours FSDP ZERO2 BLOCK", zero2),
            row("ours FSDP ZERO3 BLOCK", zero3, zero3_peak),
        ]

    assert device_check.speed_problems(rows(1.05, 1.10, 1.19), "cuda") == []
    (problem,) = device_check.speed_problems(rows(1.05, 1.10, 1.25), "cuda")
    assert problem.startswith("speed, ours FSDP ZERO3 BLOCK: 1.25x eager's step time (gate 1.20x)")
    (problem,) = device_check.speed_problems(rows(1.05, 1.10, 1.10, zero3_peak=1.05), "cuda")
    assert "1.05x its peak (gate 1.00x)" in problem
    assert [p.split(":")[0] for p in device_check.speed_problems(rows(1.15, 1.15, 1.15), "cuda")] == [
        "speed, ours DDP",
        "speed, ours FSDP ZERO2 BLOCK",
    ]
    assert device_check.speed_problems(rows(2.0, 2.0, 2.0), "cpu") == []  # no gates on the CPU rehearsal
