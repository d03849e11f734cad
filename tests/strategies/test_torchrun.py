"""The strategies by name under a real ``torchrun``: processes created externally, as on a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from thunderviz.pool.rendezvous import free_port

ROOT = Path(__file__).resolve().parents[2]


CASES = [
    ("thunder_fsdp", "ThunderFSDPStrategy", "reduce_scatter"),
    ("thunder_ddp", "ThunderDDPStrategy", "all_reduce"),
]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Path:
    """One ``torchrun`` of the job with every strategy name (each rank writes one file per name)."""
    out = tmp_path_factory.mktemp("torchrun")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "tests.strategies.torchrun_job",
        str(out),
        *(name for name, _, _ in CASES),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize(("name", "cls", "collective"), CASES)
def test_strategy_by_name_under_torchrun(launched, name, cls, collective):
    results = [json.loads((launched / f"{name}-rank-{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(results):
        assert (res["rank"], res["world_size"], res["backend"], res["strategy"]) == (r, 2, "gloo", cls)
        assert res["mean_loss"] == pytest.approx(res["expected_loss"], rel=1e-5)
        assert res["backward_collectives"].get(collective, 0) >= 1
        assert res["decision"] == "case 1: raw module"
