"""Shared fixtures for the rank-engine tests: one real 2-rank pool per test module (starting one costs ~10 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


class OutputLog:
    """Collects what the engine streams, as (rank, stream, line) tuples."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str, str]] = []

    def __call__(self, rank: int, stream: str, line: str) -> None:
        self.lines.append((rank, stream, line))

    def text(self, rank: int) -> str:
        return "".join(line for r, _, line in self.lines if r == rank)

    def clear(self) -> None:
        self.lines.clear()


@pytest.fixture(scope="module")
def output_log() -> OutputLog:
    return OutputLog()


def start_engine(output_log: OutputLog, **kwargs) -> RankEngine:  # noqa: F821
    from thunderviz.pool.engine import RankEngine

    return RankEngine.start(2, backend="gloo", on_output=output_log, **kwargs)


@pytest.fixture(scope="module")
def engine(output_log: OutputLog) -> Iterator[RankEngine]:  # noqa: F821
    eng = start_engine(output_log, timeout=5)
    try:
        yield eng
    finally:
        eng.stop()
