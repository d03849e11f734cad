"""The session's shared pair of rank processes (tests/helpers/rank_pool.py), which the 2-rank scenario files rely on:
jobs run on the same two processes with torchrun's environment, results come back by rank, and a failing job
raises ``RankError`` with the rank's traceback, ends the pair, and the next job gets a new pair."""

from __future__ import annotations

import os

import pytest

from tests.helpers.rank_pool import run_on_pool
from thunderviz.errors import RankError


def who(rank: int, world: int, tag: str) -> dict:
    return {
        "rank": rank,
        "world": world,
        "tag": tag,
        "pid": os.getpid(),
        "env": (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"], os.environ["OMP_NUM_THREADS"]),
    }


def fail_on_rank_1(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 refuses")


def test_jobs_share_the_processes_and_a_failure_ends_them():
    first = run_on_pool(who, "a", timeout=300)
    second = run_on_pool(who, "b", timeout=60)
    assert [(r["rank"], r["world"], r["tag"]) for r in first] == [(0, 2, "a"), (1, 2, "a")]
    assert [r["env"] for r in first] == [("0", "2", "127.0.0.1", "1"), ("1", "2", "127.0.0.1", "1")]
    assert [r["pid"] for r in second] == [r["pid"] for r in first]  # the same two processes
    assert len({r["pid"] for r in first} | {os.getpid()}) == 3

    with pytest.raises(RankError, match="rank 1 raised") as err:
        run_on_pool(fail_on_rank_1, timeout=60)
    assert err.value.rank == 1 and "ValueError: rank 1 refuses" in err.value.remote_traceback

    after = run_on_pool(who, "c", timeout=300)
    assert [r["tag"] for r in after] == ["c", "c"]
    assert not {r["pid"] for r in after} & {r["pid"] for r in first}  # a new pair replaced the failed one
