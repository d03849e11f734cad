"""Predicted against measured per-rank step memory on real ranks: the models, the training loop, the measurement.

Shared by the accuracy tests (``tests/strategies/test_memory_plan_2rank.py``), the benchmark
(``bench/memory_plan.py``) and the tutorial, so all three predict and measure the same thing: ``MODELS`` names small
models (two litgpt ``GPT(Config(...))`` shapes, a GPT with its head tied to its embedding, a residual MLP and a small
CNN), each with one rank's batch and its loss; ``predict`` plans them (``thunderviz.plan``, on the meta device, in
this process); ``measure_many`` trains them on rank processes (``thunderviz.run_ranks``) under each candidate's
strategy, and measures each rank's steady-state step peak with torch's accounting (``thunder.memory.meter``);
``time_many`` times the candidates of a model against each other, side by side in the same ranks.

The loop is the one the plan rehearses: ``out = model(x); loss = loss_fn(out, y); fabric.backward(loss);
optimizer.step(); optimizer.zero_grad()``, a new batch every step.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from thunderviz.demos.models import MLPBlock, ResidualMLP, TinyGPT

__all__ = [
    "MODELS",
    "OPTIMIZERS",
    "MemoryModel",
    "measure",
    "measure_many",
    "predict",
    "time_many",
    "time_side_by_side",
]


@dataclass(frozen=True)
class MemoryModel:
    """A model for memory runs: how to build it, one rank's batch ``(inputs, targets)``, and the loss."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, str], tuple[torch.Tensor, torch.Tensor]]  # (seed, device) -> (x, y)
    loss: Callable[[Any, torch.Tensor], torch.Tensor]


def _tokens(vocab: int, shape: tuple[int, int]) -> Callable[[int, str], tuple[torch.Tensor, torch.Tensor]]:
    def batch(seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        if device == "meta":
            return torch.empty(shape, dtype=torch.long, device="meta"), torch.empty(
                shape, dtype=torch.long, device="meta"
            )
        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, vocab, (shape[0], shape[1] + 1), generator=g)
        return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

    return batch


def _features(x_shape: tuple[int, ...], classes: int) -> Callable[[int, str], tuple[torch.Tensor, torch.Tensor]]:
    def batch(seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        if device == "meta":
            return torch.empty(x_shape, device="meta"), torch.empty(x_shape[0], dtype=torch.long, device="meta")
        g = torch.Generator().manual_seed(seed)
        return torch.randn(x_shape, generator=g), torch.randint(0, classes, (x_shape[0],), generator=g)

    return batch


def _lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _class_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(out.shape[0], -1), y)


def _litgpt(**config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from litgpt import GPT, Config

        return GPT(Config(**config))

    return build


class SmallCNN(nn.Module):
    """Conv stem, a stack of residual conv blocks, pooled linear head: a model with no attention and no tokens."""

    def __init__(self, channels: int = 16, n_blocks: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(_ConvBlock(channels) for _ in range(n_blocks))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


class _ConvBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.conv1(x)))


