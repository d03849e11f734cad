"""A training script as a user would launch it with torchrun; for each strategy name given, one training step,
and what the test checks in OUT_DIR/<name>-rank-N.json (one launch for all names: the first Fabric's process group
serves the next)."""

from __future__ import annotations

import json
import os
import sys

import torch
from lightning.fabric import Fabric

import thunderviz  # noqa: F401 - registers the "thunder_fsdp" / "thunder_ddp" names
from tests.strategies.common import collective_counts, loss_fn
from tests.strategies.scenarios import MLP


def main(out_dir: str, strategy: str) -> None:
    fabric = Fabric(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    model = fabric.setup(MLP())
    x = MLP.batch(fabric.global_rank)
    loss = loss_fn(model(x))
    fabric.backward(loss)
    torch.manual_seed(0)
    ref = MLP()
    expected = sum(loss_fn(ref(MLP.batch(r))) for r in range(fabric.world_size)) / fabric.world_size
    import thunder

    trace = thunder.last_backward_traces(model._forward_module)[-1]
    result = {
        "rank": fabric.global_rank,
        "world_size": fabric.world_size,
        "backend": torch.distributed.get_backend(),
        "strategy": type(fabric.strategy).__name__,
        "mean_loss": float(fabric.all_reduce(loss.detach())),
        "expected_loss": float(expected),
        "backward_collectives": collective_counts(trace),
        "decision": fabric.strategy.decisions[-1].case,
    }
    with open(os.path.join(out_dir, f"{strategy}-rank-{fabric.global_rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[2:]:
        main(sys.argv[1], name)
