"""Where a thunder step's time goes against eager's: host (Python, launches) or device (kernels).

Run: python bench/gpu_step_breakdown.py [--cpu]   (on a CUDA machine; --cpu is a small rehearsal)

device_check's step 4 measured our strategies at about 2x eager's step on an H200 with the decided executors
(sdpa, torchcompile, torch). This separates thunder's own cost (one-process ``thunder.jit``, no strategy) from
what our strategies add, and for each variant prints, per steady step: the wall time, the host thread's CPU time
(``time.thread_time``: if it is close to the wall time the step is bound by the host, not the GPU), and the kernels'
summed device time and count from ``torch.profiler`` (one profiled step). GPT d=1024 x 8 layers, bf16, batch 8x1024,
AdamW, world size 1 on NCCL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TORCHCOMPILE = ["sdpa", "torchcompile", "torch"]


def job(rank: int, world: int, device_type: str, only: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Runs in a fresh rank process: each variant built, timed, profiled and freed in turn."""
    import thunder
    import torch
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import TinyGPT, make_batch

    cuda = device_type == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    vocab, batch, block = (32000, 8, 1024) if cuda else (256, 4, 64)
    x, y = make_batch(batch=batch, block_size=block, vocab_size=vocab, device=device)

    def build() -> Any:
        torch.manual_seed(0)
        if cuda:
            return TinyGPT(vocab_size=vocab, block_size=block, d_model=1024, n_layer=8, n_head=16).to(dtype)
        return TinyGPT(vocab_size=vocab, block_size=block, d_model=64, n_layer=2, n_head=4)

    def plain(wrap: Any) -> tuple[Any, Any, Any]:
        model = build().to(device)
        return wrap(model), torch.optim.AdamW(model.parameters(), lr=1e-4), torch.Tensor.backward

    def ours(strategy: Any) -> tuple[Any, Any, Any]:
        fabric = Fabric(accelerator="cuda" if cuda else "cpu", devices=world, strategy=strategy)
        fabric.launch()
        model = fabric.setup_module(build())
        return model, fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-4)), fabric.backward

    variants = {
        "eager": lambda: plain(lambda m: m),
        "thunder.jit defaults (1 process)": lambda: plain(thunder.jit),
        "thunder.jit sdpa,torchcompile,torch (1 process)": lambda: plain(
            lambda m: thunder.jit(m, executors=TORCHCOMPILE)
        ),
        "ours DDP (decided executors)": lambda: ours(ThunderDDPStrategy()),
        "ours FSDP ZERO2 BLOCK (decided executors)": lambda: ours(
            ThunderFSDPStrategy(sharding_strategy="ZERO2", bucketing_strategy="BLOCK")
        ),
    }
    if only:
        variants = {k: v for k, v in variants.items() if k == "eager" or any(o in k for o in only)}

    rows = []
    for name, make in variants.items():
        rows.append({"name": name, **_measure(*make(), x, y, cuda)})
        if cuda:
            torch.cuda.empty_cache()
    return rows


def _measure(model: Any, opt: Any, backward: Any, x: Any, y: Any, cuda: bool) -> dict[str, Any]:
    """Three warm-up steps, ten timed ones (wall, host thread CPU, forward's CPU), one profiled."""
    import torch

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step(times: dict[str, list[float]] | None = None) -> None:
        c0 = time.thread_time()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        forward_cpu = time.thread_time() - c0
        backward(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1)))
        opt.step()
        if times is not None:
            times["fwd"].append(forward_cpu)
            times["cpu"].append(time.thread_time() - c0)

    t0 = time.perf_counter()
    for _ in range(3):
        step()
    sync()
    first = time.perf_counter() - t0
    times: dict[str, list[float]] = {"wall": [], "cpu": [], "fwd": []}
    for _ in range(10):
        sync()
        w0 = time.perf_counter()
        step(times)
        sync()
        times["wall"].append(time.perf_counter() - w0)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        step()
        sync()
    kernels = [e for e in prof.events() if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
    return {
        "first3_s": first,
        "wall_ms": statistics.median(times["wall"]) * 1e3,
        "cpu_ms": statistics.median(times["cpu"]) * 1e3,
        "fwd_cpu_ms": statistics.median(times["fwd"]) * 1e3,
        "kernel_ms": sum(e.device_time_total for e in kernels) / 1e3 if cuda else None,
        "kernels": len(kernels) if cuda else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="a small rehearsal on CPU with gloo")
    parser.add_argument("--only", default="", help="comma-separated name parts of the variants to run (eager always)")
    args = parser.parse_args()
    from thunderviz.pool.spawn import run_ranks

    device_type = "cpu" if args.cpu else "cuda"
    rows = run_ranks(job, device_type, tuple(filter(None, args.only.split(","))), nproc=1, timeout=400)[0]
    eager = rows[0]["wall_ms"]
    for r in rows:
        dev = "" if r["kernel_ms"] is None else f", kernels {r['kernel_ms']:.1f} ms in {r['kernels']} launches"
        print(
            f"- {r['name']}: step {r['wall_ms']:.1f} ms ({r['wall_ms'] / eager:.2f}x eager), host CPU"
            f" {r['cpu_ms']:.1f} ms (forward {r['fwd_cpu_ms']:.1f} ms){dev}; first 3 steps {r['first3_s']:.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
