"""A 7B litgpt config planned for 8 and 64 ranks from the meta device: wall time and peak RSS of the planning process.

``Config.from_name("Llama-2-7b-hf")``, one sequence of 4096 tokens per rank, ``bf16-true``, AdamW, CUDA ranks (the
plan answers thunder's executor choices as an Ampere-or-newer GPU would, see ``thunder.memory.meta_world``). Nothing is
allocated: the model is built on the meta device. The 32 blocks are not rehearsed: each candidate is rehearsed cut to
2 and 3 blocks and extrapolated (``thunder.memory.rehearsal``; proven equal on a small model in
``tests/thunder/test_rehearsal.py``). Run: ``.venv/bin/python bench/plan_7b.py``.
"""

from __future__ import annotations

import resource
import sys
import time


def main() -> None:
    import torch
    from litgpt import GPT, Config

    import thunderviz

    t0 = time.perf_counter()
    config = Config.from_name("Llama-2-7b-hf")
    with torch.device("meta"):
        model = GPT(config)
    params = sum(p.numel() for p in model.parameters())
    x = torch.empty(1, config.block_size, dtype=torch.long, device="meta")
    plan = thunderviz.plan(
        model, x, optimizer="adamw", precision="bf16-true", world_sizes=(8, 64), memory_per_rank="80GiB", device="cuda"
    )
    seconds = time.perf_counter() - t0
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"Llama-2-7b-hf: {params / 1e9:.2f} B parameters, {config.n_layer} blocks, sequence {config.block_size}")
    print(plan.table())
    for c in plan.candidates:
        parts = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in c.breakdown.items() if v)
        print(f"  {c.name} x{c.world_size} ({c.memory.phase}): {parts}")
    print(f"planned in {seconds:.1f} s, peak RSS {rss_gib:.2f} GiB (targets: <= 120 s, <= 4 GiB)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
