"""The front doors users bring to ``fabric.setup`` beyond a plain module and ``thunder.jit``, on real rank processes:
``thunder.compile`` with a recipe (trained, against one eager process), with thunder's FSDP or DDP plugin (refused
before Fabric touches it), ``thunderfx(model)`` (refused) and ``torch.compile(model, backend=ThunderCompiler())``
(jitted by the strategy, Fabric's second torch.compile passing through; trained against one eager process).

The model is one no test wrote before: three gated blocks of odd widths.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.strategies.common import fabric, loss_fn

STEPS = 3
LR = 0.1
WIDTH = 5


class GatedBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.value = nn.Linear(d, d)
        self.gate = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.value(x) * torch.sigmoid(self.gate(x))


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, WIDTH)
        self.blocks = nn.ModuleList(GatedBlock(WIDTH) for _ in range(3))
        self.out = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(100 * step + rank))


def built() -> Gated:
    torch.manual_seed(0)
    return Gated()


def reference(world: int) -> list[float]:
    """One eager process on the global batch: the mean of the per-rank losses, step by step."""
    model = built()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        loss = sum(loss_fn(model(batch(step, r))) for r in range(world)) / world
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def _train(launched: Any, model: Any, rank: int) -> list[float]:
    opt = launched.setup_optimizers(torch.optim.SGD(model.parameters(), lr=LR))
    losses = []
    for step in range(STEPS):
        loss = loss_fn(model(batch(step, rank)))
        opt.zero_grad()
        launched.backward(loss)
        opt.step()
        losses.append(float(launched.all_reduce(loss.detach(), reduce_op="mean")))
    return losses


def _refused(launched: Any, obj: Any) -> dict[str, Any]:
    from thunderviz.errors import JitDecisionError

    try:
        launched.setup(obj)
    except JitDecisionError as err:
        decision = launched.strategy.decisions[-1].to_dict()
        return {"error": str(err), "type": type(err).__name__, "decision": decision}
    except Exception as err:  # a raw error from inside Fabric or thunder: what the test must never see
        return {"error": f"{type(err).__name__}: {err}", "type": type(err).__name__}
    return {"error": "", "type": ""}


def doors(rank: int, world: int, kind: str) -> dict[str, Any]:
    import thunder
    from thunder.dynamo import ThunderCompiler, thunderfx
    from thunder.recipes import BaseRecipe

    launched = fabric(kind)
    out: dict[str, Any] = {"reference": reference(world)}

    strategy = launched.strategy
    compiled = thunder.compile(built(), recipe=BaseRecipe(fuser="torch.compile"))
    model = launched.setup(compiled)
    out["compile"] = {
        "losses": _train(launched, model, rank),
        "executors": strategy.decisions[-2].to_dict(),
        "decision": strategy.decisions[-1].to_dict(),
    }

    group = torch.distributed.group.WORLD
    plugins = {
        "FSDP": lambda: thunder.plugins.FSDP(device=torch.device("cpu"), process_group=group),
        "DDP": lambda: thunder.plugins.DDP(process_group=group),
    }
    for name, plugin in plugins.items():
        obj = thunder.compile(built(), recipe=BaseRecipe(fuser="torch.compile"), plugins=[plugin()])
        out[f"plugin {name}"] = _refused(launched, obj)

    out["thunderfx"] = _refused(launched, thunderfx(built()))

    model = launched.setup(torch.compile(built(), backend=ThunderCompiler()))
    out["torch.compile"] = {
        "losses": _train(launched, model, rank),
        "decision": strategy.decisions[-1].to_dict(),
        "compiled_again": type(model._forward_module).__name__,
    }
    return out


def both(rank: int, world: int) -> dict[str, Any]:
    return {kind: doors(rank, world, kind) for kind in ("fsdp", "ddp")}
