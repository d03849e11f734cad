"""``run_ranks`` start to finish for a small job: ranks forked from the zygote (``pool/local_ranks.py``) vs spawned
fresh interpreters, measured side by side in one run.

Each variant runs in its own owner process (``THUNDERVIZ_ENGINE_FORK=1`` or ``0``), which calls ``run_ranks`` with a
job that does what a training job's first lines do (``import thunder, lightning.fabric``, join the gloo group, one
``all_reduce``) ``--calls`` times. Per call: wall seconds and the CPU seconds of the rank processes (their rusage,
collected by the owner as children; for forked ranks the zygote's children, so the zygote's CPU is read instead).
The owners alternate round by round so machine noise hits both alike; medians are printed, the first call (which
for the forked variant includes the zygote's own imports) separately.

    .venv/bin/python bench/rank_start.py [--rounds 2] [--calls 3]
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
import json, resource, sys, time
import psutil
from thunderviz.pool.spawn import run_ranks
from thunderviz.pool.zygote import Zygote
from bench.rank_start import job

def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # spawned ranks, once reaped
    zygote = Zygote._shared
    forked = 0.0
    if zygote is not None and zygote.process.poll() is None:  # forked ranks are the zygote's children
        t = psutil.Process(zygote.process.pid).cpu_times()
        forked = t.children_user + t.children_system + t.user + t.system
    return usage.ru_utime + usage.ru_stime + forked

calls = []
for _ in range(int(sys.argv[1])):
    cpu, start = children_cpu(), time.monotonic()
    assert run_ranks(job, nproc=2, timeout=300) == [2.0, 2.0]
    calls.append({"wall": time.monotonic() - start, "cpu": children_cpu() - cpu})
Zygote.shutdown()
print(json.dumps(calls))
"""


def job(rank: int, world_size: int) -> float:
    """A training job's first lines: the libraries, the process group, one collective."""
    import lightning.fabric  # noqa: F401
    import thunder  # noqa: F401
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t)


def _owner(fork: bool, calls: int) -> list[dict]:
    env = {
        **os.environ,
        "THUNDERVIZ_ENGINE_FORK": "1" if fork else "0",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    done = subprocess.run(
        [sys.executable, "-c", OWNER, str(calls)], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"owner (fork={fork}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    runs: dict[bool, list[list[dict]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for fork in (True, False):
            runs[fork].append(_owner(fork, args.calls))

    def median(fork: bool, key: str, first: bool) -> float:
        values = [c[key] for run in runs[fork] for c in (run[:1] if first else run[1:])]
        return statistics.median(values)

    print(f"run_ranks, 2 ranks, gloo, a job importing thunder and Fabric: {args.rounds} rounds x {args.calls} calls")
    print(f"{'':28} {'forked':>9} {'spawned':>9} {'ratio':>7}")
    for label, first in (("first call", True), ("later calls", False)):
        for key, unit in (("wall", "s wall"), ("cpu", "s CPU (ranks)")):
            f, s = median(True, key, first), median(False, key, first)
            print(f"{label + ', ' + unit:28} {f:9.2f} {s:9.2f} {f / s:6.2f}x")


if __name__ == "__main__":
    main()
