"""Does observing a run change what it reports? Step times a ``--timeline`` cell reports against the same loop run
without thunderviz observing it, side by side in one pair of rank processes; never asserted.

Run: .venv/bin/python bench/observed_steps.py [--rounds N]

Two loops of 9 optimizer steps on 2 gloo ranks, the tutorial's model (TinyGPT, 4 blocks, d=32, batch 2x16):

- ``ddp``: the tutorial's timed DDP loop (``ThunderDDPStrategy``, SGD lr 0.1, one batch);
- ``zero3``: ``ThunderFSDPStrategy(sharding_strategy="ZERO3")`` with AdamW, a new batch each step.

Each round runs three variants of the loop in turns (the order rotated each round), after compiling once:

- ``unobserved``: the loop alone, each step timed from one ``optimizer.step()``'s end to the next's;
- ``observed``: what a ``--timeline --steps 4`` cell runs on every rank (``rank.timeline`` and
  ``rank.memory``, as ``cell_hooks`` calls them): the profiler records steps 2-5 (drawn), step 6 lets the
  ranks settle, the recorder times steps 7-8 with the profiler stopped (the step time reported), the memory meter
  measures step 9;
- ``overlapping``: as before they were kept apart: the meter on steps 2-3, the step time read from the drawn steps.

Printed per round and as medians: the reported step time (``TimelineAnalysis.step_time``: the median over its steps
of the slowest rank) over the same statistic of the unobserved loop on the same step numbers (target: within 10%,
ratio <= 1.10); the drawn, profiled steps against the same unobserved steps (what recording every op costs); and
what the overlapping arrangement reported. The load is printed before and after: the ratios are side by side, the
milliseconds are not comparable between runs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS = 9
#: the timeline's ``--steps``: it keeps steps 2 to KEPT + 1
KEPT = 4
MODEL = {"n_layer": 4, "d_model": 32, "n_head": 2, "block_size": 16, "vocab_size": 64}


def _loop(kind: str, rank: int) -> tuple[Any, Any]:
    import torch
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import TinyGPT, make_batch

    strategy = ThunderDDPStrategy() if kind == "ddp" else ThunderFSDPStrategy(sharding_strategy="ZERO3")
    fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    model = fabric.setup(TinyGPT(**MODEL))
    params = model.parameters()
    opt = fabric.setup_optimizers(torch.optim.SGD(params, lr=0.1) if kind == "ddp" else torch.optim.AdamW(params))
    x, y = make_batch(batch=2, block_size=16, vocab_size=64, seed=rank)

    def run(n: int) -> list[float]:
        """``n`` steps; the wall time of each (from the previous step's end; the first from the call)."""
        nonlocal x, y
        ends = [time.perf_counter()]
        for step in range(n):
            if kind != "ddp":
                x, y = make_batch(batch=2, block_size=16, vocab_size=64, seed=10 * step + rank)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()
            ends.append(time.perf_counter())
        return [(b - a) * 1000 for a, b in itertools.pairwise(ends)]

    return fabric, run


def observed_steps(rank: int, world_size: int, kind: str, rounds: int) -> list[dict[str, Any]]:
    """Every round's three variants on this rank: step times, and for the observed ones this rank's timeline."""
    import torch.distributed as dist

    from thunderviz.rank import memory as memory_measure
    from thunderviz.rank.timeline import finish_cell_recording, start_cell_recording, stop_cell_recording

    fabric, run = _loop(kind, rank)
    run(3)  # compile, and the optimizer's state

    def observed(meter_after_timeline: bool) -> dict[str, Any]:
        rec, problems = start_cell_recording(KEPT, fabric=fabric)
        memory_measure.cell_started(lambda: {"fabric": fabric}, KEPT if meter_after_timeline else 0)
        times = run(STEPS)
        problems += stop_cell_recording(rec, failed=False)
        memory, _ = memory_measure.cell_finished()
        part = finish_cell_recording(rec, failed=False, problems=problems)
        return {"ms": times, "timeline": part.get("timeline"), "memory_steps": memory.steps, "problems": problems}

    variants = {
        "unobserved": lambda: {"ms": run(STEPS)},
        "observed": lambda: observed(True),
        "overlapping": lambda: observed(False),
    }
    out = []
    names = list(variants)
    for r in range(rounds):
        got = {}
        for name in names[r % 3 :] + names[: r % 3]:
            dist.barrier()
            got[name] = variants[name]()
        out.append(got)
    return out


def _reported(per_rank: list[dict[str, Any]]) -> tuple[float, tuple[int, ...], bool, Any]:
    """What the report says: the run's step time (ms), the steps it is the median over, whether they were timed
    unprofiled, and the merged timeline."""
    from thunderviz.timeline.model import Timeline

    timeline = Timeline.from_ranks([r["timeline"] for r in per_rank])
    analysis = timeline.analysis()
    return analysis.step_time() / 1000, *analysis.timed_steps(), timeline


def _same_statistic(per_rank: list[dict[str, Any]], steps: tuple[int, ...]) -> float:
    """The report's statistic on a loop's own clock: the median over ``steps`` of the slowest rank's step."""
    return statistics.median(max(r["ms"][n - 1] for r in per_rank) for n in steps)


def _profiled(timeline: Any) -> float:
    """The same statistic over the drawn steps, which torch.profiler recorded (what a report said before)."""
    return statistics.median(timeline.analysis()._step_times().values()) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from thunderviz.pool.spawn import run_ranks

    print(f"load before: {os.getloadavg()}")
    for kind in ("ddp", "zero3"):
        ranks = run_ranks(observed_steps, kind, args.rounds, nproc=2, timeout=3600)
        ratios: dict[str, list[float]] = {"reported": [], "drawn": [], "as before": []}
        for r in range(args.rounds):
            per = {name: [ranks[k][r][name] for k in range(2)] for name in ranks[0][r]}
            ms, steps, unprofiled, timeline = _reported(per["observed"])
            ratios["reported"].append(ms / _same_statistic(per["unobserved"], steps))
            ratios["drawn"].append(_profiled(timeline) / _same_statistic(per["unobserved"], tuple(timeline.steps)))
            _, _, _, before = _reported(per["overlapping"])
            ratios["as before"].append(_profiled(before) / _same_statistic(per["unobserved"], tuple(before.steps)))
            print(
                f"{kind} round {r + 1}: reports {ms:.1f} ms over steps {list(steps)}"
                f" ({'unprofiled' if unprofiled else 'profiled'}), {ratios['reported'][-1]:.2f}x unobserved;"
                f" drawn steps {list(timeline.steps)} {ratios['drawn'][-1]:.2f}x; memory on steps"
                f" {list(per['observed'][0]['memory_steps'])}; as before (memory on steps"
                f" {list(per['overlapping'][0]['memory_steps'])}, time from the drawn steps)"
                f" {ratios['as before'][-1]:.2f}x",
                flush=True,
            )
        med = {k: statistics.median(v) for k, v in ratios.items()}
        print(
            f"{kind}: reported / unobserved step time, median of {args.rounds} rounds: {med['reported']:.2f}x"
            f" (target <= 1.10); the drawn, profiled steps {med['drawn']:.2f}x; as before {med['as before']:.2f}x",
            flush=True,
        )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    main()
