"""Long sessions stay flat: identical warm cells in a real kernel do not grow the kernel or the ranks.

The bench (``bench/soak.py``, 100 cells, target <= 1 MB/cell per process) prints the numbers; this guards them with
fewer cells and a generous bound on the growth per cell after the first few (a leak of one model per cell was
17-18 MB/cell per rank, of one report per cell 11 MB/cell in the kernel). It asserts on memory, never on time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CELLS, SETTLE, BOUND_MB_PER_CELL = 20, 5, 3.0


def _soak_module():
    spec = importlib.util.spec_from_file_location("thunderviz_bench_soak", ROOT / "bench" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(900)
def test_identical_warm_cells_do_not_grow_kernel_or_ranks() -> None:
    soak = _soak_module()
    series = soak.soak(CELLS, nproc=2, quiet=True)
    growth = {name: soak.growth_per_cell(values, SETTLE) for name, values in series.items()}
    print(
        "\n[memory] growth per cell after the first",
        SETTLE,
        "of",
        CELLS,
        "cells (MiB):",
        {name: round(g, 2) for name, g in growth.items()},
    )
    assert sorted(series) == ["kernel", "rank 0", "rank 1"]
    assert all(len(values) == CELLS for values in series.values())
    over = {name: round(g, 2) for name, g in growth.items() if g > BOUND_MB_PER_CELL}
    assert over == {}, f"RSS grows by more than {BOUND_MB_PER_CELL} MiB per cell: {over}; run bench/soak.py"