class LossTower(nn.Module):
    """An activation-heavy residual MLP tower whose ``forward`` returns the loss (as many training codebases do):
    the plan's ``loss_fn`` is then the identity, and nothing outside the model holds an output."""

    def __init__(self, d_model: int = 64, hidden: int = 256, n_layer: int = 5) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(d_model, hidden) for _ in range(n_layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return (x**2).mean()


def _loss_is_output(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return out


#: The models of the memory runs, by name.
MODELS: dict[str, MemoryModel] = {
    "litgpt-gpt2": MemoryModel(
        "litgpt GPT (LayerNorm, GELU MLP; 2 blocks, d=64)",
        _litgpt(
            block_size=64,
            vocab_size=256,
            padded_vocab_size=256,
            n_layer=2,
            n_head=4,
            n_embd=64,
            bias=True,
            norm_class_name="LayerNorm",
            mlp_class_name="GptNeoxMLP",
            intermediate_size=256,
        ),
        _tokens(256, (4, 64)),
        _lm_loss,
    ),
    "litgpt-llama": MemoryModel(
        "litgpt GPT (RMSNorm, LLaMA MLP, grouped-query attention; 3 blocks, d=96)",
        _litgpt(
            block_size=48,
            vocab_size=320,
            padded_vocab_size=320,
            n_layer=3,
            n_head=6,
            n_query_groups=2,
            n_embd=96,
            bias=False,
            norm_class_name="RMSNorm",
            mlp_class_name="LLaMAMLP",
            intermediate_size=256,
            rotary_percentage=1.0,
            parallel_residual=False,
        ),
        _tokens(320, (4, 48)),
        _lm_loss,
    ),
    "gpt-tied": MemoryModel(
        "GPT with its head tied to its embedding (TinyGPT, 2 blocks, d=64)",
        functools.partial(TinyGPT, vocab_size=256, block_size=32, d_model=64, n_layer=2, n_head=4, tie_weights=True),
        _tokens(256, (4, 32)),
        _lm_loss,
    ),
    "mlp": MemoryModel(
        "residual MLP (4 blocks, d=64)",
        functools.partial(ResidualMLP, d_in=32, d_model=64, hidden=256, n_layer=4, d_out=10),
        _features((128, 32), 10),
        _class_loss,
    ),
    "loss-tower": MemoryModel(
        "activation-heavy MLP tower returning its loss (5 blocks, d=64, hidden 256, batch 256)",
        LossTower,
        _features((256, 64), 10),
        _loss_is_output,
    ),
    "cnn": MemoryModel(
        "small CNN (residual conv blocks, 16 channels, 16x16 images)",
        functools.partial(SmallCNN, channels=16, n_blocks=3, classes=10),
        _features((8, 3, 16, 16), 10),
        _class_loss,
    ),
}

#: The optimizers of the memory runs: what ``thunderviz.plan`` takes, the same as what the ranks build.
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": functools.partial(torch.optim.AdamW, lr=1e-3),
    "sgd": functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
}


def predict(model: str, optimizer: str, world_sizes: tuple[int, ...], **kwargs: Any) -> Any:
    """``thunderviz.plan`` of one of ``MODELS`` with one of ``OPTIMIZERS`` (``kwargs``: candidates, budget...)."""
    from thunderviz.strategies.planning import plan

    m = MODELS[model]
    x, y = m.batch(0, "meta")
    return plan(
        m.build,
        x,
        loss_fn=lambda out: m.loss(out, y),
        optimizer=OPTIMIZERS[optimizer],
        world_sizes=world_sizes,
        device="cpu",
        **kwargs,
    )


def _strategy(candidate: str, world: int, m: MemoryModel) -> Any:
    from thunderviz.parallel.plan import candidate_specs
    from thunderviz.strategies.ddp import ThunderDDPStrategy
    from thunderviz.strategies.fsdp import ThunderFSDPStrategy
    from thunderviz.strategies.planning import block_checkpoint_policy

    with torch.device("meta"):
        policy = block_checkpoint_policy(m.build())  # what the plan checkpoints in its +ac candidates
    options = candidate_specs([world], [candidate], checkpoint=policy)[0].options
    cls = ThunderFSDPStrategy if options.parallelism.value == "fsdp" else ThunderDDPStrategy
    return cls.from_options(options)


def _setup(m: MemoryModel, optimizer: str, world: int, strategy: Any) -> tuple[Any, Any, Any]:
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    with fabric.init_module(empty_init=True):
        net = m.build()
    net, opt = fabric.setup(net, OPTIMIZERS[optimizer](net.parameters()))
    return fabric, net, opt


def _step(m: MemoryModel, fabric: Any, net: Any, opt: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """One step of the loop the plan rehearses: the output and loss live until the step's end."""
    x, y = batch
    out = net(x)
    loss = m.loss(out, y)
    fabric.backward(loss)
    opt.step()
    opt.zero_grad()
    del out, loss


def measure(
    rank: int,
    world: int,
    model: str,
    optimizer: str,
    candidate: str,
    steps: int = 5,
    auto_budget: int | None = None,
) -> dict[str, Any]:
    """Train ``model`` for ``steps`` steps under ``candidate``'s strategy (or ``ThunderAutoStrategy`` with
    ``auto_budget`` when ``candidate == "auto"``); this rank's measured step memory and step time (the median of the
    measured steps after the first; ``time_side_by_side`` times candidates fairly against each other).
    """
    from thunderviz.strategies.auto import ThunderAutoStrategy
    from thunderviz.thunder.memory.meter import StepMemoryMeter

    m = MODELS[model]
    if candidate == "auto":
        x0, y0 = m.batch(0, "meta")
        strategy: Any = ThunderAutoStrategy(auto_budget, example_input=x0, loss_fn=lambda out: m.loss(out, y0))
    else:
        strategy = _strategy(candidate, world, m)
    fabric, net, opt = _setup(m, optimizer, world, strategy)
    meter = StepMemoryMeter(lambda: [net]).start()
    times = []
    for step in range(steps):
        batch = m.batch(1000 * step + rank, "cpu")
        t0 = time.perf_counter()
        _step(m, fabric, net, opt, batch)
        times.append(time.perf_counter() - t0)
    measured = meter.stop()
    chosen = strategy.chosen.name if candidate == "auto" else candidate
    return {"measured": measured, "step_s": statistics.median(times[1:]), "candidate": chosen}


def measure_many(rank: int, world: int, scenarios: list[tuple]) -> list[dict[str, Any]]:
    """``measure`` for each scenario in one set of rank processes (one interpreter start and process group)."""
    return [measure(rank, world, *s) for s in scenarios]


def time_side_by_side(
    rank: int, world: int, model: str, optimizer: str, candidates: Sequence[str], rounds: int = 8, steps: int = 3
) -> dict[str, list[tuple[float, float]]]:
    """Every candidate set up at once in these ranks, then timed in turns: ``rounds`` rounds of ``steps`` steps
    each, the order rotated every round; this rank's (wall, CPU) seconds of each timed step, by candidate.

    Why side by side: on shared cores the machine's speed drifts over minutes, so candidates timed one after the
    other (each at its own moment of a long run) differ by that drift, 30% and more here, more than the 10% a
    choice is judged by. Taking turns gives every candidate the same share of the drift. A barrier starts each
    turn, so no rank's lag leaks into the next candidate's time. Two warm-up steps each come first (the first
    compiles). Memory is measured apart (``measure``): the other candidates' models would be alive here.
    """
    import torch.distributed as dist

    m = MODELS[model]
    setups = {}
    for c in candidates:
        setups[c] = _setup(m, optimizer, world, _strategy(c, world, m))
        for warm in range(2):
            _step(m, *setups[c], m.batch(warm * 1000 + rank, "cpu"))
    times: dict[str, list[tuple[float, float]]] = {c: [] for c in candidates}
    order = list(candidates)
    for r in range(rounds):
        turn = order[r % len(order) :] + order[: r % len(order)]
        for c in turn:
            dist.barrier()
            for s in range(steps):
                batch = m.batch(1000 * (2 + r * steps + s) + rank, "cpu")
                t0, c0 = time.perf_counter(), time.process_time()
                _step(m, *setups[c], batch)
                times[c].append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def time_many(rank: int, world: int, runs: list[tuple]) -> list[dict[str, list[tuple[float, float]]]]:
    """``time_side_by_side`` for each ``(model, optimizer, candidates, ...)`` in one set of rank processes, each
    run's modules released before the next is set up."""
    out = []
    for run in runs:
        out.append(time_side_by_side(rank, world, *run))
        gc.collect()
    return out
