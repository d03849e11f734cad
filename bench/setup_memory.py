"""Peak memory of each rank during ``fabric.setup`` with ThunderFSDPStrategy, with and without ``empty_init``.

Run: .venv/bin/python bench/setup_memory.py [--size-gib 4] [--layers 8]
A model of ``--size-gib`` GiB in fp32 made of ``--layers`` equal square Linear layers (jit stays quick), set up on 2
CPU ranks (gloo); each mode runs in its own fresh pair of processes. For each rank it prints the process baseline
(after ``fabric.launch`` and one tiny warm-up model's set-up, before the model), the peak resident memory during
``fabric.setup`` (Linux's VmHWM, reset right before setup through /proc/self/clear_refs) and what is left after
setup, as multiples of the full model.

Without ``empty_init`` every rank first builds the whole model, so its peak is at least 1 x full. With
``fabric.init_module(empty_init=True)`` the model stays on the meta device and setup materializes it one layer at
a time, keeping only this rank's shard. Target with empty_init: peak <= 0.5 x full + largest layer + baseline.
That is also this approach's floor: while a layer's shard is copied out, the layer's full tensor and its new shard
both exist, on top of the shards already kept (0.5 x full - half a layer), so expect the peak within a few MB of
the target (gloo and allocator buffers).

Memory needed: about 2 x size + 2 GiB for the run without empty_init (two full copies); the script refuses to
start when /proc/meminfo's MemAvailable is lower (``--force`` overrides). Develop with ``--size-gib 0.5``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

GiB = 1024**3


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _rss() -> int:
    return _status_kib("VmRSS") * 1024


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (peak RSS) to the current RSS
        return True
    except OSError:
        return False


def _measure(rank: int, world: int, empty_init: bool, layers: int, width: int) -> dict[str, float]:
    import torch
    from lightning.fabric import Fabric
    from torch import nn

    from thunderviz import ThunderFSDPStrategy

    fabric = Fabric(accelerator="cpu", devices=world, strategy=ThunderFSDPStrategy())
    fabric.launch()
    # Warm-up: one tiny model through the same path, so one-time costs (thunder's lazy imports, the sync hook,
    # allocator pools) belong to the process baseline rather than to the model.
    with fabric.init_module(empty_init=True) if empty_init else torch.device("cpu"):
        tiny = nn.Linear(4, 4)
    fabric.setup(tiny)
    torch.manual_seed(0)
    fabric.barrier()
    baseline = _rss()
    with fabric.init_module(empty_init=True) if empty_init else torch.device("cpu"):
        model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    fabric.barrier()
    before = _rss()
    if not _reset_peak():
        raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs is not writable)")
    model = fabric.setup(model)
    peak = _status_kib("VmHWM") * 1024
    fabric.barrier()
    after = _rss()
    local = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"baseline": baseline, "before": before, "peak": peak, "after": after, "local_params": local}


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from thunderviz.pool.spawn import run_ranks

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=4.0, help="full model size in GiB (fp32)")
    parser.add_argument("--layers", type=int, default=8, help="number of equal square Linear layers")
    parser.add_argument("--force", action="store_true", help="run even when too little memory seems available")
    args = parser.parse_args()

    world = 2
    width = int(math.sqrt(args.size_gib * GiB / 4 / args.layers))
    full = args.layers * width * width * 4
    layer = width * width * 4
    available = _mem_available()
    needed = world * full + 2 * GiB
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"setup_memory: model {full / GiB:.2f} GiB fp32 ({args.layers} x Linear({width}, {width}), no bias),"
        f" largest layer {layer / GiB:.3f} GiB; {world} ranks, ThunderFSDPStrategy, gloo"
    )
    print(f"  memory available {available / GiB:.1f} GiB (MemAvailable); load average {load}")
    if available < needed and not args.force:
        sys.exit(
            f"setup_memory: needs about {needed / GiB:.1f} GiB available (2 full copies without empty_init),"
            f" only {available / GiB:.1f} GiB are. Use a smaller --size-gib, or --force."
        )

    target = 0.5 + layer / full
    for empty_init in (False, True):
        results = run_ranks(_measure, empty_init, args.layers, width, nproc=world, timeout=1800)
        print(f"  empty_init={empty_init}:")
        for rank, r in enumerate(results):
            above = r["peak"] - r["baseline"]
            line = (
                f"    rank {rank}: baseline {r['baseline'] / GiB:.2f} GiB,"
                f" before setup +{(r['before'] - r['baseline']) / GiB:.2f},"
                f" peak during setup +{above / GiB:.2f} GiB = {above / full:.3f} x full,"
                f" after setup +{(r['after'] - r['baseline']) / GiB:.2f} GiB"
                f" (local parameters {r['local_params'] / full:.2f} x full)"
            )
            if empty_init:
                line += f"; target <= {target:.3f} x: {'met' if above / full <= target else 'MISSED'}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
