"""Training-feature scenarios run inside real rank processes: activation checkpointing, gradient accumulation
under ``fabric.no_backward_sync`` and mixed precision, each against single-process eager PyTorch.

Every scenario builds its own Fabric on the process group the first one created, sets up a small tower of blocks
(``Tower``: the blocks take a keyword argument, as litgpt's do), trains on a different batch per rank, and returns
plain data: the losses, all-gathered gradients and parameters next to one process training on the whole global
batch, and what the traces did (captured bundles, collectives). ``run_all`` runs every scenario in one pair of
rank processes.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from tests.strategies import common
from tests.strategies.common import full, inner, loss_fn

LR = 0.1
WIDTH = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1 = nn.Linear(WIDTH, 2 * WIDTH - 1)  # 15 rows: sharding over 2 ranks pads them to 16
        self.fc2 = nn.Linear(2 * WIDTH - 1, WIDTH)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return x + scale * self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Tower(nn.Module):
    """Two blocks in a ModuleList (BLOCK bucketing: 2 block buckets and the root), an input and output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(5, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, scale=0.5)
        return self.head(h)


def batch(seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(6, 5, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- the distributed side ---------------------------------------------------------------------------------------


def _fabric(kind: str, precision: str = "32-true", devices: int = 2, **options: Any) -> Any:
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.precision import MixedPrecision

    if kind == "ddp":
        strategy = common.strategy("ddp", **options)
    else:
        strategy = common.strategy("fsdp", sharding_strategy=kind.removeprefix("fsdp-").upper(), **options)
    if precision == "16-mixed":
        # Fabric turns 16-mixed into bf16-mixed on CPU; torch's CPU autocast and GradScaler do support fp16, so the
        # plugin is given directly (as a user who wants fp16 on CPU would).
        fabric = Fabric(
            accelerator="cpu", devices=devices, strategy=strategy, plugins=MixedPrecision("16-mixed", "cpu")
        )
    else:
        fabric = Fabric(accelerator="cpu", devices=devices, strategy=strategy, precision=precision)
    fabric.launch()
    return fabric


def _full(model: Any, what: str) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in inner(model).named_parameters():
        out[n] = full(p.grad if what == "grad" else p.detach(), p).float()
    return out


def _counts(bundle: Any) -> dict[str, dict[str, int]]:
    from thunderviz.trace.ledger import ledger_from_bundle

    per_trace: dict[str, dict[str, int]] = {}
    for e in ledger_from_bundle(bundle).collectives():
        per_trace.setdefault(e.trace, {}).setdefault(e.kind, 0)
        per_trace[e.trace][e.kind] += 1
    return per_trace


def _setup(fabric: Any, case: str, model: nn.Module, ran_with: torch.Tensor | None = None) -> tuple[Any, Any]:
    """Cases as the decision table names them; returns (the set-up model, a step function x -> loss)."""
    import thunder

    if case == "jitted_ran":
        jitted = thunder.jit(model)
        loss_fn(jitted(ran_with)).backward()  # traced and run before setup, without checkpointing or collectives
        model = jitted
    elif case == "jitted":
        model = thunder.jit(model)
    model = fabric.setup_module(model)
    if case == "function":
        fwd = thunder.jit(lambda m, x: loss_fn(m(x)))
        return model, lambda x: fwd(model, x)
    return model, lambda x: loss_fn(model(x))


def _capture(model: Any) -> Any:
    from thunderviz import capture

    return capture(model, stages=False)


# -- activation checkpointing -------------------------------------------------------------------------------------


def checkpointing(rank: int, world: int, kind: str, case: str, **options: Any) -> dict[str, Any]:
    """One step with ``activation_checkpointing_policy={Block}``: loss and gradients equal eager without it."""
    fabric = _fabric(kind, "32-true", world, jit=case != "function", activation_checkpointing_policy={Block}, **options)
    torch.manual_seed(0)
    model, step = _setup(fabric, case, Tower(), ran_with=batch(99))
    x = batch(rank)
    loss = step(x)
    fabric.backward(loss)
    out = {
        "loss": float(fabric.all_reduce(loss.detach(), reduce_op="mean")),
        "grads": _full(model, "grad"),
        "reason": fabric.strategy.decisions[-1].reason,
        "checkpointed": [n for n, m in inner(model).named_modules() if "forward" in m.__dict__],
    }
    out["bundle"] = _capture(model)
    torch.manual_seed(0)
    ref = Tower()
    if case == "jitted_ran":  # its gradient from before setup stays, as this rank's shard of it
        loss_fn(ref(batch(99))).backward()
    ref_loss = sum(loss_fn(ref(batch(r))) for r in range(world)) / world
    ref_loss.backward()
    out["ref_loss"] = float(ref_loss.detach())
    out["ref_grads"] = {n: p.grad for n, p in ref.named_parameters()}
    return out


def checkpointing_baseline(rank: int, world: int, kind: str) -> Any:
    """The same model and step without checkpointing: the bundle the checkpointed one is compared with."""
    fabric = _fabric(kind)
    torch.manual_seed(0)
    model, step = _setup(fabric, "raw", Tower())
    fabric.backward(step(batch(rank)))
    return _capture(model)


def policy_matching_nothing(rank: int, world: int) -> str:
    from thunderviz.errors import JitDecisionError

    fabric = _fabric("fsdp-zero2", activation_checkpointing_policy={nn.Conv2d})
    try:
        fabric.setup_module(Tower())
    except JitDecisionError as err:
        return str(err)
    return "no error"


# -- gradient accumulation ------------------------------------------------------------------------------------------

MICRO = 3  # micro-batches per optimizer step
WINDOWS = 2  # optimizer steps: the second starts from accumulators the first emptied


def accumulation(
    rank: int,
    world: int,
    kind: str,
    bucketing: str,
    case: str = "raw",
    checkpointed: bool = False,
    bf16_reduced_in_fp32: bool = False,
    mesh: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """``MICRO`` micro-batches per step under ``no_backward_sync`` (all but the last), ``WINDOWS`` SGD steps.

    ``checkpointed``: with ``activation_checkpointing_policy={Block}`` (the two features together, and the
    checkpointing numerics for FSDP); ``bf16_reduced_in_fp32``: ``precision="bf16-true"`` with
    ``reduce_dtype=float32`` (sums kept in float32); ``mesh``: hybrid sharding's ``device_mesh`` (``kind``
    ``fsdp-hybrid_shard``).
    """
    extra: dict[str, Any] = {"reduce_dtype": "float32"} if bf16_reduced_in_fp32 else {}
    if mesh is not None:
        extra["device_mesh"] = mesh
    if checkpointed:
        extra["activation_checkpointing_policy"] = {Block}
    precision = "bf16-true" if bf16_reduced_in_fp32 else "32-true"
    half = torch.bfloat16 if bf16_reduced_in_fp32 else torch.float32
    fabric = _fabric(kind, precision, world, bucketing_strategy=bucketing, jit=case != "function", **extra)
    torch.manual_seed(0)
    model, step = _setup(fabric, case, Tower())
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=LR))
    out: dict[str, Any] = {"refusals": {}}
    for w in range(WINDOWS):
        optimizer.zero_grad()
        for m in range(MICRO):
            last = m == MICRO - 1
            with fabric.no_backward_sync(model, enabled=not last):
                fabric.backward(step(batch(100 * w + 10 * m + rank)) / MICRO)
            if w == 0 and m == 0:
                out["accumulating"] = _capture(model)
                out["grads_while_accumulating_are_none"] = all(p.grad is None for p in inner(model).parameters())
                for what, call in (
                    ("step", lambda: optimizer.step()),
                    ("clip", lambda: fabric.clip_gradients(model, optimizer, max_norm=1.0)),
                ):
                    try:
                        call()
                        out["refusals"][what] = "no error"
                    except RuntimeError as err:
                        out["refusals"][what] = str(err)
            if w == 0 and last:
                out["synchronizing"] = _capture(model)
                out["grads"] = _full(model, "grad")
                out["reason"] = fabric.strategy.decisions[-1].reason
        optimizer.step()
    out["params"] = _full(model, "param")
    torch.manual_seed(0)
    ref = Tower().to(half)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for w in range(WINDOWS):
        ref_opt.zero_grad()
        for m in range(MICRO):
            xs = [batch(100 * w + 10 * m + r, half) for r in range(world)]
            (sum(loss_fn(ref(x)) for x in xs) / (world * MICRO)).backward()
        if w == 0:
            out["ref_grads"] = {n: p.grad.float().clone() for n, p in ref.named_parameters()}
        ref_opt.step()
    out["ref_params"] = {n: p.detach().float() for n, p in ref.named_parameters()}
    return out


# -- mixed precision ------------------------------------------------------------------------------------------------


def precision(rank: int, world: int, kind: str, precision: str, reduce_dtype: str | None = None) -> dict[str, Any]:
    """Two SGD steps in ``precision`` (with GradScaler for 16-mixed), against one process in the same precision."""
    options = {} if reduce_dtype is None else {"reduce_dtype": reduce_dtype}
    fabric = _fabric(kind, precision=precision, **options)
    torch.manual_seed(0)
    model, step = _setup(fabric, "raw", Tower())  # fabric.setup converts it to the precision (bf16 for -true)
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=LR))
    losses = []
    out: dict[str, Any] = {}
    for s in range(2):
        optimizer.zero_grad()
        loss = step(batch(10 * s + rank))
        fabric.backward(loss)
        if s == 0:
            # 16-mixed: gradients are scaled by the GradScaler until optimizer.step unscales them
            scaler = getattr(fabric._precision, "scaler", None)
            scale = float(scaler.get_scale()) if scaler is not None else 1.0
            out["grads"] = {n: g / scale for n, g in _full(model, "grad").items()}
            out["bundle"] = _capture(model)
            out["param_dtype"] = str(next(inner(model).parameters()).dtype)
        optimizer.step()
        losses.append(float(fabric.all_reduce(loss.detach().float(), reduce_op="mean")))
    out["losses"] = losses
    out["params"] = _full(model, "param")
    out.update(_precision_reference(world, precision))
    return out


