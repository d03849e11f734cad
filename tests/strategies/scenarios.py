"""Training scenarios run inside real rank processes; each returns plain data the test asserts on.

Every scenario compares against single-process eager PyTorch on the same seed and the same global batch:
loss, all-gathered gradients after one step, and parameters after three SGD steps. Variants: gradient clipping
(``fabric.clip_gradients`` vs ``torch.nn.utils.clip_grad_norm_``/``clip_grad_value_``) and models built under
``fabric.init_module(empty_init=True)`` (vs the same ``reset_parameters()`` calls on one process).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from tests.strategies import common
from tests.strategies.common import collective_counts, loss_fn

STEPS = 3
LR = 0.1
CLIP_NORM = 0.05  # small enough that every step clips
CLIP_VALUE = 0.02
CLIPS = {
    "norm2": {"max_norm": CLIP_NORM, "norm_type": 2.0},
    "inf": {"max_norm": CLIP_NORM, "norm_type": float("inf")},
    "value": {"clip_val": CLIP_VALUE},
}


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


def build_reference_model(model_name: str, meta: bool) -> nn.Module:
    """Rank 0's model on one process: seed 0, eager; or seed 0, built on meta, then the same resets in order."""
    torch.manual_seed(0)
    if not meta:
        return MODELS[model_name]()
    from thunderviz.strategies.materialize import materialize_

    with torch.device("meta"):
        model = MODELS[model_name]()
    materialize_(model, torch.device("cpu"))
    return model


def clip_reference(model: nn.Module, clip: str | None) -> float | None:
    if clip is None:
        return None
    kw = CLIPS[clip]
    if "clip_val" in kw:
        torch.nn.utils.clip_grad_value_(model.parameters(), kw["clip_val"])
        return None
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), kw["max_norm"], norm_type=kw["norm_type"]))


def _reference(model_name: str, world: int, clip: str | None = None, meta: bool = False) -> dict[str, Any]:
    """Single-process eager: the mean of the per-rank losses, on the whole global batch."""
    model = build_reference_model(model_name, meta)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads, norms = [], None, []
    for step in range(STEPS):
        xs = [MODELS[model_name].batch(100 * step + r) for r in range(world)]
        per_rank = [loss_fn(model(x)) for x in xs]
        loss = sum(per_rank) / world
        opt.zero_grad()
        loss.backward()
        norms.append(clip_reference(model, clip))
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        losses.append([float(x) for x in per_rank])
        opt.step()
    return {
        "losses": losses,
        "grads": grads,
        "norms": norms,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
    }


