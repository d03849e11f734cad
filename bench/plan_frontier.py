"""Frontier-scale plans from a CPU machine, beside the fused-kernel estimate and published outcomes.

For Llama-2-7B / 13B / 70B at 64 ranks (and Llama-3.1-405B at 64 and 512 with ``--405b``): litgpt's config built on
the meta device, one 4096-token sequence per rank, ``bf16-true``, AdamW, CUDA ranks of 80 GiB (the plan assumes the
executors the CUDA ranks will decide: ``thunderviz.plan``'s ``executors``). Each model is planned in a fresh
process, so its planning time and peak RSS are its own. Printed per candidate: predicted peak, ``max_micro_batch``
(rehearsed for the recommended candidate, estimated for the others), bytes sent per step; per model: planning time
and RSS, and

- the fused-kernel estimate (what a run with flash attention and fused kernels holds, Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models"): activations ``34 s h L`` bytes + logits
  ``10 s V`` + ZERO3 model states ``8 P / W`` (bf16 parameters and gradients, two bf16 AdamW moments) + two
  gathered blocks (bf16); with per-block checkpointing ``2 s h L`` (each block's bf16 input) + one block's
  ``34 s h``;
- torchtitan's published outcomes (``docs/performance.md``: FSDP2 on 64 A100-80GB, sequence 4096). Their runs keep
  float32 parameters and AdamW state under bf16 mixed precision (16 bytes per parameter against bf16-true's 8), so
  a plan that fits with little room to spare can still be an OOM there.

Planning time measured here (2026-12-06, 2 cores): Llama-2-7B 161 s, 13B 140 s, 70B 171 s, 405B at 64 and 512 ranks
252 s (at 512 alone 178 s); peak RSS 0.85-0.93 GiB. Run: ``.venv/bin/python bench/plan_frontier.py [--405b]`` (about
13 minutes in all here); ``--test`` runs
the 70B check that is not part of the suite (``tests/strategies/test_plan_frontier.py``) instead.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

GIB = 2**30
SEQUENCE = 4096
MODELS = {
    "Llama-2-7b-hf": (64,),
    "Llama-2-13b-hf": (64,),
    "Llama-2-70b-hf": (64,),
}
LARGE = {"Llama-3.1-405B": (64, 512)}

#: torchtitan docs/performance.md, FSDP2 on 64 A100-80GB (Llama 2, sequence 4096): (local batch, AC, outcome)
PUBLISHED = {
    "Llama-2-13b-hf": [(2, "none", "fits, 2162 tokens/s/GPU"), (2, "selective", "fits")],
    "Llama-2-70b-hf": [
        (2, "full", "fits, 353 tokens/s/GPU"),
        (1, "selective op", "fits, 355 tokens/s/GPU"),
        (2, "selective layer", "OOM"),
        (2, "selective op", "OOM"),
    ],
    "Llama-3.1-405B": [(2, "full", "1D FSDP2 OOM on 128 H100-94GB (only 2D FSDP+TP reported)")],
}


def fused_estimate(config, world: int, checkpointed: bool) -> float:
    """The fused-kernel estimate of a ZERO3 rank's peak in bytes (module docstring)."""
    s, h, n, v = SEQUENCE, config.n_embd, config.n_layer, config.padded_vocab_size
    import torch
    from litgpt import GPT

    with torch.device("meta"):
        model = GPT(config)
    params = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    activations = (2 * s * h * n + 34 * s * h) if checkpointed else 34 * s * h * n
    return activations + 10 * s * v + 8 * params / world + 2 * 2 * block


def one(name: str, worlds: tuple[int, ...]) -> dict:
    import torch
    from litgpt import GPT, Config

    import thunderviz

    config = Config.from_name(name)
    with torch.device("meta"):
        model = GPT(config)
    x = torch.empty(1, SEQUENCE, dtype=torch.long, device="meta")
    t0 = time.perf_counter()
    plan = thunderviz.plan(
        model,
        x,
        optimizer="adamw",
        precision="bf16-true",
        world_sizes=worlds,
        memory_per_rank="80GiB",
        device="cuda",
        progress=False,
    )
    seconds = time.perf_counter() - t0
    pick = plan.recommended
    return {
        "name": name,
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": seconds,
        "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "executors": plan.executors,
        "recommended": f"{pick.name} x{pick.world_size}" if pick else None,
        "fused": {w: [fused_estimate(config, w, False), fused_estimate(config, w, True)] for w in worlds},
        "candidates": [
            {
                "name": c.name,
                "world": c.world_size,
                "peak": c.peak_bytes,
                "micro": c.max_micro_batch,
                "micro_checked": c.max_micro_batch_peak is not None,
                "sent": c.comm_bytes,
                "recompute_s": c.recompute_seconds,
            }
            for c in plan.candidates
        ],
    }


def show(r: dict) -> None:
    print(f"\n{r['name']}: {r['params'] / 1e9:.1f} B parameters; {r['executors']}")
    print(f"  planned in {r['seconds']:.0f} s, peak RSS {r['rss_gib']:.2f} GiB; recommended: {r['recommended']}")
    for w, (plain, ac) in r["fused"].items():
        print(f"  fused-kernel estimate x{w} (ZERO3): {plain / GIB:.1f} GiB, with per-block AC {ac / GIB:.1f} GiB")
    print(f"  {'candidate':<24}{'ranks':>6}{'peak GiB':>10}{'max micro-batch':>17}{'sent GiB/step':>15}")
    for c in r["candidates"]:
        micro = "-" if c["micro"] is None else (f"{c['micro']}" if c["micro_checked"] else f">={c['micro']} (est.)")
        print(f"  {c['name']:<24}{c['world']:>6}{c['peak'] / GIB:>10.1f}{micro!s:>17}{c['sent'] / GIB:>15.1f}")
    for batch, ac, outcome in PUBLISHED.get(r["name"], []):
        print(f"  published (torchtitan): local batch {batch}, AC {ac}: {outcome}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2], tuple(int(w) for w in sys.argv[3].split(",")))))
        return
    if "--test" in sys.argv:
        import os
        from pathlib import Path

        test = Path(__file__).resolve().parents[1] / "tests" / "strategies" / "test_plan_frontier.py"
        env = {**os.environ, "THUNDERVIZ_FRONTIER_PLAN": "1"}
        sys.exit(
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", str(test)], env=env, check=False).returncode
        )
    models = dict(MODELS, **(LARGE if "--405b" in sys.argv else {}))
    for name, worlds in models.items():
        got = subprocess.run(
            [sys.executable, __file__, "--one", name, ",".join(map(str, worlds))],
            capture_output=True,
            text=True,
            check=False,
        )
        if got.returncode:
            print(f"\n{name}: planning failed\n{got.stderr[-2000:]}")
            continue
        show(json.loads(got.stdout.strip().splitlines()[-1]))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
