"""``run_ranks``, the one-shot spawner: torchrun's environment, results by rank, a raising rank named."""

from __future__ import annotations

import os

import pytest

from thunderviz.errors import RankError
from thunderviz.pool.rendezvous import torchrun_environment
from thunderviz.pool.spawn import run_ranks

pytestmark = pytest.mark.timeout(600)


def _environment(rank: int, world_size: int) -> dict[str, str]:
    import torch.distributed as dist

    dist.init_process_group("gloo")  # from the environment, as under torchrun
    names = torchrun_environment(
        rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, master_addr="", master_port=0, threads=1
    )
    return {**{name: os.environ[name] for name in names}, "group_size": str(dist.get_world_size())}


def _raise_on_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one is unhappy")
    return rank


def test_ranks_get_the_torchrun_environment_and_results_come_back_by_rank() -> None:
    envs = run_ranks(_environment, nproc=2, timeout=240)
    assert [e["RANK"] for e in envs] == ["0", "1"] and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} and {e["group_size"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"} and len({e["MASTER_PORT"] for e in envs}) == 1
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"1"}


def test_a_raising_rank_is_named_with_its_traceback() -> None:
    with pytest.raises(RankError, match="rank 1 raised") as info:
        run_ranks(_raise_on_one, nproc=2, timeout=240)
    assert info.value.rank == 1 and "rank one is unhappy" in info.value.remote_traceback
