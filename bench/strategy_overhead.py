"""Step time of ThunderFSDPStrategy / ThunderDDPStrategy vs hand-written thunder.distributed.fsdp/ddp(thunder.jit(m)).

Run: .venv/bin/python bench/strategy_overhead.py [--rounds N]
Tiny GPT (4 blocks, d=128), batch 8x64, 2 CPU ranks on gloo, 1 thread per rank; both variants in the same
processes, steps interleaved. Target: ratio 1.00 ± 0.03.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch


def _bench(rank: int, world: int, kind: str, warmup: int, rounds: int) -> str:
    import thunder
    import thunder.distributed as td
    from _steps import batch_for, fresh_gpt, gpt_loss, interleave, report
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy

    strategy = ThunderFSDPStrategy() if kind == "fsdp" else ThunderDDPStrategy()
    fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
    fabric.launch()
    ours = fabric.setup_module(fresh_gpt())
    ours_opt = fabric.setup_optimizers(torch.optim.SGD(ours.parameters(), lr=1e-3))

    jitted = thunder.jit(fresh_gpt())
    theirs = td.fsdp(jitted, device=torch.device("cpu"), broadcast_from=0) if kind == "fsdp" else td.ddp(jitted)
    theirs_opt = torch.optim.SGD(theirs.parameters(), lr=1e-3)

    def ours_step(i: int) -> None:
        x, y = batch_for(rank, i)
        ours_opt.zero_grad()
        fabric.backward(gpt_loss(ours(x), y))
        ours_opt.step()

    def theirs_step(i: int) -> None:
        x, y = batch_for(rank, i)
        theirs_opt.zero_grad()
        gpt_loss(theirs(x), y).backward()
        theirs_opt.step()

    hand = f"thunder.distributed.{kind}(thunder.jit(m))"
    times = interleave({f"Thunder{kind.upper()}Strategy": ours_step, hand: theirs_step}, warmup=warmup, rounds=rounds)
    return report(f"{kind.upper()} on {world} ranks:", times, f"Thunder{kind.upper()}Strategy", hand, "1.00 ± 0.03")


if __name__ == "__main__":
    from _steps import main

    main(_bench, __doc__)
