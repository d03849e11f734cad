"""``process_rank``: the one answer to "which rank is this process", on real processes and a real gloo group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from thunderviz.pool.spawn import run_ranks
from thunderviz.process_rank import ProcessRank

pytestmark = pytest.mark.timeout(600)


def _fresh(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}, timeout=120
    )


def test_without_a_group_the_torchrun_environment_answers_and_torch_stays_unloaded() -> None:
    code = "import sys; from thunderviz.process_rank import process_rank; print(process_rank(), 'torch' in sys.modules)"
    assert _fresh(code, RANK="3", WORLD_SIZE="4").stdout.strip() == (
        "ProcessRank(rank=3, world_size=4, backend='') False"
    )
    assert _fresh(code).stdout.strip() == "ProcessRank(rank=0, world_size=1, backend='') False"


def test_a_malformed_variable_is_named_with_the_fix() -> None:
    result = _fresh("from thunderviz.process_rank import process_rank; process_rank()", RANK="zero")
    assert result.returncode != 0
    assert "RANK='zero' in the environment is not a whole number; set it as torchrun does (e.g. RANK=0)" in (
        result.stderr
    )


def _before_and_after_the_group(rank: int, world_size: int) -> tuple[ProcessRank, ProcessRank]:
    import torch.distributed as dist

    from thunderviz.process_rank import process_rank

    before = process_rank()
    dist.init_process_group("gloo")
    os.environ["RANK"] = "99"  # the group is the authority once it exists
    try:
        return before, process_rank()
    finally:
        dist.destroy_process_group()


def test_the_process_group_is_the_authority_once_it_exists() -> None:
    results = run_ranks(_before_and_after_the_group, nproc=2, timeout=240)
    assert results == [
        (ProcessRank(0, 2, ""), ProcessRank(0, 2, "gloo")),
        (ProcessRank(1, 2, ""), ProcessRank(1, 2, "gloo")),
    ]