def _precision_reference(world: int, precision: str) -> dict[str, Any]:
    """One process, the same precision as Fabric applies it: bf16 parameters and inputs (``-true``), or fp32
    parameters under ``torch.autocast`` (``-mixed``; fp16 with a GradScaler, whose scale cancels in the update)."""
    torch.manual_seed(0)
    half = {"bf16-true": torch.bfloat16}.get(precision)
    ref = Tower().to(half) if half else Tower()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    autocast_dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    losses, grads = [], None
    for s in range(2):
        opt.zero_grad()
        ctx = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else nullcontext()
        with ctx:
            per_rank = [loss_fn(ref(batch(10 * s + r, half or torch.float32))) for r in range(world)]
        loss = sum(per_rank) / world
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        if s == 0:
            grads = {n: p.grad.float().clone() for n, p in ref.named_parameters()}
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        losses.append(float(loss.detach()))
    return {
        "ref_losses": losses,
        "ref_grads": grads,
        "ref_params": {n: p.detach().float() for n, p in ref.named_parameters()},
    }


# -- everything in one pair of processes ------------------------------------------------------------------------

CHECKPOINTING = [  # FSDP case 1 and 2 are checkpointed in ACCUMULATION
    ("ddp", "raw"),
    ("ddp", "function"),
    ("fsdp-zero2", "jitted"),
    ("fsdp-zero3", "jitted_ran"),
]
ACCUMULATION = [  # (kind, bucketing, case, checkpointed, bf16 reduced in fp32)
    ("fsdp-zero2", "BLOCK", "raw", True, False),
    ("fsdp-zero3", "BLOCK", "raw", True, False),
    ("fsdp-zero2", "LAYER", "function", True, False),
    ("fsdp-zero3", "LAYER", "raw", False, False),
    ("fsdp-zero2", "BLOCK", "raw", False, True),
]
PRECISION = [
    ("fsdp-zero2", "bf16-true", None),
    ("ddp", "bf16-true", "float32"),
    ("fsdp-zero3", "bf16-mixed", None),
    ("ddp", "bf16-mixed", None),
    ("fsdp-zero2", "16-mixed", None),
    ("ddp", "16-mixed", None),
]


def run_all(rank: int, world: int) -> dict[str, Any]:
    """Every scenario, keyed by its parameters: one interpreter start and process group for all of them."""
    out: dict[str, Any] = {"policy_matching_nothing": policy_matching_nothing(rank, world)}
    out["baseline"] = checkpointing_baseline(rank, world, "fsdp-zero2")
    for args in CHECKPOINTING:
        out[("checkpointing", *args)] = checkpointing(rank, world, *args)
    for args in ACCUMULATION:
        out[("accumulation", *args)] = accumulation(rank, world, *args)
    for args in PRECISION:
        out[("precision", *args)] = precision(rank, world, *args)
    return out
