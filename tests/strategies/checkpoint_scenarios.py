"""Checkpoint scenarios run inside real rank processes (2 ranks save; 1, 2 and 3 ranks load); plain data comes back."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.strategies import common
from tests.strategies.common import full_params, loss_fn

KINDS = ("fsdp", "ddp")
FORMATS = ("sharded", "full")
OPTIMIZERS = ("sgd", "adamw")


class CkptNet(nn.Module):
    """First dims 7 and 1 (padded when sharded on 2 and 3 ranks) and a 0-dim parameter (sharded as shape (1,))."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 7)
        self.fc2 = nn.Linear(7, 1)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.relu(self.fc1(x)))
        # expand_as, not plain broadcasting: thunder 0.2.6's backward of `h * s` for a *computed* 0-dim `s` (the
        # gathered scalar) hands `s` an unreduced gradient and fails; expand's backward reduces it.
        return h * self.scale.expand_as(h)


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(1000 * step + rank))


def make_optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def _setup(kind: str, world: int, sdt: str, opt: str, seed: int) -> tuple[Any, Any, Any]:
    fabric = common.fabric(kind, world, state_dict_type=sdt)
    torch.manual_seed(seed)
    model = fabric.setup_module(CkptNet())
    optimizer = fabric.setup_optimizers(make_optimizer(opt, model.parameters()))
    return fabric, model, optimizer


def _step(fabric: Any, model: Any, optimizer: Any, step: int, rank: int) -> None:
    optimizer.zero_grad()
    fabric.backward(loss_fn(model(batch(step, rank))))
    optimizer.step()


