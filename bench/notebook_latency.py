"""Notebook latency, measured side by side in one run and printed as ratios.

1. First report, pool pre-started: a fresh kernel-like process (IPython shell) runs ``%load_ext thunderviz``, waits
   until the warm pool it starts in the background is ready (as a user reading the notebook would, a few seconds),
   then its first ``%%thunder_fsdp --nproc 2`` cell until the report is back; vs ``torchrun --nproc-per-node 2`` of
   the same code (process launch to exit). Target <= 0.6x.
2. First report, truly cold: the same with ``THUNDERVIZ_PRESTART=0``, so the cell starts the pool itself.
   Target <= 1.0x.
3. Warm: round trip of a small cell on a warm pool, ``%%thunder_fsdp`` vs a bare ipyparallel ``%%px`` of the same
   code on a plain 2-engine cluster. Target <= 1.5x.

Rounds alternate the two variants so machine noise hits both alike; medians are reported.

    .venv/bin/python bench/notebook_latency.py [--rounds 2] [--warm-iters 30]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}

CELL = """\
from thunderviz.demos.models import TinyGPT, make_batch
torch.manual_seed(0)
model = fabric.setup(TinyGPT(n_layer=1, d_model=32, n_head=2, block_size=16, vocab_size=64))
x, y = make_batch(batch=2, block_size=16, vocab_size=64, seed=rank, device=device)
loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
fabric.backward(loss)
"""

# torchrun gets the same cell, preceded by what the rank engine gives a rank for free.
TORCHRUN_SCRIPT = (
    """\
import os, torch, thunder
import torch.distributed as dist
from lightning.fabric import Fabric
from thunderviz.strategies import ThunderFSDPStrategy
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
device = torch.device("cpu")
fabric = Fabric(accelerator="cpu", devices=world_size, strategy=ThunderFSDPStrategy(sharding_strategy="ZERO2"))
fabric.launch()
"""
    + CELL
)

COLD_MAGIC = """\
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "thunderviz")
cell = sys.stdin.read()
warm = shell.magics_manager.registry["ThundervizMagics"].warm
if warm is not None:  # pre-started: the user reads the notebook while the pool starts
    assert warm.wait(), warm.state
start = time.perf_counter()
report = shell.run_cell_magic("thunder_fsdp", "--nproc 2 --backend gloo --output none", cell)
elapsed = time.perf_counter() - start
assert report.bundles, report.problems
shell.run_line_magic("thunder_ranks", "stop")
print(json.dumps({"seconds": elapsed}))
"""

WARM = """\
import json, statistics, sys, time, io, contextlib
import ipyparallel as ipp
from IPython.core.interactiveshell import InteractiveShell
iters = int(sys.argv[1])
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "thunderviz")
shell.run_cell_magic("thunder_fsdp", "--nproc 2 --backend gloo --output none", "pass")
cluster = ipp.Cluster(n=2, controller_ip="127.0.0.1", controller_args=["--HeartMonitor.period=500"], log_level=30)
rc = cluster.start_and_connect_sync(activate=False)
rc.wait_for_engines(2, interactive=False)
view = rc[:]
view.activate()  # registers %%px
view.execute("import torch", block=True)
code = "t = torch.ones(4) * 3\\ns = float(t.sum())\\n"
ours, px = [], []
sink = io.StringIO()
for _ in range(iters):
    with contextlib.redirect_stdout(sink):
        start = time.perf_counter()
        shell.run_cell_magic("thunder_fsdp", "--nproc 2 --backend gloo --output none", code)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        shell.run_cell_magic("px", "--block", code)
        px.append(time.perf_counter() - start)
cluster.stop_cluster_sync()
shell.run_line_magic("thunder_ranks", "stop")
print(json.dumps({"ours": ours, "px": px}))
"""


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no result line in:\n" + text[-2000:])


def first_report(prestart: bool) -> float:
    env = {**ENV, "THUNDERVIZ_PRESTART": "1" if prestart else "0"}
    out = subprocess.run(
        [sys.executable, "-c", COLD_MAGIC],
        input=CELL,
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=600,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return _last_json(out.stdout)["seconds"]


def cold_torchrun(script: str) -> float:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    start = time.perf_counter()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port), script],
        capture_output=True,
        text=True,
        env={**ENV, "OMP_NUM_THREADS": "1"},
        cwd=str(ROOT),
        timeout=600,
    )
    elapsed = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm-iters", type=int, default=30)
    args = parser.parse_args()

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(TORCHRUN_SCRIPT)
        script = f.name
    warm_s, magic_s, torchrun_s = [], [], []
    try:
        for _ in range(args.rounds):
            warm_s.append(first_report(prestart=True))
            magic_s.append(first_report(prestart=False))
            torchrun_s.append(cold_torchrun(script))
    finally:
        os.unlink(script)
    out = subprocess.run(
        [sys.executable, "-c", WARM, str(args.warm_iters)],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=str(ROOT),
        timeout=600,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    warm = _last_json(out.stdout)

    cw, cm, ct = statistics.median(warm_s), statistics.median(magic_s), statistics.median(torchrun_s)
    wo, wp = statistics.median(warm["ours"]), statistics.median(warm["px"])
    rounds = f"torchrun rounds {[round(x, 2) for x in torchrun_s]}"
    print(
        f"first report, pool pre-started at %load_ext: %%thunder_fsdp --nproc 2 {cw:.2f} s vs torchrun "
        f"--nproc-per-node 2 {ct:.2f} s -> {cw / ct:.2f}x (target <= 0.6x; rounds {[round(x, 2) for x in warm_s]}, "
        f"{rounds})"
    )
    print(
        f"first report, truly cold (the cell starts the pool): {cm:.2f} s vs torchrun {ct:.2f} s "
        f"-> {cm / ct:.2f}x (target <= 1.0x; rounds {[round(x, 2) for x in magic_s]})"
    )
    print(
        f"warm round trip: %%thunder_fsdp {wo * 1000:.1f} ms vs %%px {wp * 1000:.1f} ms -> {wo / wp:.2f}x "
        f"(target <= 1.5x; median of {len(warm['ours'])} alternating cells)"
    )


if __name__ == "__main__":
    main()
