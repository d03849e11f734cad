"""Long sessions: run N identical warm cells in a real Jupyter kernel and print every process's RSS.

Each cell is the issue's: ``fabric.setup`` of a 2-block TinyGPT (d=64), one forward and backward, ``--output none``
(the report is built and returned as usual, so the kernel's output history holds it, as a notebook's would).
Printed: RSS of the kernel and of each rank after cells 1, 5, 10, ... N, and the growth per cell after the first
``--settle`` cells (target: <= 1 MB per cell per process).

    .venv/bin/python bench/soak.py [--cells 100] [--settle 5] [--nproc 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.kernel import execute  # noqa: E402 - needs the repository root on the path

CELL = """%%thunder_fsdp --nproc {nproc} --backend gloo --output none
from thunderviz.demos.models import TinyGPT, make_batch
torch.manual_seed(0)
model = fabric.setup(TinyGPT(n_layer=2, d_model=64, n_head=2, block_size=32, vocab_size=128))
x, y = make_batch(batch=2, block_size=32, vocab_size=128, seed=rank, device=device)
loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
fabric.backward(loss)
"""

PIDS = (
    "import json\nm = get_ipython().magics_manager.registry['ThundervizMagics']\n"
    "print('@@pids@@' + json.dumps(m.engine.rank_pids))"
)


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def soak(cells: int, nproc: int, every: int = 5, quiet: bool = False) -> dict[str, list[float]]:
    """Run ``cells`` identical cells in a fresh kernel; return RSS (MiB) per process after each cell."""
    from jupyter_client import KernelManager

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "THUNDERVIZ_PRESTART": "0",
    }
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    series: dict[str, list[float]] = {}
    try:
        kc.wait_for_ready(timeout=120)
        reply, out = execute(kc, "%load_ext thunderviz")
        assert reply["status"] == "ok", out
        kernel_pid = km.provisioner.process.pid
        cell = CELL.format(nproc=nproc)
        for i in range(1, cells + 1):
            reply, out = execute(kc, cell)
            if reply["status"] != "ok":
                raise RuntimeError(f"cell {i} failed:\n{out[-3000:]}")
            if i == 1:
                _, out = execute(kc, PIDS)
                ranks = {int(r): pid for r, pid in json.loads(out.split("@@pids@@", 1)[1]).items()}
            series.setdefault("kernel", []).append(rss_mb(kernel_pid))
            for rank, pid in sorted(ranks.items()):
                series.setdefault(f"rank {rank}", []).append(rss_mb(pid))
            if not quiet and (i == 1 or i % every == 0):
                row = "  ".join(f"{name} {values[-1]:7.1f}" for name, values in series.items())
                print(f"cell {i:4d}: RSS MiB  {row}", flush=True)
        execute(kc, "%thunder_ranks stop")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return series


def growth_per_cell(values: list[float], settle: int) -> float:
    """Least-squares slope (MiB per cell) of RSS after the first ``settle`` cells."""
    ys = values[settle:]
    if len(ys) < 2:
        return 0.0
    n = len(ys)
    mean_x, mean_y = (n - 1) / 2, sum(ys) / n
    return sum((i - mean_x) * (y - mean_y) for i, y in enumerate(ys)) / sum((i - mean_x) ** 2 for i in range(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=100)
    parser.add_argument("--settle", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}", file=sys.stderr)
    series = soak(args.cells, args.nproc)
    print(f"\ngrowth per cell after the first {args.settle} (target <= 1.0 MiB/cell per process):")
    for name, values in series.items():
        slope = growth_per_cell(values, args.settle)
        print(
            f"  {name:8s} {values[0]:7.1f} -> {values[-1]:7.1f} MiB, {slope:+.2f} MiB/cell "
            f"({'ok' if slope <= 1.0 else 'OVER'})"
        )
    print(f"load after: {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
