"""Step time of case 2 (the user jits a training function that takes the model; ``ThunderFSDPStrategy(jit=False)``)
vs case 1 (the strategy jits the module), for FSDP and DDP.

Run: .venv/bin/python bench/case2_overhead.py [--rounds N]
Tiny GPT (4 blocks, d=128), batch 8x64, 2 CPU ranks on gloo; both variants in the same processes, steps
interleaved. Target: case 2 / case 1 <= 1.05.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch


def _bench(rank: int, world: int, kind: str, warmup: int, rounds: int) -> str:
    import thunder
    from _steps import batch_for, fresh_gpt, gpt_loss, interleave, report
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy

    cls = ThunderFSDPStrategy if kind == "fsdp" else ThunderDDPStrategy
    fabric1 = Fabric(accelerator="cpu", devices=world, strategy=cls())
    fabric1.launch()
    case1 = fabric1.setup_module(fresh_gpt())
    opt1 = fabric1.setup_optimizers(torch.optim.SGD(case1.parameters(), lr=1e-3))

    fabric2 = Fabric(accelerator="cpu", devices=world, strategy=cls(jit=False))
    fabric2.launch()
    case2 = fabric2.setup_module(fresh_gpt())
    opt2 = fabric2.setup_optimizers(torch.optim.SGD(case2.parameters(), lr=1e-3))
    loss_of = thunder.jit(lambda model, x, y: gpt_loss(model(x), y))

    def step1(i: int) -> None:
        x, y = batch_for(rank, i)
        opt1.zero_grad()
        fabric1.backward(gpt_loss(case1(x), y))
        opt1.step()

    def step2(i: int) -> None:
        x, y = batch_for(rank, i)
        opt2.zero_grad()
        fabric2.backward(loss_of(case2, x, y))
        opt2.step()

    times = interleave(
        {"case 2 (user jits the loss function)": step2, "case 1 (strategy jits the module)": step1},
        warmup=warmup,
        rounds=rounds,
    )
    return report(
        f"{kind.upper()} on {world} ranks:",
        times,
        "case 2 (user jits the loss function)",
        "case 1 (strategy jits the module)",
        "<= 1.05",
    )


if __name__ == "__main__":
    from _steps import main

    main(_bench, __doc__)
