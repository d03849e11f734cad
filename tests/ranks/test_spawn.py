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


def _facts(rank: int, world_size: int, token: str) -> dict:
    import sys

    print(f"[{token}] rank {rank} prints to the launcher's stdout", flush=True)
    print(f"[{token}] rank {rank} warns on its stderr", file=sys.stderr, flush=True)
    return {
        "cwd": os.getcwd(),
        "sys_path": list(sys.path),
        "torch_threads": __import__("torch").get_num_threads(),
    }


def _exit_on_zero(rank: int, world_size: int) -> None:
    if rank == 0:
        os._exit(7)
    import time

    time.sleep(60)


def test_forked_ranks_are_prepared_as_spawned_ones(capfd: pytest.CaptureFixture[str]) -> None:
    """Forked from the zygote, a rank is what spawn makes: the launcher's sys.path and working directory, one thread,
    output on the launcher's stdout and stderr; it runs one job after another, and one that dies is named with its
    exit code. (Spawned ranks: the script test below, and every test where the zygote cannot fork.)"""
    import sys

    from thunderviz.pool.local_ranks import LocalRanks
    from thunderviz.pool.zygote import fork_enabled

    with LocalRanks(2) as ranks:
        assert ranks.forked == fork_enabled()
        first = ranks.run(_facts, "first", timeout=120)
        second = ranks.run(_facts, "second", timeout=120)
        for facts in first + second:
            assert facts == {"cwd": os.getcwd(), "sys_path": sys.path, "torch_threads": 1}
        with pytest.raises(RankError, match="rank 0 died with exit code 7"):
            ranks.run(_exit_on_zero, timeout=120)
        assert ranks.closed
    out, err = capfd.readouterr()
    for token in ("first", "second"):
        for rank in (0, 1):
            assert f"[{token}] rank {rank} prints to the launcher's stdout" in out
            assert f"[{token}] rank {rank} warns on its stderr" in err


SCRIPT = """
import json, os, sys
from thunderviz.pool.local_ranks import LocalRanks

def job(rank, world_size):  # defined in the script: ranks import it as __mp_main__, as spawn's children do
    return [rank, __name__, sys.modules["__main__"].__name__, SIDE]

SIDE = "module level ran"
if __name__ == "__main__":
    answers = {}
    for fork in ("1", "0"):
        os.environ["THUNDERVIZ_ENGINE_FORK"] = fork
        with LocalRanks(2) as ranks:
            answers[fork] = [ranks.forked, ranks.run(job, timeout=120)]
    print(json.dumps(answers))
"""


def test_a_function_from_the_launching_script_runs_on_forked_and_spawned_ranks(tmp_path) -> None:
    """The usual script: ``run_ranks(fn)`` with ``fn`` defined in the script itself. Forked ranks import the script
    as ``__mp_main__`` exactly as spawned ones do (its guarded part does not run again)."""
    import json
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path), check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    expected = [[r, "__mp_main__", "__mp_main__", "module level ran"] for r in range(2)]
    assert answers == {"1": [True, expected], "0": [False, expected]}
