"""Topology and backend choice: pure functions, so every host and GPU situation is checked without the hardware."""

from __future__ import annotations

import pytest

from thunderviz.cell.failures import RankUsageError
from thunderviz.pool.topology import EngineIdentity, layout_ranks, resolve_backend, validate_pool_args


@pytest.mark.parametrize(
    ("backend", "ranks_per_host", "gpus", "expected"),
    [
        ("auto", 2, 0, "gloo"),
        ("auto", 2, 2, "nccl"),
        ("auto", 4, 2, "gloo"),  # not one GPU per rank: stay on CPU rather than share GPUs
        ("gloo", 2, 8, "gloo"),
        ("nccl", 2, 2, "nccl"),
    ],
)
def test_backend_resolution(backend: str, ranks_per_host: int, gpus: int, expected: str) -> None:
    assert resolve_backend(backend, ranks_per_host, gpus) == expected


@pytest.mark.parametrize(
    ("ranks_per_host", "gpus", "fragment"),
    [
        (2, 0, "no CUDA device is visible here. Use --backend gloo"),
        (4, 2, "4 ranks were asked for on a host with 2 GPU(s). Use --nproc 2 or fewer, or --backend gloo"),
    ],
)
def test_nccl_without_enough_gpus_says_what_to_do(ranks_per_host: int, gpus: int, fragment: str) -> None:
    with pytest.raises(RankUsageError) as info:
        resolve_backend("nccl", ranks_per_host, gpus)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((0, "gloo", 5), "at least 1"),
        ((True, "gloo", 5), "whole number"),
        ((2.0, "gloo", 5), "whole number"),
        ((2, "mpi", 5), "backend must be one of auto, gloo, nccl"),
        ((2, "gloo", "soon"), "timeout must be a number"),
        ((2, "gloo", 0), "timeout must be positive"),
    ],
)
def test_pool_arguments_are_validated(args: tuple, fragment: str) -> None:
    with pytest.raises(RankUsageError, match=fragment):
        validate_pool_args(*args)


def test_pool_arguments_are_normalised() -> None:
    assert validate_pool_args(2, "auto", "7") == (2, "auto", 7.0)


def _engines(*hosts: str, gpus: int = 0) -> dict[int, EngineIdentity]:
    return {eid: EngineIdentity(eid, host, 1000 + eid, gpus, 8) for eid, host in enumerate(hosts)}


def test_ranks_are_grouped_by_host_in_order_of_first_appearance() -> None:
    # engines registered interleaved across two hosts: local ranks must still be contiguous, rank 0 on host a
    layout = layout_ranks(_engines("a", "b", "a", "b"))
    assert layout.rank_to_engine == {0: 0, 1: 2, 2: 1, 3: 3}
    assert layout.rank_hosts == {0: "a", 1: "a", 2: "b", 3: "b"}
    assert layout.hosts == ("a", "b") and layout.num_nodes == 2 and layout.world_size == 4
    assert [layout.local_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert [layout.node_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert layout.rank_pids[1] == 1002 and layout.threads_per_rank == 4


def test_uneven_hosts_are_a_clear_error() -> None:
    with pytest.raises(RankUsageError, match=r"same number of engines for Fabric, got \{'a': 2, 'b': 1\}"):
        layout_ranks(_engines("a", "a", "b"))


def test_no_engines_is_a_clear_error() -> None:
    with pytest.raises(RankUsageError, match="no engines"):
        layout_ranks({})


def test_auto_counts_the_fewest_gpus_of_any_engine() -> None:
    engines = _engines("a", "a")
    engines[1] = EngineIdentity(1, "a", 1001, 1, 8)
    layout = layout_ranks({0: EngineIdentity(0, "a", 1000, 2, 8), 1: engines[1]})
    assert layout.cuda_devices_per_host == 1
    assert resolve_backend("auto", layout.local_world_size, layout.cuda_devices_per_host) == "gloo"


def test_the_rendezvous_is_rank_zeros_address_facing_the_controller() -> None:
    engines = {
        0: EngineIdentity(0, "a", 1, 0, 8, address="10.0.0.1", interface="eth0"),
        1: EngineIdentity(1, "b", 2, 0, 8, address="10.0.0.2", interface="eth1"),
    }
    assert layout_ranks(engines).master_address == "10.0.0.1"
    loopback = {0: EngineIdentity(0, "a", 1, 0, 8, address="127.0.0.1", interface="lo"), 1: engines[1]}
    with pytest.raises(RankUsageError, match=r"reaches the controller over loopback .*ipcontroller --ip=ADDRESS"):
        _ = layout_ranks(loopback).master_address
    single = {0: loopback[0], 1: EngineIdentity(1, "a", 2, 0, 8, address="127.0.0.1", interface="lo")}
    assert layout_ranks(single).master_address == "127.0.0.1"  # one host: loopback is right
