"""Long sessions stay flat: identical warm cells in a real kernel do not grow the kernel or the ranks.

The bench (``bench/soak.py``, 100 cells, target <= 1 MB/cell per process) prints the numbers; this guards them with
fewer cells and a generous bound on the growth per cell after the first few (a leak of one model per cell was
17-18 MB/cell per rank, of one report per cell 11 MB/cell in the kernel). It asserts on memory, never on time.

How many cells: the kernel grows by about a report's traces per cell (10 MB here) until its history of
``REPORT_HISTORY`` reports is full, then stays flat, so the slope is taken from the cell after that on; and each
warm cell sets a model up on both ranks (8-10 s beside the other pytest worker). Twelve cells leave seven after the
history filled: measured over 20 cells, the slopes over their first 12 were kernel 0.5 (0.5 over all 20), ranks 0.8
(0.8) MiB/cell, each process's RSS moving smoothly, so a leak of 11-18 MB/cell stays far above the bound and the
kernel's history of reports far below it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from thunderviz.notebook.magics import REPORT_HISTORY

ROOT = Path(__file__).resolve().parents[2]
# the first REPORT_HISTORY cells fill the kernel's history of reports; the slope starts at the cell after
CELLS, SETTLE, BOUND_MB_PER_CELL = 12, REPORT_HISTORY, 3.0


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
