"""Training scenarios run inside real rank processes; each returns plain data the test asserts on.

Every scenario compares against single-process eager PyTorch on the same seed and the same global batch:
loss, all-gathered gradients after one step, and parameters after three SGD steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

STEPS = 3
LR = 0.1


class MLP(nn.Module):
    """First dims 7 (not divisible by 2) and 1 (padded to 2 when sharded: the stale-cache trap)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 7)
        self.fc2 = nn.Linear(7, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    @staticmethod
    def batch(seed: int) -> torch.Tensor:
        return torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))


class EmbedNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 5)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(idx)))

    @staticmethod
    def batch(seed: int) -> torch.Tensor:
        return torch.randint(0, 11, (4, 3), generator=torch.Generator().manual_seed(seed))


class Tied(nn.Module):
    """Input embedding and output head share one weight (as GPT-2 does)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(9, 6)
        self.mid = nn.Linear(6, 6)
        self.head = nn.Linear(6, 9, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.emb(idx))))

    @staticmethod
    def batch(seed: int) -> torch.Tensor:
        return torch.randint(0, 9, (4, 3), generator=torch.Generator().manual_seed(seed))


MODELS = {"mlp": MLP, "embed_norm": EmbedNorm, "tied": Tied}


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    return (out.float() ** 2).mean()


def _reference(model_name: str, world: int) -> dict[str, Any]:
    """Single-process eager: the mean of the per-rank losses, on the whole global batch."""
    torch.manual_seed(0)
    model = MODELS[model_name]()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], None
    for step in range(STEPS):
        xs = [MODELS[model_name].batch(100 * step + r) for r in range(world)]
        per_rank = [loss_fn(model(x)) for x in xs]
        loss = sum(per_rank) / world
        opt.zero_grad()
        loss.backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        losses.append([float(l) for l in per_rank])
        opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _collectives(trace: Any) -> dict[str, int]:
    from thunder.executors import torchex

    ids = {
        torchex.all_gather_prim_impl.id: "all_gather",
        torchex.reduce_scatter_prim_impl.id: "reduce_scatter",
        torchex.all_reduce_prim_impl.id: "all_reduce",
        torchex.wait_prim_impl.id: "wait",
    }
    counts: dict[str, int] = {}
    for bsym in trace.bound_symbols:
        kind = ids.get(bsym.sym.id)
        if kind:
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def train(rank: int, world: int, strategy_kind: str, case: str, model_name: str, sharding: str = "ZERO2",
          jit_before_setup: bool = False) -> dict[str, Any]:
    """One scenario. ``case``: 'raw' (case 1), 'function' (case 2), 'jitted' or 'jitted_ran' (case 3)."""
    import thunder
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.core import thunder_hooks as hooks

    jit = case != "function"
    if strategy_kind == "fsdp":
        strategy = ThunderFSDPStrategy(jit=jit, sharding_strategy=sharding)
    else:
        strategy = ThunderDDPStrategy(jit=jit)
    fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
    fabric.launch()

    # Every rank builds the model with a *different* seed: the strategy must broadcast rank 0's parameters.
    torch.manual_seed(0 if rank == 0 else 1234)
    model = MODELS[model_name]()
    fwd = None
    if case in ("jitted", "jitted_ran"):
        model = thunder.jit(model)
        if case == "jitted_ran":
            model(MODELS[model_name].batch(999))  # runs unsharded once: its cache entry must not be reused
    if case == "function":
        fwd = thunder.jit(lambda m, x: loss_fn(m(x)))
        if jit_before_setup:
            torch.manual_seed(0)
            fwd(MODELS[model_name](), MODELS[model_name].batch(999))  # caches a trace with no collectives
    user_handle = model
    model = fabric.setup_module(model)
    if case in ("jitted", "jitted_ran"):
        assert model._forward_module is user_handle, "the user's own ThunderModule must come back"
    forward_module = model._forward_module
    inner = forward_module._model if hooks.is_thunder_module(forward_module) else forward_module
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=LR))

    losses, grads = [], None
    for step in range(STEPS):
        x = MODELS[model_name].batch(100 * step + rank)
        loss = fwd(model, x) if fwd is not None else loss_fn(model(x))
        optimizer.zero_grad()
        fabric.backward(loss)
        if step == 0:
            grads = {n: hooks.gather_full(p.grad, p) for n, p in inner.named_parameters()}
        gathered = fabric.all_gather(loss.detach())
        losses.append([float(l) for l in gathered])
        optimizer.step()

    params = {n: hooks.gather_full(p.detach(), p) for n, p in inner.named_parameters()}
    traced = fwd if fwd is not None else forward_module
    fw = thunder.last_traces(traced)[-1]
    bw = thunder.last_backward_traces(traced)[-1]
    ref = _reference(model_name, world)
    return {
        "losses": losses,
        "grads": grads,
        "params": params,
        "ref": ref,
        "forward_collectives": _collectives(fw),
        "backward_collectives": _collectives(bw),
        "decisions": [d.to_dict() for d in strategy.decisions],
        "local_shapes": {n: tuple(p.shape) for n, p in inner.named_parameters()},
    }
