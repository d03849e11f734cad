"""Cell latency in a real Jupyter kernel: what a notebook user waits for when re-running or switching a strategy.

Four ``%%thunder_fsdp --nproc 2`` cells on the tutorial's model (TinyGPT 4 blocks, d=128, block 64), in one kernel
and one warm rank pool, each setting up the model and running two training steps:

1. cold: the first ZERO2 cell (the pool already started, so this is thunder's compile, not process start);
2. re-run: the same cell again, unchanged;
3. switch: the same model under ZERO3;
4. changed forward: a subclass whose forward differs (must compile afresh in any reuse scheme).

Printed per cell: the cell's wall time in the kernel and, per rank, the first step (set-up, compile, first step)
and the second (steady) step, so that compile ~= first - steady. This is the compile-reuse work's instrument.

``--case2``: the same four cells in case 2, ``--no-jit``: each cell defines its loss function and jits it itself
(``step = thunder.jit(loss_of)``; a re-run makes a new function object with the same code and a new jitted
object), and calls it with the set-up model.

    .venv/bin/python bench/cell_latency.py [--rounds 1] [--case2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.kernel import execute  # noqa: E402 - needs the repository root on the path

MARK = "@@cell_latency@@"

CELL = """%%thunder_fsdp --nproc 2 --backend gloo --sharding {sharding}{flags}
import json, time
from thunderviz.demos.models import TinyGPT, make_batch
{model_code}
{loss_code}
torch.manual_seed(0)
t0 = time.perf_counter()
model = fabric.setup(Model(n_layer=4, d_model=128, n_head=4, block_size=64, vocab_size=256))
opt = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
x, y = make_batch(batch=8, block_size=64, vocab_size=256, seed=rank, device=device)
times = []
for _ in range(2):
    loss = {loss_call}
    fabric.backward(loss)
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
print("{mark}" + json.dumps({{"rank": rank, "first": times[0], "steady": times[1]}}))
"""

SAME = "Model = TinyGPT"
CHANGED = """class Model(TinyGPT):
    def forward(self, idx):
        return super().forward(idx) * 0.5
"""

#: case 1 (the strategy jits the module) and case 2 (the cell jits its loss function): (flags, loss_code, loss_call)
CASES = {
    1: ("", "", "torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())"),
    2: (
        " --no-jit",
        "import thunder\n"
        "def loss_of(model, x, y):\n"
        "    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())\n"
        "step = thunder.jit(loss_of)",
        "step(model, x, y)",
    ),
}

SCENARIOS = [
    ("cold (ZERO2)", "zero2", SAME),
    ("re-run (ZERO2)", "zero2", SAME),
    ("switch to ZERO3", "zero3", SAME),
    ("changed forward (ZERO3)", "zero3", CHANGED),
]


def run_once(kc: object, case: int) -> list[dict[str, object]]:
    rows = []
    flags, loss_code, loss_call = CASES[case]
    for name, sharding, model_code in SCENARIOS:
        cell = CELL.format(
            sharding=sharding, flags=flags, model_code=model_code, loss_code=loss_code, loss_call=loss_call, mark=MARK
        )
        t0 = time.perf_counter()
        reply, out = execute(kc, cell, timeout=600)
        wall = time.perf_counter() - t0
        if reply["status"] != "ok":
            raise RuntimeError(f"{name} failed:\n{out[-3000:]}")
        ranks = [json.loads(line.split(MARK, 1)[1]) for line in out.splitlines() if MARK in line]
        rows.append({"name": name, "wall": wall, "ranks": sorted(ranks, key=lambda r: r["rank"])})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1, help="kernels to run the four cells in (medians printed)")
    parser.add_argument("--case2", action="store_true", help="each cell jits its own loss function (--no-jit)")
    args = parser.parse_args()
    from jupyter_client import KernelManager

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    rounds = []
    for _ in range(args.rounds):
        km = KernelManager(kernel_name="python3")
        km.start_kernel(env={**env, "THUNDERVIZ_PRESTART": "0"}, cwd=str(ROOT))
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=120)
            # the second starts the rank pool with a cell that compiles nothing, so "cold" below is compile alone
            for code in ("%load_ext thunderviz", "%%thunder_fsdp --nproc 2 --backend gloo --output none\nwarm = 1"):
                reply, out = execute(kc, code, timeout=300)
                if reply["status"] != "ok":
                    raise RuntimeError(f"{code} failed:\n{out[-3000:]}")
            rounds.append(run_once(kc, 2 if args.case2 else 1))
            execute(kc, "%thunder_ranks stop")
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=False)
    cold = None
    print(f"{'cell':26s} {'wall':>7s} {'first step (per rank)':>24s} {'steady':>8s} {'compile ~':>10s} {'vs cold':>8s}")
    for i, (name, _, _) in enumerate(SCENARIOS):
        wall = statistics.median(r[i]["wall"] for r in rounds)
        firsts = [statistics.median(r[i]["ranks"][k]["first"] for r in rounds) for k in range(2)]
        steady = statistics.median(r[i]["ranks"][k]["steady"] for r in rounds for k in range(2))
        compile_s = max(firsts) - steady
        cold = compile_s if cold is None else cold
        print(
            f"{name:26s} {wall:6.1f}s {' / '.join(f'{f:5.1f}s' for f in firsts):>24s} {steady * 1e3:6.0f}ms"
            f" {compile_s:9.1f}s {compile_s / cold:7.2f}x"
        )


if __name__ == "__main__":
    main()
