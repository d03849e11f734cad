"""Predicted against measured per-rank step peak, every candidate, on 2 and 4 CPU ranks; and the auto strategy's
choice for budgets between measured peaks.

Six models (``thunderviz.demos.memory_runs.MODELS``: two litgpt ``GPT(Config(...))`` shapes, a GPT whose head is tied
to its embedding, a residual MLP, an activation-heavy MLP tower whose forward returns the loss and a small CNN) x
AdamW and SGD with momentum x the five candidates x world sizes 2 and 4. The prediction is ``thunderviz.plan`` on the
meta device in this process; the measurement is each
rank's steady-state step peak with torch's ``MemTracker`` (``thunder.memory.meter``) in real gloo rank processes, the
largest over the ranks. Beside them: what DeepSpeed's model-states formulas (``estimate_zero2_model_states_mem_needs``
/ ``estimate_zero3_model_states_mem_needs`` without offload: 4 bytes per parameter plus 16 (ZeRO-2) or 18 (ZeRO-3)
per parameter over the ranks, ZeRO-3 plus 4 bytes per parameter of the largest layer; DDP as ZeRO-2 on one rank)
and the "4x the parameters" rule (``accelerate estimate-memory``'s training estimate) would have said: they count
model states only.

The auto check: for each model, optimizer and world size, a budget halfway between each two consecutive measured
peaks; the candidate the plan picks for it (``Plan.recommended_for``, what ``ThunderAutoStrategy`` picks) must fit
when measured, and its measured step time is compared with the fastest measured candidate that fits. Step times
are measured side by side (``memory_runs.time_many``): a model's five candidates set up at once in the same ranks
and timed in turns, ``ROUNDS`` rounds of ``STEPS`` steps, the order rotated each round; a candidate's step time is
the median over its timed steps of the slowest rank's wall time. (Timed one after the other, each at its own
moment of the run, candidates differed by the machine's drift, 30% and more on 2 shared cores.) Beside it, the
CPU time of a step summed over the ranks, the cost that does not depend on how the ranks share the cores.

Run: ``.venv/bin/python bench/memory_plan.py [--models a,b] [--worlds 2,4] [--json out.json] [--memory-only]`` (about
an hour on 2 shared CPU cores; ``--memory-only`` skips the timing and the speed check).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

WORLDS = (2, 4)
CANDIDATES = ("ddp", "fsdp-zero2-block", "fsdp-zero2-layer", "fsdp-zero3-block", "fsdp-zero3-layer")
#: Side-by-side timing: rounds of turns, steps per turn (see the module docstring).
ROUNDS = 16
STEPS = 3


def deepspeed_estimate(candidate: str, params: int, largest_layer: int, world: int) -> int:
    """DeepSpeed's model-states estimate for this candidate's ZeRO stage, no offload (see the module docstring)."""
    if candidate == "ddp":
        return 4 * params + 16 * params
    if "zero2" in candidate:
        return 4 * params + 16 * params // world
    return 4 * largest_layer + 18 * params // world


def _param_counts(model: Any) -> tuple[int, int, int]:
    """(parameters, bytes of them, parameters of the largest module owning some directly)."""
    seen: set[int] = set()
    total = nbytes = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
            nbytes += p.numel() * p.element_size()
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, nbytes, largest


def _fmt(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    parser.add_argument("--optimizers", default="adamw,sgd")
    parser.add_argument("--json", default="test-output/memory_plan.json")
    parser.add_argument(
        "--memory-only", action="store_true", help="measure peaks only: no side-by-side timing, no speed check"
    )
    args = parser.parse_args()

    import torch

    from thunderviz.demos.memory_runs import MODELS, measure_many, predict, time_many
    from thunderviz.pool.spawn import run_ranks

    models = args.models.split(",") if args.models else list(MODELS)
    worlds = tuple(int(w) for w in args.worlds.split(","))
    optimizers = args.optimizers.split(",")
    t0 = time.perf_counter()
    plans = {}
    for m in models:
        for o in optimizers:
            t = time.perf_counter()
            plans[m, o] = predict(m, o, worlds)
            print(f"planned {m} / {o} for {worlds}: {time.perf_counter() - t:.1f} s ({plans[m, o].how})", flush=True)
    measured: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    timed: dict[tuple[str, str, str, int], tuple[float, float]] = {}
    for w in worlds:
        # each candidate alone: 5 steps under the memory meter (memory_runs.measure)
        scenarios = [(m, o, c, 5) for m in models for o in optimizers for c in CANDIDATES]
        t = time.perf_counter()
        per_rank = run_ranks(measure_many, scenarios, nproc=w, timeout=7200)
        print(f"measured {len(scenarios)} runs on {w} ranks: {time.perf_counter() - t:.1f} s", flush=True)
        for i, (m, o, c, *_) in enumerate(scenarios):
            measured[m, o, c, w] = [r[i] for r in per_rank]
        if args.memory_only:
            continue
        # the candidates of each model and optimizer side by side
        runs = [(m, o, CANDIDATES, ROUNDS, STEPS) for m in models for o in optimizers]
        t = time.perf_counter()
        per_rank_times = run_ranks(time_many, runs, nproc=w, timeout=7200)
        print(
            f"timed {len(runs)} x {len(CANDIDATES)} candidates side by side on {w} ranks:"
            f" {time.perf_counter() - t:.1f} s",
            flush=True,
        )
        for i, (m, o, *_) in enumerate(runs):
            for c in CANDIDATES:
                steps = [r[i][c] for r in per_rank_times]  # per rank: [(wall, cpu)] per timed step
                wall = statistics.median(max(s[k][0] for s in steps) for k in range(len(steps[0])))
                cpu = statistics.median(sum(s[k][1] for s in steps) for k in range(len(steps[0])))
                timed[m, o, c, w] = (wall, cpu)

    rows = []
    header = (
        f"{'model':13} {'opt':5} {'W':>2} {'candidate':17} {'predicted':>9} {'measured':>9} {'error':>7}"
        f" {'DeepSpeed':>9} {'4x rule':>8} (MiB per rank) {'step':>7} {'CPU':>7} (ms, side by side)"
    )
    print("\n" + header)
    for m in models:
        with torch.device("meta"):
            params, pbytes, largest = _param_counts(MODELS[m].build())
        for o in optimizers:
            for w in worlds:
                for c in CANDIDATES:
                    pred = plans[m, o].candidate(c, w).peak_bytes
                    runs = measured[m, o, c, w]
                    meas = max(r["measured"].peak_bytes for r in runs)
                    err = (pred - meas) / meas
                    ds = deepspeed_estimate(c, params, largest, w)
                    rule = 4 * pbytes
                    step, cpu = timed.get((m, o, c, w), (float("nan"), float("nan")))
                    rows.append(
                        {
                            "model": m,
                            "optimizer": o,
                            "world": w,
                            "candidate": c,
                            "predicted": pred,
                            "measured": meas,
                            "measured_per_rank": [r["measured"].peak_bytes for r in runs],
                            "error": err,
                            "deepspeed": ds,
                            "rule_4x": rule,
                            "step_s": step,
                            "cpu_s": cpu,
                        }
                    )
                    print(
                        f"{m:13} {o:5} {w:>2} {c:17} {_fmt(pred)} {_fmt(meas)} {err * 100:+6.2f}% {_fmt(ds)}"
                        f" {_fmt(rule)} {'':13} {step * 1000:7.1f} {cpu * 1000:7.1f}"
                    )
    worst = max(rows, key=lambda r: abs(r["error"]))
    within = sum(abs(r["error"]) <= 0.10 for r in rows)
    print(
        f"\npredicted within 10% of measured: {within} of {len(rows)}; largest error {worst['error'] * 100:+.2f}%"
        f" ({worst['model']} / {worst['optimizer']} / {worst['candidate']} x{worst['world']})"
    )
    ds_err = max(abs(r["deepspeed"] - r["measured"]) / r["measured"] for r in rows)
    rule_err = max(abs(r["rule_4x"] - r["measured"]) / r["measured"] for r in rows)
    print(
        f"largest error of DeepSpeed's model-states formula: {ds_err * 100:.0f}%; of the 4x rule: {rule_err * 100:.0f}%"
    )

    auto = _auto_check(rows, plans, models, optimizers, worlds)
    over = sum(m > r["predicted"] for r in rows for m in r["measured_per_rank"])
    print(f"rank measurements above the prediction: {over} of {sum(len(r['measured_per_rank']) for r in rows)}")
    speed = (
        "not timed (--memory-only)"
        if args.memory_only
        else f"it was the fastest that fits or within 10% of it {auto['fast']} times (slowest relative to the fastest:"
        f" {auto['worst_ratio']:.2f}x); by CPU time per step {auto['fast_cpu']} times"
        f" (worst {auto['worst_cpu_ratio']:.2f}x)"
    )
    print(
        f"auto strategy: {auto['budgets']} budgets between measured peaks; the choice fit when measured"
        f" {auto['fit']} times of {auto['budgets']}; {speed}"
    )
    for line in auto["misses"]:
        print("  " + line)
    print(f"total {time.perf_counter() - t0:.0f} s")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "auto": auto}, indent=1), encoding="utf-8")
    print(f"wrote {out}")


def _auto_check(rows: list[dict], plans: dict, models: list[str], optimizers: list[str], worlds: tuple) -> dict:
    budgets = fit = fast = fast_cpu = 0
    worst_ratio = worst_cpu_ratio = 1.0
    misses = []
    for m in models:
        for o in optimizers:
            for w in worlds:
                group = [r for r in rows if (r["model"], r["optimizer"], r["world"]) == (m, o, w)]
                peaks = sorted({r["measured"] for r in group})
                for a, b in itertools.pairwise(peaks):
                    budget = (a + b) // 2
                    pick = plans[m, o].with_budget(budget).recommended_for(w)
                    if pick is None:
                        misses.append(f"{m}/{o}/x{w} budget {budget}: the plan found nothing that fits")
                        budgets += 1
                        continue
                    budgets += 1
                    chosen = next(r for r in group if r["candidate"] == pick.name)
                    fitting = [r for r in group if r["measured"] <= budget]
                    fastest = min(r["step_s"] for r in fitting)
                    ratio = chosen["step_s"] / fastest
                    cpu_ratio = chosen["cpu_s"] / min(r["cpu_s"] for r in fitting)
                    worst_ratio = max(worst_ratio, ratio)
                    worst_cpu_ratio = max(worst_cpu_ratio, cpu_ratio)
                    fit += chosen["measured"] <= budget
                    fast += ratio <= 1.10
                    fast_cpu += cpu_ratio <= 1.10
                    if chosen["measured"] > budget or ratio > 1.10:
                        misses.append(
                            f"{m}/{o}/x{w} budget {budget / 2**20:.2f} MiB: chose {pick.name} (measured"
                            f" {chosen['measured'] / 2**20:.2f} MiB, {chosen['step_s'] * 1000:.1f} ms); fastest fitting"
                            f" {fastest * 1000:.1f} ms ({min(fitting, key=lambda r: r['step_s'])['candidate']})"
                        )
    return {
        "budgets": budgets,
        "fit": fit,
        "fast": fast,
        "worst_ratio": worst_ratio,
        "fast_cpu": fast_cpu,
        "worst_cpu_ratio": worst_cpu_ratio,
        "misses": misses,
    }


if __name__ == "__main__":
    main()
