"""Llama-2-70B planned from this CPU machine for 64 CUDA ranks of 80 GiB, checked against a published run.

torchtitan (``docs/performance.md``) trained Llama 2 70B on 64 A100-80GB with FSDP2, full activation checkpointing and
local batch 2 (sequence 4096); without checkpointing nothing fits. The plan must say the same: its recommendation
fits and checkpoints every block, ZERO3 with checkpointing reaches a micro-batch of 2 or more, and ZERO3 without it
stays within 1.5x of the fused-kernel estimate (Korthikanti et al. 2022: activations ``34 s h L`` + logits ``10 s V``
+ model states ``8 P / W`` + two gathered blocks), which it can only do with the fusion executor the CUDA ranks will
use (``plan``'s ``executors``: assumed on a machine without CUDA).

Not part of the suite: planning every candidate of the 70B takes minutes on this 2-core machine (12 cut rehearsals
and the micro-batch checks; ``bench/plan_frontier.py`` prints the time). Run it with
``THUNDERVIZ_FRONTIER_PLAN=1 pytest tests/strategies/test_plan_frontier.py`` (the bench's ``--test`` does).
"""

from __future__ import annotations

import os
import time

import pytest

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("THUNDERVIZ_FRONTIER_PLAN"),
        reason="minutes of planning: run by bench/plan_frontier.py --test (THUNDERVIZ_FRONTIER_PLAN=1)",
    ),
    pytest.mark.timeout(1800),
]

GIB = 2**30


def test_llama2_70b_on_64_ranks_fits_with_checkpointing_at_micro_batch_two() -> None:
    import torch
    from litgpt import GPT, Config

    import thunderviz

    config = Config.from_name("Llama-2-70b-hf")
    with torch.device("meta"):
        model = GPT(config)
    x = torch.empty(1, 4096, dtype=torch.long, device="meta")
    t0 = time.perf_counter()
    plan = thunderviz.plan(
        model,
        x,
        optimizer="adamw",
        precision="bf16-true",
        world_sizes=(64,),
        memory_per_rank="80GiB",
        device="cuda",
        progress=False,
    )
    seconds = time.perf_counter() - t0
    print(plan.table())
    print(f"planned in {seconds:.0f} s")
    assert "torchcompile" in plan.executors and "no CUDA" in plan.executors, plan.executors
    pick = plan.recommended
    assert pick is not None and pick.fits and pick.activation_checkpointing, plan.table()
    assert not any(c.fits for c in plan.candidates if not c.activation_checkpointing), plan.table()
    z3ac = plan.candidate("fsdp-zero3-block+ac")
    assert z3ac.max_micro_batch is not None and z3ac.max_micro_batch >= 2, plan.table()
    assert z3ac.max_micro_batch_peak is not None and z3ac.max_micro_batch_peak <= 80 * GIB

    s, h, n, v = 4096, config.n_embd, config.n_layer, config.padded_vocab_size
    params = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    fused = 34 * s * h * n + 10 * s * v + 8 * params / 64 + 2 * 2 * block
    z3 = plan.candidate("fsdp-zero3-block")
    assert fused / 1.5 <= z3.peak_bytes <= 1.5 * fused, (z3.peak_bytes / GIB, fused / GIB)