def full_optimizer_state(model: Any, optimizer: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Per parameter name, the optimizer's state gathered to full size (a collective)."""
    from thunderviz.strategies.checkpoint.full import full_optimizer_state as gather

    names = {id(p): n for n, p in common.inner(model).named_parameters()}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    sd = gather(optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer)

    def copy(v: Any) -> Any:
        return v.detach().clone() if isinstance(v, torch.Tensor) else v  # state_dict() hands out the live tensors

    return {names[id(params[i])]: {k: copy(v) for k, v in entry.items()} for i, entry in sd["state"].items()}


def save_and_resume(rank: int, world: int, kind: str, sdt: str, opt: str, path: str) -> dict[str, Any]:
    """Train 2 steps, save, train 2 more (uninterrupted); then fresh objects load and train the same 2 steps."""
    fabric, model, optimizer = _setup(kind, world, sdt, opt, seed=0)
    for i in range(2):
        _step(fabric, model, optimizer, i, rank)
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": 2, "note": {"text": "hello", "lr": [0.1]}})
    saved = {"params": full_params(model), "optimizer": full_optimizer_state(model, optimizer)}
    for i in range(2, 4):
        _step(fabric, model, optimizer, i, rank)
    uninterrupted = full_params(model)

    fabric2, model2, optimizer2 = _setup(kind, world, sdt, opt, seed=99)  # different values everywhere
    state = {"model": model2, "optimizer": optimizer2, "step": 0}
    remainder = fabric2.load(path, state)
    loaded = {"params": full_params(model2), "optimizer": full_optimizer_state(model2, optimizer2)}
    for i in range(2, 4):
        _step(fabric2, model2, optimizer2, i, rank)
    on_disk = sorted(os.listdir(path)) if os.path.isdir(path) else "file"
    siblings = sorted(p.name for p in Path(path).parent.iterdir() if p.name.startswith(f".{Path(path).name}"))
    return {
        "saved": saved,
        "loaded": loaded,
        "uninterrupted": uninterrupted,
        "resumed": full_params(model2),
        "step": state["step"],
        "remainder": remainder,
        "on_disk": on_disk,
        "siblings": siblings,
    }


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def invalid_settings(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """Every invalid setting raises with the fix; failed saves leave nothing at the path or beside it."""
    out: dict[str, Any] = {}
    fabric, model, optimizer = _setup("fsdp", world, "sharded", "sgd", seed=0)
    full_fabric, full_model, _ = _setup("fsdp", world, "full", "sgd", seed=0)
    a_file = f"{tmp}/a_file.txt"
    a_dir = f"{tmp}/a_dir"
    if rank == 0:
        Path(a_file).write_text("not a checkpoint")
        Path(a_dir).mkdir()
        (Path(a_dir) / "notes.txt").write_text("mine")
    fabric.barrier()
    good = f"{tmp}/good"
    fabric.save(good, {"model": model, "optimizer": optimizer, "step": 1})
    good_full = f"{tmp}/good.pt"
    full_fabric.save(good_full, {"model": full_model, "step": 1})

    out["sharded_to_file"] = _error(lambda: fabric.save(a_file, {"model": model}))
    out["sharded_to_other_dir"] = _error(lambda: fabric.save(a_dir, {"model": model}))
    out["full_to_dir"] = _error(lambda: full_fabric.save(good, {"model": full_model}))
    out["no_model"] = _error(lambda: fabric.save(f"{tmp}/x", {"optimizer": optimizer, "step": 1}))
    other = fabric.setup_module(CkptNet())
    out["two_models"] = _error(lambda: fabric.save(f"{tmp}/x", {"model": model, "ema": other}))
    out["load_empty"] = _error(lambda: fabric.load(good, {}))
    out["load_none"] = _error(lambda: fabric.load(good))
    out["load_unknown_key"] = _error(lambda: fabric.load(good, {"model": model, "scheduler": 3}))
    state = {"model": model, "scheduler": 3}
    out["load_unknown_key_not_strict"] = fabric.load(good, state, strict=False)
    out["load_raw_of_directory"] = _error(lambda: fabric.load_raw(good, model))
    out["load_missing_path"] = _error(lambda: fabric.load(f"{tmp}/nothing", {"model": model}))
    out["load_full_empty"] = _error(lambda: full_fabric.load(good_full, {}))
    out["load_full_none"] = sorted(full_fabric.load(good_full))

    class Wider(CkptNet):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(6, 9)
            self.fc2 = nn.Linear(9, 1)

    wider = fabric.setup_module(Wider())
    out["load_wrong_shape"] = _error(lambda: fabric.load(good, {"model": wider}))

    # A save that fails half-way (a value that cannot be pickled) leaves the old checkpoint untouched.
    before = full_params(model)
    out["failing_sharded_save"] = _error(lambda: fabric.save(good, {"model": model, "bad": lambda: None}))
    out["failing_full_save"] = _error(lambda: full_fabric.save(good_full, {"model": full_model, "bad": lambda: None}))
    out["fresh_failing_save"] = _error(lambda: fabric.save(f"{tmp}/fresh", {"model": model, "bad": lambda: None}))
    fabric.barrier()
    fabric.load(good, {"model": model})
    out["still_loads"] = all(torch.equal(before[k], v) for k, v in full_params(model).items())
    out["leftovers"] = sorted(p.name for p in Path(tmp).iterdir())
    return out


def load_raw_plain(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """``fabric.load_raw`` of a plain one-process state dict (model and optimizer) under both settings."""
    plain_model = CkptNet()
    plain_opt = make_optimizer("adamw", plain_model.parameters())
    plain_opt.zero_grad()
    loss_fn(plain_model(batch(0, 0))).backward()
    plain_opt.step()
    model_file, opt_file = f"{tmp}/plain_model.pt", f"{tmp}/plain_opt.pt"
    if rank == 0:
        torch.save(plain_model.state_dict(), model_file)
        torch.save(plain_opt.state_dict(), opt_file)
    out = {"expected": {n: p.detach().clone() for n, p in plain_model.named_parameters()}}
    for kind in KINDS:
        for sdt in FORMATS:
            fabric, model, optimizer = _setup(kind, world, sdt, "adamw", seed=5)
            fabric.barrier()
            fabric.load_raw(model_file, model)
            fabric.load_raw(opt_file, optimizer)
            state = full_optimizer_state(model, optimizer)
            out[f"{kind}-{sdt}"] = {"params": full_params(model), "exp_avg": state["fc1.weight"]["exp_avg"]}
    out["expected_exp_avg"] = plain_opt.state[plain_model.fc1.weight]["exp_avg"].clone()
    return out


def two_rank_suite(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """Everything that runs on the 2 saving ranks, in one pair of processes."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        for sdt in FORMATS:
            for opt in OPTIMIZERS:
                out[f"{kind}-{sdt}-{opt}"] = save_and_resume(rank, world, kind, sdt, opt, f"{tmp}/{kind}-{sdt}-{opt}")
    os.makedirs(f"{tmp}/errors", exist_ok=True)
    out["errors"] = invalid_settings(rank, world, f"{tmp}/errors")
    out["load_raw"] = load_raw_plain(rank, world, tmp)
    return out


def load_elsewhere(rank: int, world: int, tmp: str, converted: dict[str, str]) -> dict[str, Any]:
    """Load the 2-rank sharded checkpoints (and their one-file conversions) at another world size."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        for opt in OPTIMIZERS:
            name = f"{kind}-sharded-{opt}"
            fabric, model, optimizer = _setup(kind, world, "sharded", opt, seed=7)
            fabric.load(f"{tmp}/{name}", {"model": model, "optimizer": optimizer})
            out[name] = {"params": full_params(model), "optimizer": full_optimizer_state(model, optimizer)}
            if name in converted:
                fabric, model, optimizer = _setup(kind, world, "full", opt, seed=7)
                state = {"model": model, "optimizer": optimizer}
                remainder = fabric.load(converted[name], state)
                out[f"{name}-converted"] = {
                    "params": full_params(model),
                    "optimizer": full_optimizer_state(model, optimizer),
                    "remainder": remainder,
                }
    return out