def train(
    rank: int,
    world: int,
    strategy_kind: str,
    case: str,
    model_name: str,
    sharding: str = "ZERO2",
    jit_before_setup: bool = False,
    clip: str | None = None,
    meta: bool = False,
    executors: tuple[str, ...] | None = None,
    mesh: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One scenario. ``case``: 'raw' (case 1), 'function' (case 2), 'jitted' or 'jitted_ran' (case 3).

    ``clip``: a key of ``CLIPS`` (``fabric.clip_gradients`` after every backward); ``meta``: the model is built under
    ``fabric.init_module(empty_init=True)``; ``executors``: case 1 passes them to the strategy, cases 2 and 3 to the
    user's own ``thunder.jit`` (less any that is not installed: there thunder.jit itself would refuse the name).
    """
    import thunder

    jit = case != "function"
    options: dict[str, Any] = {"sharding_strategy": sharding} if strategy_kind == "fsdp" else {}
    if mesh is not None:  # hybrid sharding's (replicas, shard_size)
        options["device_mesh"] = mesh
    user_jit: dict[str, Any] = {}
    if executors is not None and case == "raw":
        options["executors"] = list(executors)
    elif executors is not None:
        from thunder.extend import get_executor

        user_jit["executors"] = [e for e in executors if get_executor(e) is not None]
    fabric = common.fabric(strategy_kind, world, jit=jit, **options)
    strategy = fabric.strategy

    # Every rank builds the model with a *different* seed: the strategy must broadcast rank 0's parameters (or,
    # for a meta-device model, initialize every rank from rank 0's generator).
    torch.manual_seed(0 if rank == 0 else 1234)
    with fabric.init_module(empty_init=True) if meta else nullcontext():
        model = MODELS[model_name]()
    on_meta_before_setup = all(p.is_meta for p in model.parameters())
    fwd = None
    if case in ("jitted", "jitted_ran"):
        model = thunder.jit(model, **user_jit)
        if case == "jitted_ran":
            model(MODELS[model_name].batch(999))  # runs unsharded once: its cache entry must not be reused
    if case == "function":
        fwd = thunder.jit(lambda m, x: loss_fn(m(x)), **user_jit)
        if jit_before_setup:
            torch.manual_seed(0)
            fwd(MODELS[model_name](), MODELS[model_name].batch(999))  # caches a trace with no collectives
    user_handle = model
    model = fabric.setup_module(model)
    if case in ("jitted", "jitted_ran"):
        assert model._forward_module is user_handle, "the user's own ThunderModule must come back"
    forward_module = model._forward_module
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=LR))

    losses, grads, norms = [], None, []
    for step in range(STEPS):
        x = MODELS[model_name].batch(100 * step + rank)
        loss = fwd(model, x) if fwd is not None else loss_fn(model(x))
        optimizer.zero_grad()
        fabric.backward(loss)
        if clip is not None:
            norm = fabric.clip_gradients(model, optimizer, **CLIPS[clip])
            norms.append(None if norm is None else float(norm))
        else:
            norms.append(None)
        if step == 0:
            grads = {n: common.full(p.grad, p) for n, p in common.inner(model).named_parameters()}
        gathered = fabric.all_gather(loss.detach())
        losses.append([float(x) for x in gathered])
        optimizer.step()

    params = common.full_params(model)
    traced = fwd if fwd is not None else forward_module
    fw = thunder.last_traces(traced)[-1]
    bw = thunder.last_backward_traces(traced)[-1]
    ref = _reference(model_name, world, clip, meta)
    return {
        "on_meta_before_setup": on_meta_before_setup,
        "norms": norms,
        "losses": losses,
        "grads": grads,
        "params": params,
        "ref": ref,
        "forward_collectives": collective_counts(fw),
        "backward_collectives": collective_counts(bw),
        "fusions": common.fusion_regions(fw) + common.fusion_regions(bw),
        "region_counts": (len(common.fusion_regions(fw)), len(common.fusion_regions(bw))),
        "captured_fusions": _captured_fusions(fw) if executors is not None else [],
        "decisions": [d.to_dict() for d in strategy.decisions],
        "local_shapes": {n: tuple(p.shape) for n, p in common.inner(model).named_parameters()},
    }


def _captured_fusions(trace: Any) -> list[tuple[str, tuple[str, ...]]]:
    """The fusion regions as the trace model captures them (``OpRecord.fused``)."""
    from thunderviz.thunder.capture.snapshot import snapshot_trace

    return [(op.op, op.fused) for op in snapshot_trace(trace, "forward", memory=False).fusion_regions]


def checkpoint_roundtrip(rank: int, world: int, kind: str, state_dict_type: str, path: str) -> dict[str, Any]:
    """Joint ``fabric.setup(model, optimizer)``, save after 2 steps, load into a fresh model, and compare step 3."""

    def build() -> tuple[Any, Any, Any]:
        fabric = common.fabric(kind, world, state_dict_type=state_dict_type)
        torch.manual_seed(0)
        model = MLP()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        model, optimizer = fabric.setup(model, optimizer)
        return fabric, model, optimizer

    def step(fabric: Any, model: Any, optimizer: Any, i: int) -> None:
        optimizer.zero_grad()
        fabric.backward(loss_fn(model(MLP.batch(10 * i + rank))))
        optimizer.step()

    fabric, model, optimizer = build()
    for i in range(2):
        step(fabric, model, optimizer, i)
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": 2})
    saved = common.full_params(model)
    step(fabric, model, optimizer, 2)
    expected = common.full_params(model)

    fabric2, model2, optimizer2 = build()
    remainder = fabric2.load(path, {"model": model2, "optimizer": optimizer2})
    loaded = common.full_params(model2)
    step(fabric2, model2, optimizer2, 2)
    file_keys = None
    if state_dict_type == "full" and rank == 0:
        raw = torch.load(path, weights_only=True)
        file_keys = {k: tuple(v.shape) for k, v in raw["model"].items()}
    return {
        "saved": saved,
        "loaded": loaded,
        "expected": expected,
        "after": common.full_params(model2),
        "remainder": remainder,
        "file_shapes": file_keys,
    }


def fabric_collectives(rank: int, world: int, kind: str) -> dict[str, Any]:
    fabric = common.fabric(kind, world)
    fabric.barrier()
    reduced = fabric.all_reduce(torch.tensor(float(rank + 1)), reduce_op="sum")
    mean = fabric.all_reduce(torch.tensor(float(rank + 1)))
    obj = fabric.broadcast({"from": rank}, src=0)
    gathered = fabric.all_gather(torch.tensor([rank]))
    return {"sum": float(reduced), "mean": float(mean), "broadcast": obj, "gathered": gathered.flatten().tolist()}


class FrozenHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)
        self.head.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def frozen_and_no_sync(rank: int, world: int, kind: str, case: str) -> dict[str, Any]:
    """Frozen parameters stay put; (DDP) ``no_backward_sync`` accumulates to the same gradient as torch DDP would,
    with no collective in the accumulating backward and one bucketed all_reduce in the next."""
    import thunder

    from thunderviz.thunder import compile_state

    fabric = common.fabric(kind, world, jit=case != "function")
    torch.manual_seed(0)
    model = FrozenHead()
    ref = FrozenHead()
    ref.load_state_dict(model.state_dict())
    fwd = thunder.jit(lambda m, x: loss_fn(m(x))) if case == "function" else None
    model = fabric.setup_module(model)
    run = (lambda x: fwd(model, x)) if fwd is not None else (lambda x: loss_fn(model(x)))
    micro = [
        torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * i + r)) for i in range(2) for r in range(world)
    ]
    mine = [torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * i + rank)) for i in range(2)]
    traced = fwd if fwd is not None else model._forward_module
    with fabric.no_backward_sync(model, enabled=kind == "ddp"):
        fabric.backward(run(mine[0]))
    accumulating = compile_state.comm_buckets(traced)
    fabric.backward(run(mine[1]))
    synced = compile_state.comm_buckets(traced)
    grads = {n: (p.grad is None) for n, p in common.inner(model).named_parameters()}
    got = {n: common.full(p.grad, p) for n, p in common.inner(model).named_parameters() if p.grad is not None}
    expected_loss = sum(loss_fn(ref(x)) for x in micro) / world
    expected_loss.backward()
    expected = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    head_before = {n: p.detach().clone() for n, p in ref.head.named_parameters()}
    optimizer = fabric.setup_optimizers(torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR))
    optimizer.step()
    after = common.full_params(model)
    return {
        "grad_is_none": grads,
        "got": got,
        "expected": expected,
        "head_after": {k[len("head.") :]: v for k, v in after.items() if k.startswith("head.")},
        "head_before": head_before,
        "accumulating_buckets": {k: len(v) for k, v in accumulating.items()},
        "synced_buckets": {k: [b.to_dict() for b in v] for k, v in synced.items()},
    }


def meta_joint_setup(rank: int, world: int, kind: str) -> dict[str, Any]:
    """An optimizer built on the meta-device parameters, then ``fabric.setup(model, optimizer)`` together: the
    optimizer must end up updating the materialized parameters."""
    fabric = common.fabric(kind, world)
    torch.manual_seed(0 if rank == 0 else 77)
    with fabric.init_module(empty_init=True):
        model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    for step in range(STEPS):
        optimizer.zero_grad()
        fabric.backward(loss_fn(model(MLP.batch(100 * step + rank))))
        optimizer.step()
    ref = build_reference_model("mlp", meta=True)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        ref_opt.zero_grad()
        (sum(loss_fn(ref(MLP.batch(100 * step + r))) for r in range(world)) / world).backward()
        ref_opt.step()
    return {
        "got": common.full_params(model),
        "expected": {n: p.detach() for n, p in ref.named_parameters()},
        "optimizer_params_are_model_params": {id(p) for g in optimizer.param_groups for p in g["params"]}
        == {id(p) for p in common.inner(model).parameters()},
    }


def refused_jit_kwargs(rank: int, world: int, kind: str) -> dict[str, Any]:
    """thunder.jit keywords given to the strategy, and a module the user already jitted: refused at setup, logged."""
    import thunder

    from thunderviz.errors import JitDecisionError

    fabric = common.fabric(kind, world, disable_torch_autograd=True)
    try:
        fabric.setup_module(thunder.jit(MLP()))
        message = "no error"
    except JitDecisionError as err:
        message = str(err)
    return {"message": message, "decision": fabric.strategy.decisions[-1].to_dict()}


def features(rank: int, world: int, kind: str, tmp: str) -> dict[str, Any]:
    """Everything but the training matrix, for one strategy kind, in one pair of processes."""
    out: dict[str, Any] = {"collectives": fabric_collectives(rank, world, kind)}
    out["meta_joint_setup"] = meta_joint_setup(rank, world, kind)
    out["refused_jit_kwargs"] = refused_jit_kwargs(rank, world, kind)
    for sdt in ("full", "sharded"):
        out[f"checkpoint_{sdt}"] = checkpoint_roundtrip(rank, world, kind, sdt, f"{tmp}/{kind}-{sdt}.ckpt")
    for case in ("raw", "function"):
        out[f"frozen_{case}"] = frozen_and_no_sync(rank, world, kind, case)
    return out
