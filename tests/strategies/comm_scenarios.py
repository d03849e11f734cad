"""Communication scenarios run inside real rank processes: bucketed, scheduled collectives against eager PyTorch.

Each scenario sets up a model with a thunderviz strategy given the communication knobs (``sharding_strategy``,
``bucketing_strategy``, ``bucket_size_in_mb``; the strategy attaches the plan through ``thunder.comm.setup``),
trains a few SGD steps on a different batch per rank, and returns plain data: losses, all-gathered gradients and
parameters next to single-process eager PyTorch on the whole global batch, plus what the executed traces did
(collectives, buckets with their issue/wait positions, what forward saved for backward, thunder's peak estimates).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.strategies import common
from tests.strategies.common import collective_counts, loss_fn

STEPS = 3
LR = 0.1


class Block(nn.Module):
    """First dims 7, 7, 1 and 6: sharding over 2 ranks pads 7 -> 8 and 1 -> 2."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 7)
        self.norm = nn.LayerNorm(7)
        self.gate = nn.Linear(7, 1)
        self.fc2 = nn.Linear(7, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.tanh(_linear(self.fc1, x)))
        return _linear(self.fc2, h) * torch.sigmoid(_linear(self.gate, h))


def _linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A layer in its own dtype, its output back in float32 (so one block can mix dtypes)."""
    return layer(x.to(layer.weight.dtype)).float()


class Blocks(nn.Module):
    """An embedding, a list of two blocks and a head tied to the embedding (as GPT-2 ties them)."""

    def __init__(self, frozen: bool = False, bf16_block: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(9, 6)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(6, 9, bias=False)
        self.head.weight = self.emb.weight
        if frozen:
            self.blocks[1].fc1.requires_grad_(False)
        if bf16_block:
            self.blocks[1].fc2.to(torch.bfloat16)  # blocks.1 mixes float32 and bfloat16 parameters

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)

    @staticmethod
    def batch(seed: int) -> torch.Tensor:
        return torch.randint(0, 9, (4, 3), generator=torch.Generator().manual_seed(seed))


VARIANTS = {"plain": {}, "frozen": {"frozen": True}, "bf16": {"bf16_block": True}}


def _reference(variant: str, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Blocks(**VARIANTS[variant])
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    losses, grads = [], None
    for step in range(STEPS):
        per_rank = [loss_fn(model(Blocks.batch(100 * step + r))) for r in range(world)]
        opt.zero_grad()
        (sum(per_rank) / world).backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        losses.append([float(v) for v in per_rank])
        opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _weight_derived(trace: Any, gathered: set[str]) -> set[str]:
    """Names computed from nothing but ``gathered`` tensors (the unsharded weights themselves, views, transposes)."""
    derived = set(gathered)
    for bsym in trace.bound_symbols:
        args = [p.name for p in bsym.flat_proxy_args]
        if args and all(a in derived for a in args):
            derived.update(p.name for p in bsym.flat_proxy_outs)
    return derived


def _trace_facts(traced: Any) -> dict[str, Any]:
    import thunder

    from thunderviz.thunder import compile_state

    fw = thunder.last_traces(traced)[-1]
    bw = thunder.last_backward_traces(traced)[-1]
    buckets = {k: [b.to_dict() for b in v] for k, v in compile_state.comm_buckets(traced).items()}
    resharded = {
        r for b in compile_state.comm_buckets(traced).get("forward", []) if b.reshard_after_forward for r in b.results
    }
    saved = compile_state.saved_for_backward(fw)
    derived = _weight_derived(fw, resharded)
    reductions = [b for b in compile_state.trace_buckets(bw) if b.kind != "all_gather"]
    first_wait = min((b.wait_index for b in reductions), default=len(bw.bound_symbols))
    return {
        "after_first_reduction_wait": sorted({b.sym.name for b in bw.bound_symbols[first_wait:]}),
        "forward_collectives": collective_counts(fw),
        "backward_collectives": collective_counts(bw),
        "buckets": buckets,
        "saved": saved,
        "saved_from_resharded_weights": sorted(n for n, *_ in saved if n in derived),
        "peak_forward": compile_state.estimated_peak_bytes(fw),
        "peak_backward": compile_state.estimated_peak_bytes(bw),
    }


def _comm_options(
    kind: str, sharding: str, bucketing: str, bucket_size_in_mb: float, mesh: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The communication knobs of ``kind``'s strategy (FSDP: sharding, bucketing and a hybrid mesh; DDP: bucket
    size)."""
    if kind == "fsdp":
        return {"sharding_strategy": sharding, "bucketing_strategy": bucketing, "device_mesh": mesh}
    return {"bucket_size_in_mb": bucket_size_in_mb}


def _full(p: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Full size, in float32 (blocks.1 of the bf16 variant holds bfloat16 parameters)."""
    return common.full(p, like).float()


def train(
    rank: int,
    world: int,
    kind: str,
    sharding: str,
    bucketing: str,
    case: str,
    variant: str = "plain",
    bucket_size_in_mb: float = 25.0,
    mesh: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One scenario. ``case``: 'raw' (case 1), 'function' (case 2), 'jitted' / 'jitted_ran' (case 3)."""
    import thunder

    from thunderviz.thunder import param_tags

    options = _comm_options(kind, sharding, bucketing, bucket_size_in_mb, mesh)
    fabric = common.fabric(kind, world, jit=case != "function", **options)
    strategy = fabric.strategy
    torch.manual_seed(0 if rank == 0 else 1234)  # the strategy must broadcast rank 0's parameters
    model: Any = Blocks(**VARIANTS[variant])
    fwd = None
    if case in ("jitted", "jitted_ran"):
        model = thunder.jit(model)
        if case == "jitted_ran":
            model(Blocks.batch(999))
    if case == "function":
        fwd = thunder.jit(lambda m, x: loss_fn(m(x)))
    model = fabric.setup_module(model)
    inner = common.inner(model)
    configs = [param_tags.comm_config(p) for p in inner.parameters()]
    optimizer = fabric.setup_optimizers(torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR))
    losses, grads = [], None
    for step in range(STEPS):
        x = Blocks.batch(100 * step + rank)
        loss = fwd(model, x) if fwd is not None else loss_fn(model(x))
        optimizer.zero_grad()
        fabric.backward(loss)
        if step == 0:
            grads = {n: _full(p.grad, p) for n, p in inner.named_parameters() if p.grad is not None}
        losses.append([float(v) for v in fabric.all_gather(loss.detach())])
        optimizer.step()
    params = {n: _full(p.detach(), p) for n, p in inner.named_parameters()}
    traced = fwd if fwd is not None else model._forward_module
    return {
        "losses": losses,
        "grads": grads,
        "params": params,
        "ref": _reference(variant, world),
        "configs": [(c.param_name, c.label, c.reshard_after_forward) for c in configs],
        "reason": next(d.reason for d in reversed(strategy.decisions) if not str(d.action).startswith("choose")),
        "mesh_reason": next((d.reason for d in strategy.decisions if str(d.action) == "choose the mesh"), ""),
        **_trace_facts(traced),
    }
