"""What compile reuse saves ``thunderviz.plan``: every candidate planned with rehearsals that reuse each other's
interpreted traces, against the same plan with reuse off (``THUNDERVIZ_COMPILE_REUSE=0``), side by side.

A rehearsal is mostly thunder's bytecode interpreter, and the rehearsals of one plan repeat it: ZERO2 and ZERO3 (and
BLOCK and LAYER) of one model interpret to the same trace, so do their checkpointed twins, and a plan made again (a
notebook cell re-run) repeats every one. Each run is a fresh process (``python -c``), so nothing
is kept from an earlier one; the modes alternate (on, off, off, on, ...) so that the machine's drift falls on both.
Printed: each model's CPU seconds per plan (user + system; the first plan of the process, and the same plan made
again in it) by mode, and the ratio.

Run: ``.venv/bin/python bench/plan_reuse.py [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name -> (model expression, example input expression): a GPT rehearsed whole, a residual tower rehearsed in cuts
MODELS = {
    "TinyGPT, 2 blocks (rehearsed whole)": ("TinyGPT(n_layer=2, d_model=64)", "torch.randint(0, 256, (4, 64))"),
    "ResidualMLP, 6 blocks (cut to 3 and 4)": ("ResidualMLP(n_layer=6)", "torch.randn(64, 16)"),
}

_RUN = """
import json, os, time, torch
from thunderviz import plan
from thunderviz.demos.models import ResidualMLP, TinyGPT
model, x = {model}, {batch}
times = []
for _ in range(2):
    c0, t0 = os.times(), time.perf_counter()
    made = plan(model, x, world_sizes=(2,), device="cpu", progress=False)
    c1 = os.times()
    times.append((c1.user + c1.system - c0.user - c0.system, time.perf_counter() - t0))
print("PLAN_REUSE", json.dumps({{"times": times, "candidates": len(made.candidates)}}))
"""


def _run(model: str, batch: str, reuse: bool) -> dict:
    env = {**os.environ, "THUNDERVIZ_COMPILE_REUSE": "1" if reuse else "0", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-c", _RUN.format(model=model, batch=batch)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("PLAN_REUSE"))
    return json.loads(line.split(" ", 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs per mode and model (alternating)")
    args = parser.parse_args(argv)
    for name, (model, batch) in MODELS.items():
        cpu: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for r in range(args.rounds):
            for reuse in (True, False) if r % 2 == 0 else (False, True):
                got = _run(model, batch, reuse)
                cpu[reuse].append(tuple(t[0] for t in got["times"]))
                candidates = got["candidates"]
        on = [statistics.median(p[i] for p in cpu[True]) for i in range(2)]
        off = [statistics.median(p[i] for p in cpu[False]) for i in range(2)]
        print(f"{name}: {candidates} candidates, CPU seconds per plan (median of {args.rounds})")
        print(f"  first plan:   reuse {on[0]:6.1f} s, no reuse {off[0]:6.1f} s: {on[0] / off[0]:.2f}x")
        print(f"  made again:   reuse {on[1]:6.1f} s, no reuse {off[1]:6.1f} s: {on[1] / off[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
