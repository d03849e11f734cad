"""Restarting a local pool (what the next cell after a dead rank, or ``%thunder_ranks restart``, waits for): engines
forked from the zygote (``thunderviz/pool/zygote.py``) vs fresh interpreters, measured side by side in one run.

Each variant runs in its own owner process (``THUNDERVIZ_ENGINE_FORK=1`` or ``0``, decided when its pool starts):
a 2-rank gloo pool starts, runs a cell, then restarts ``--restarts`` times. Per restart: wall seconds from the
old engines' close to the new ranks in their process group, and the CPU seconds the new engine processes spent
until then (psutil, by pid: for a forked engine that is from its fork on, for a fresh one its interpreter start and
imports too). The owners alternate round by round so machine noise hits both alike; medians are printed, and
the first start (which for the forked variant includes the zygote's own imports) separately.

    .venv/bin/python bench/engine_restart.py [--rounds 2] [--restarts 3]
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

OWNER = """
import json, sys, time
import psutil
from thunderviz.pool.engine import RankEngine
from thunderviz.pool.zygote import Zygote

def engine_cpu(engine):
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in engine.rank_pids.values())

start = time.monotonic()
engine = RankEngine.start(2, backend="gloo", timeout=30, on_output=lambda *a: None)
zygote = Zygote._shared  # the forked variant's: its imports count towards the first start
zygote_cpu = sum(psutil.Process(zygote.process.pid).cpu_times()[:2]) if zygote is not None else 0.0
first = {"wall": time.monotonic() - start, "cpu": engine_cpu(engine) + zygote_cpu}
engine.run("x = rank", collect=False)
restarts = []
for _ in range(int(sys.argv[1])):
    start = time.monotonic()
    engine.cluster.restart()
    engine._set_up()
    restarts.append({"wall": time.monotonic() - start, "cpu": engine_cpu(engine)})
    engine.run("x = rank", collect=False)
engine.stop()
Zygote.shutdown()
print(json.dumps({"first": first, "restarts": restarts}))
"""


def _owner(fork: bool, restarts: int) -> dict:
    env = {
        **os.environ,
        "THUNDERVIZ_ENGINE_FORK": "1" if fork else "0",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    done = subprocess.run(
        [sys.executable, "-c", OWNER, str(restarts)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the owner ({'forked' if fork else 'fresh'}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--restarts", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {
        v: {"first wall": [], "first cpu": [], "wall": [], "cpu": []} for v in ("forked", "fresh")
    }
    for _ in range(args.rounds):
        for variant in ("forked", "fresh"):
            run = _owner(variant == "forked", args.restarts)
            results[variant]["first wall"].append(run["first"]["wall"])
            results[variant]["first cpu"].append(run["first"]["cpu"])
            results[variant]["wall"] += [r["wall"] for r in run["restarts"]]
            results[variant]["cpu"] += [r["cpu"] for r in run["restarts"]]
    med = {v: {k: statistics.median(xs) for k, xs in r.items()} for v, r in results.items()}
    print(f"{args.rounds} rounds x {args.restarts} restarts, 2 ranks on gloo, medians (ratio forked / fresh)")
    print("| | forked from the zygote | fresh interpreters | ratio |")
    print("|---|---|---|---|")
    rows = [
        ("restart, wall s", "wall"),
        ("restart, engines' CPU s (both)", "cpu"),
        ("first start, wall s", "first wall"),
        ("first start, engines' and zygote's CPU s", "first cpu"),
    ]
    for label, key in rows:
        forked, fresh = med["forked"][key], med["fresh"][key]
        print(f"| {label} | {forked:.2f} | {fresh:.2f} | {forked / fresh:.2f}x |")


if __name__ == "__main__":
    main()
