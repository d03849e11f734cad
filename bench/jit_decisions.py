"""How thunder.jit compiles under our strategies: the executor decision's numbers, side by side, on CPU ranks.

Run: .venv/bin/python bench/jit_decisions.py [--worlds 1,2] [--rounds N] [--warmup N]

Tiny GPT (4 blocks, d=128), batch 8x64 per rank, AdamW, one thread per rank, gloo. For each world size every variant
lives in the same rank processes and their steady steps are interleaved round by round (machine noise hits all
alike):

- world 1: eager, torch.compile, one-process ``thunder.jit`` with thunder's defaults and with
  ``sdpa, torchcompile, torch`` (thunder's own executor cost, apart from anything we add), each also with thunder's
  experimental compile option ``auto_recompute_intermediates=True``;
- every world: ``ThunderDDPStrategy`` and ``ThunderFSDPStrategy`` ZERO2 / ZERO3 BLOCK with the executors our decision
  picks (on CPU: thunder's defaults) and with litgpt's list (``sdpa, torchcompile, nvfuser, torch``; nvFuser is left
  out here, recorded);
- world 2: the peers a user would pick instead: torch DDP, FSDP2 (``fully_shard`` per block, then the root) with
  ``reshard_after_forward`` False / True.

Printed per variant: the first step (build, compile, first step: what a notebook cell waits for), the steady step
(median wall and CPU time), the peak per rank measured by torch's ``MemTracker`` around one steady step, and what
forward saves for backward (thunder variants; what a fusion executor's rematerialization changes). ``MemTracker``
cannot measure inductor-compiled code (its dispatch mode makes the compiled region run another way: 153 MiB and 7x
the step time measured for the one-process torchcompile row), so those peaks print as ``n/a``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch

TORCHCOMPILE = ["sdpa", "torchcompile", "torch"]
LITGPT = ["sdpa", "torchcompile", "nvfuser", "torch"]


def _peak_bytes(step: Callable[[int], None], i: int, module: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(module, opt)
    with tracker:
        step(i)
    return int(sum(snap.get("Total", 0) for snap in tracker.get_tracker_snapshot("peak").values()))


def _saved_bytes(jitted: Any) -> int | None:
    import thunder

    from thunderviz.thunder import compile_state

    try:
        fw = thunder.last_traces(jitted)[-1]
    except Exception:
        return None
    return sum(b for *_, b in compile_state.saved_for_backward(fw))


def _variants(rank: int, world: int) -> dict[str, Callable[[], dict[str, Any]]]:
    """name -> a builder returning {step, module, opt, jitted, inductor}: built (and compiled) when the bench says."""
    import thunder
    from _steps import batch_for, fresh_gpt, gpt_loss
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.thunder.modules import user_module

    def plain(model: Any, forward: Any, inductor: bool) -> dict[str, Any]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(i: int) -> None:
            x, y = batch_for(rank, i)
            opt.zero_grad(set_to_none=True)
            gpt_loss(forward(x), y).backward()
            opt.step()

        return {"step": step, "module": model, "opt": opt, "jitted": forward, "inductor": inductor}

    def ours(strategy: Any, inductor: bool) -> dict[str, Any]:
        fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
        fabric.launch()
        model = fabric.setup_module(fresh_gpt())
        opt = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))

        def step(i: int) -> None:
            x, y = batch_for(rank, i)
            opt.zero_grad(set_to_none=True)
            fabric.backward(gpt_loss(model(x), y))
            opt.step()

        executors = strategy.decisions[-2].executors
        return {
            "step": step,
            "module": user_module(model),
            "opt": opt.optimizer,
            "jitted": model._forward_module,
            "inductor": inductor,
            "executors": ",".join(executors),
        }

    out: dict[str, Callable[[], dict[str, Any]]] = {}
    if world == 1:
        out["eager"] = lambda: (lambda m: plain(m, m, False))(fresh_gpt())
        out["torch.compile"] = lambda: (lambda m: plain(m, torch.compile(m), True))(fresh_gpt())
        out["thunder.jit defaults"] = lambda: (lambda m: plain(m, thunder.jit(m), False))(fresh_gpt())
        out["thunder.jit sdpa,torchcompile"] = lambda: (
            lambda m: plain(m, thunder.jit(m, executors=TORCHCOMPILE), True)
        )(fresh_gpt())
        # thunder's experimental compile option for memory (recompute intermediates instead of saving them)
        out["thunder.jit defaults, auto_recompute"] = lambda: (
            lambda m: plain(m, thunder.jit(m, auto_recompute_intermediates=True), False)
        )(fresh_gpt())
        out["thunder.jit torchcompile, auto_recompute"] = lambda: (
            lambda m: plain(m, thunder.jit(m, executors=TORCHCOMPILE, auto_recompute_intermediates=True), True)
        )(fresh_gpt())
    out["ours DDP (decided)"] = lambda: ours(ThunderDDPStrategy(), False)
    out["ours DDP litgpt list"] = lambda: ours(ThunderDDPStrategy(executors=LITGPT), True)
    for sharding in ("ZERO2", "ZERO3"):
        out[f"ours FSDP {sharding} BLOCK (decided)"] = lambda s=sharding: ours(
            ThunderFSDPStrategy(sharding_strategy=s), False
        )
        out[f"ours FSDP {sharding} BLOCK litgpt list"] = lambda s=sharding: ours(
            ThunderFSDPStrategy(sharding_strategy=s, executors=LITGPT), True
        )
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.nn.parallel import DistributedDataParallel

        def fsdp2(reshard: bool) -> dict[str, Any]:
            mesh = init_device_mesh("cpu", (world,))
            m = fresh_gpt()
            for block in m.blocks:
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
            return plain(m, m, False)

        out["torch DDP"] = lambda: (lambda d: plain(d, d, False))(DistributedDataParallel(fresh_gpt()))
        out["torch FSDP2 reshard=False"] = lambda: fsdp2(False)
        out["torch FSDP2 reshard=True"] = lambda: fsdp2(True)
    return out


def _bench(rank: int, world: int, warmup: int, rounds: int) -> dict[str, Any]:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    built: dict[str, dict[str, Any]] = {}
    first: dict[str, float] = {}
    for name, build in _variants(rank, world).items():
        dist.barrier()
        t0 = time.perf_counter()
        built[name] = build()
        built[name]["step"](0)
        first[name] = time.perf_counter() - t0
    for i in range(1, warmup + 1):
        for v in built.values():
            v["step"](i)
    wall: dict[str, list[float]] = {k: [] for k in built}
    cpu: dict[str, list[float]] = {k: [] for k in built}
    for r in range(rounds):
        order = list(built.items()) if r % 2 == 0 else list(reversed(built.items()))
        for name, v in order:
            dist.barrier()
            w0, c0 = time.perf_counter(), time.process_time()
            v["step"](warmup + 1 + r)
            dist.barrier()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    rows = {}
    for name, v in built.items():
        peak = None if v["inductor"] else _peak_bytes(v["step"], warmup + rounds + 1, v["module"], v["opt"])
        rows[name] = {
            "first_s": first[name],
            "wall_ms": statistics.median(wall[name]) * 1e3,
            "cpu_ms": statistics.median(cpu[name]) * 1e3,
            "peak_mib": None if peak is None else peak / 2**20,
            "saved_mib": None if (s := _saved_bytes(v["jitted"])) is None else s / 2**20,
            "executors": v.get("executors", ""),
        }
    return rows


def _table(world: int, per_rank: list[dict[str, Any]]) -> str:
    r0 = per_rank[0]
    base = "eager" if world == 1 else "torch DDP"
    lines = [
        f"world {world} (gloo, 1 thread per rank; rank 0's times, peaks: max over ranks)",
        f"  {'variant':<36} {'first step':>10} {'step wall':>10} {'step CPU':>9} {'vs ' + base:>12}"
        f" {'peak/rank':>10} {'saved bwd':>10}  executors",
    ]
    for name, row in r0.items():
        peaks = [r[name]["peak_mib"] for r in per_rank]
        peak = "n/a" if any(p is None for p in peaks) else f"{max(peaks):.2f} MiB"
        saved = "" if row["saved_mib"] is None else f"{row['saved_mib']:.2f} MiB"
        ratio = row["wall_ms"] / r0[base]["wall_ms"]
        lines.append(
            f"  {name:<36} {row['first_s']:>9.1f}s {row['wall_ms']:>8.1f}ms {row['cpu_ms']:>7.1f}ms {ratio:>11.2f}x"
            f" {peak:>10} {saved:>10}  {row['executors']}"
        )
    return "\n".join(lines)


def main() -> None:
    from thunderviz.pool.spawn import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="1,2", help="comma-separated world sizes (default 1,2)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    for world in (int(w) for w in args.worlds.split(",")):
        print(_table(world, run_ranks(_bench, args.warmup, args.rounds, nproc=world, timeout=1800)), flush=True)


if __name__ == "__main__":
    main()
