"""Shared by the strategy benchmarks: interleaved step timing inside rank processes.

Both variants run in the same pair of processes, alternating step by step, so machine noise hits both alike; the
median of per-round ratios is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from thunderviz.demos.models import TinyGPT, make_batch


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def fresh_gpt() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(n_layer=4, d_model=128)


def batch_for(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return make_batch(batch=8, block_size=64, seed=1000 * step + rank)


def interleave(steps: dict[str, Callable[[int], None]], *, warmup: int, rounds: int) -> dict[str, list[float]]:
    """Time each variant's step ``rounds`` times, alternating variants every round; returns seconds per step."""
    import torch.distributed as dist

    for i in range(warmup):
        for fn in steps.values():
            fn(i)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(rounds):
        order = list(steps.items()) if i % 2 == 0 else list(reversed(steps.items()))
        for name, fn in order:
            dist.barrier()
            t0 = time.perf_counter()
            fn(warmup + i)
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
    return times


def report(title: str, times: dict[str, list[float]], numerator: str, denominator: str, target: str) -> str:
    ratios = [a / b for a, b in zip(times[numerator], times[denominator], strict=True)]
    lines = [title]
    for name, ts in times.items():
        lines.append(f"  {name:<40s} median {statistics.median(ts) * 1e3:8.1f} ms/step over {len(ts)} steps")
    lines.append(
        f"  ratio {numerator} / {denominator}: median {statistics.median(ratios):.3f}"
        f" (min {min(ratios):.3f}, max {max(ratios):.3f}); target {target}"
    )
    return "\n".join(lines)


def main(bench: Callable[..., str], description: str | None) -> None:
    """Command line shared by the strategy benchmarks: run ``bench`` on 2 ranks for FSDP, then DDP."""
    from thunderviz.pool.spawn import run_ranks

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    for kind in ("fsdp", "ddp"):
        print(run_ranks(bench, kind, args.warmup, args.rounds, timeout=1800)[0], flush=True)
