"""What every strategy scenario file (run inside real rank processes) builds the same way: one copy of each.

The loss, a launched ``Fabric`` with one of our strategies, the user's module under Fabric's wrapper and the
ThunderModule, its parameters gathered to full size, the collectives an executed trace holds, a jitted function
taking two set-up models, and running several scenarios in one call (one pair of rank processes for all of them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    """The scenarios' loss: mean square, in float32 whatever the model's dtype."""
    return (out.float() ** 2).mean()


def strategy(kind: str, **options: Any) -> Any:
    """``ThunderFSDPStrategy`` (``kind='fsdp'``) or ``ThunderDDPStrategy`` (``'ddp'``) with ``options``."""
    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy

    return (ThunderFSDPStrategy if kind == "fsdp" else ThunderDDPStrategy)(**options)


def fabric(kind: str, world: int = 2, **options: Any) -> Any:
    """A launched CPU ``Fabric`` on ``world`` ranks with ``strategy(kind, **options)``."""
    from lightning.fabric import Fabric

    launched = Fabric(accelerator="cpu", devices=world, strategy=strategy(kind, **options))
    launched.launch()
    return launched


def fabric_with(strategy: Any, world: int = 2) -> Any:
    """A launched CPU ``Fabric`` on ``world`` ranks with this strategy object (``ThunderAutoStrategy``, say)."""
    from lightning.fabric import Fabric

    launched = Fabric(accelerator="cpu", devices=world, strategy=strategy)
    launched.launch()
    return launched


def inner(model: Any) -> nn.Module:
    """The user's module under Fabric's wrapper and the ThunderModule: its parameters are the distributed ones."""
    from thunderviz.thunder.modules import user_module

    return user_module(model)


def full(p: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``p`` (a shard of, or a gradient for, parameter ``like``) gathered to the parameter's full size."""
    from thunderviz.thunder.comm import distribute

    return distribute.gather_full(p, like)


def full_params(model: Any) -> dict[str, torch.Tensor]:
    """Every parameter of a set-up model at full size, by name (a collective: every rank calls it)."""
    return {n: full(p.detach(), p) for n, p in inner(model).named_parameters()}


def collective_counts(trace: Any) -> dict[str, int]:
    """Collectives in an executed thunder trace, counted independently of thunderviz's own ledger."""
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


def fusion_regions(trace: Any) -> list[dict[str, Any]]:
    """Each fusion region of an executed trace: its name and the collectives found anywhere inside it."""
    from thunder.executors import torchex

    ids = {
        torchex.all_gather_prim_impl.id,
        torchex.reduce_scatter_prim_impl.id,
        torchex.all_reduce_prim_impl.id,
        torchex.wait_prim_impl.id,
    }
    names = {"all_gather", "reduce_scatter", "all_reduce", "wait", "synchronize"}

    def inside(bsyms: Any) -> list[str]:
        found = []
        for b in bsyms:
            if b.sym.id in ids or str(b.sym.name) in names:
                found.append(str(b.sym.name))
            found += inside(b.subsymbols)
        return found

    return [
        {"name": b.sym.name, "collectives": inside(b.subsymbols)}
        for b in trace.bound_symbols
        if getattr(b.sym, "is_fusion", False)
    ]


def run_many(rank: int, world: int, scenario: Callable[..., Any], scenarios: list[tuple]) -> list[Any]:
    """``scenario(rank, world, *s)`` for each ``s``: several scenarios in one call on the same rank processes."""
    return [scenario(rank, world, *s) for s in scenarios]


class SharedRun:
    """A file's one job on the session's rank pair, run when its first test asks and shared by all its tests.

    A run that failed fails every later test at once with its error, instead of each test starting it again (one
    hang would otherwise cost every test of the file its whole timeout).
    """

    def __init__(self, fn: Callable[..., Any], *args: Any, timeout: float) -> None:
        self.fn, self.args, self.timeout = fn, args, timeout
        self.results: list[Any] | None = None
        self.failed: BaseException | None = None

    def __call__(self) -> list[Any]:
        """The results by rank."""
        from tests.helpers.rank_pool import run_on_pool

        if self.failed is not None:
            raise RuntimeError(f"the shared run of {self.fn.__name__} failed in an earlier test") from self.failed
        if self.results is None:
            try:
                self.results = run_on_pool(self.fn, *self.args, timeout=self.timeout)
            except BaseException as e:
                self.failed = e
                raise
        return self.results


class Encoder(nn.Module):
    """The first of two models one jitted function takes (two layers: one bucket of four parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.out = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc(x)))


def two_models_one_function(rank: int, world: int, kind: str) -> dict[str, Any]:
    """Case 2 with one jitted function taking two different set-up models (default bucketing): gradients next to
    one process's, the collectives of the executed traces, and the buckets (they must stay apart per model)."""
    import thunder

    from thunderviz.thunder import compile_state

    launched = fabric(kind, world, jit=False)
    torch.manual_seed(0)
    enc, head = Encoder(), nn.Linear(5, 3)
    ref_enc, ref_head = Encoder(), nn.Linear(5, 3)
    ref_enc.load_state_dict(enc.state_dict())
    ref_head.load_state_dict(head.state_dict())
    enc, head = launched.setup_module(enc), launched.setup_module(head)
    step = thunder.jit(lambda e, h, x: loss_fn(h(e(x))))
    xs = [torch.randn(4, 6, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    launched.backward(step(enc, head, xs[rank]))
    (sum(loss_fn(ref_head(ref_enc(x))) for x in xs) / world).backward()
    got = {f"enc.{n}": full(p.grad, p) for n, p in enc.module.named_parameters()}
    got |= {f"head.{n}": full(p.grad, p) for n, p in head.module.named_parameters()}
    expected = {f"enc.{n}": p.grad for n, p in ref_enc.named_parameters()}
    expected |= {f"head.{n}": p.grad for n, p in ref_head.named_parameters()}
    return {
        "got": got,
        "expected": expected,
        "forward_collectives": collective_counts(thunder.last_traces(step)[-1]),
        "backward_collectives": collective_counts(thunder.last_backward_traces(step)[-1]),
        "buckets": {k: [b.to_dict() for b in v] for k, v in compile_state.comm_buckets(step).items()},
    }


@functools.cache
def two_models_results() -> dict[str, list[dict[str, Any]]]:
    """``two_models_one_function`` for FSDP and DDP on the session's rank pair, once: the training and the
    communication tests both assert on it (gradients and collective counts there, buckets here)."""
    from tests.helpers.rank_pool import run_on_pool

    kinds = ("fsdp", "ddp")
    per_rank = run_on_pool(run_many, two_models_one_function, [(kind,) for kind in kinds], timeout=600)
    return {kind: [results[i] for results in per_rank] for i, kind in enumerate(kinds)}
