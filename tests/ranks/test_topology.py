"""Backend choice per host: a pure function, so every GPU situation is checked here without the hardware."""

from __future__ import annotations

import pytest

from thunderviz.ranks.engine import RankUsageError, _resolve_backend


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
    assert _resolve_backend(backend, ranks_per_host, gpus) == expected


@pytest.mark.parametrize(
    ("ranks_per_host", "gpus", "fragment"),
    [
        (2, 0, "no CUDA device is visible here. Use --backend gloo"),
        (4, 2, "4 ranks were asked for on a host with 2 GPU(s). Use --nproc 2 or fewer, or --backend gloo"),
    ],
)
def test_nccl_without_enough_gpus_says_what_to_do(ranks_per_host: int, gpus: int, fragment: str) -> None:
    with pytest.raises(RankUsageError) as info:
        _resolve_backend("nccl", ranks_per_host, gpus)
    assert fragment in str(info.value)
