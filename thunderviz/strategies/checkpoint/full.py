"""The "full" format: one ``torch.save`` file of full tensors, written by rank 0, loadable anywhere.

A model's state dict as one process would have it, an optimizer's ``state_dict()`` with full-size state (indexed as
torch indexes it): ``torch.load``, a plain model's ``load_state_dict``, any world size. Saving gathers each sharded
tensor (a collective every rank takes part in; only rank 0 keeps the result); loading copies each rank's piece of the
full tensors into its local shards or replicas.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from thunderviz.strategies.checkpoint.state import (
    PARTIAL,
    CheckpointContext,
    check_requested,
    filtered,
    is_full_per_element,
    is_per_element,
    is_set_up,
    on_rank0,
    parameter_names,
    params_in_order,
    sibling,
    the_model,
)
from thunderviz.thunder import param_tags
from thunderviz.thunder.comm import distribute
from thunderviz.thunder.modules import user_module

__all__ = [
    "full_module_state",
    "full_optimizer_state",
    "load_full",
    "load_full_module",
    "load_full_optimizer",
    "save_full",
]


def full_module_state(module: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """The model's state dict with full tensors (a collective for sharded parameters); empty where ``keep`` is False."""
    out = {}
    for name, t in user_module(module).state_dict(keep_vars=True).items():
        full = distribute.gather_full(t.detach(), t)
        if keep:
            out[name] = full
    return out


def full_optimizer_state(optimizer: Optimizer, keep: bool = True) -> dict[str, Any]:
    """``optimizer.state_dict()`` with per-element state gathered to full size (a collective when sharded)."""
    sd = optimizer.state_dict()
    params = params_in_order(optimizer)
    state = {}
    for idx, entry in sd["state"].items():
        param = params[idx]
        state[idx] = {k: distribute.gather_full(v, param) if is_per_element(v, param) else v for k, v in entry.items()}
    return {"state": state, "param_groups": sd["param_groups"]} if keep else {}


def save_full(
    ctx: CheckpointContext, path: Path, state: dict[str, Any], model_key: str, filters: dict[str, Callable]
) -> None:
    keep = ctx.rank == 0  # every rank takes part in the gathers; only rank 0 keeps the full tensors
    converted: dict[str, Any] = {}
    for key, obj in state.items():
        if isinstance(obj, nn.Module):
            sd = full_module_state(obj, keep) if is_set_up(obj) else obj.state_dict()
        elif isinstance(obj, Optimizer):
            sd = full_optimizer_state(obj, keep)
        elif hasattr(obj, "state_dict") and callable(obj.state_dict):
            sd = obj.state_dict()
        else:
            sd = obj
        converted[key] = filtered(key, sd, filters)

    def write() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = sibling(path, PARTIAL)
        try:
            torch.save(converted, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    on_rank0(ctx, write)


def load_full(
    ctx: CheckpointContext,
    path: Path,
    state: nn.Module | Optimizer | dict[str, Any] | None,
    strict: bool,
    weights_only: bool | None,
) -> dict[str, Any]:
    """``fabric.load`` / ``fabric.load_raw`` of a "full" checkpoint file: restore ``state`` in place; return what the
    file holds beyond it (the whole file without a state)."""
    raw = isinstance(state, (nn.Module, Optimizer))
    checkpoint = torch.load(path, map_location="cpu", weights_only=weights_only)
    if raw:
        if isinstance(state, nn.Module):
            load_full_module(state, checkpoint, strict=strict, what=f"fabric.load_raw({str(path)!r}, model)")
        else:
            load_full_optimizer(state, checkpoint, None)
        return {}
    if state is None:
        return checkpoint
    if not state:
        raise ValueError(
            f"`fabric.load({str(path)!r}, state={{}})` asks to restore nothing. Pass the objects to restore, e.g."
            " `{'model': model, 'optimizer': optimizer}`, or call `fabric.load(path)` without a state to get the"
            " whole checkpoint as a dict."
        )
    model_key = the_model(ctx, state, "fabric.load(path, state)")
    check_requested(path, state, set(checkpoint), strict)
    for key, obj in list(state.items()):
        if key not in checkpoint:
            continue
        value = checkpoint.pop(key)
        if isinstance(obj, nn.Module):
            load_full_module(obj, value, strict=strict, what=f"fabric.load({str(path)!r}, {{{key!r}: ...}})")
        elif isinstance(obj, Optimizer):
            load_full_optimizer(obj, value, state[model_key])
        elif hasattr(obj, "load_state_dict") and callable(obj.load_state_dict):
            obj.load_state_dict(value)
        else:
            state[key] = value
    return checkpoint


def load_full_module(module: nn.Module, sd: dict[str, Any], *, strict: bool, what: str) -> None:
    """Copy a full (one-process) state dict into a model's local shards or replicas."""
    if not isinstance(sd, dict):
        raise TypeError(f"`{what}`: expected a model state dict, found a {type(sd).__name__}.")
    own = user_module(module).state_dict(keep_vars=True)
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    if strict and (missing or unexpected):
        raise ValueError(
            f"`{what}`: the checkpoint does not match the model: missing keys {missing}, unexpected keys"
            f" {unexpected}. Load a checkpoint of this model, or pass `strict=False` to load the keys that match."
        )
    for k, target in own.items():
        if k in sd and tuple(sd[k].shape) != param_tags.full_shape(target):
            raise ValueError(
                f"`{what}`: {k!r} has shape {tuple(sd[k].shape)} in the checkpoint but {param_tags.full_shape(target)}"
                " in the model. Load a checkpoint of this model (same configuration)."
            )
    with torch.no_grad():
        for k, target in own.items():
            if k in sd:
                target.data.copy_(distribute.local_shard_of(sd[k], target).to(target.device))


def load_full_optimizer(optimizer: Optimizer, sd: dict[str, Any], model: nn.Module | None) -> None:
    """Load a full optimizer state dict (indexed as torch indexes it, or by parameter name as DCP's conversion
    writes it) into an optimizer over local shards."""
    params = params_in_order(optimizer)
    state = sd["state"]
    groups = sd["param_groups"]
    if any(isinstance(k, str) for k in state) or any(isinstance(p, str) for g in groups for p in g["params"]):
        if model is None:
            raise ValueError(
                "This optimizer state is keyed by parameter name; load it together with its model:"
                " `fabric.load(path, {'model': model, 'optimizer': optimizer})`."
            )
        names = parameter_names(model)
        index = {names[id(p)]: i for i, p in enumerate(params) if id(p) in names}
        state = {index[k]: v for k, v in state.items()}
        groups = [{**g, "params": [index[p] for p in g["params"]]} for g in groups]
    local = {}
    for idx, entry in state.items():
        param = params[int(idx)]
        local[int(idx)] = {
            k: distribute.local_shard_of(v, param) if is_full_per_element(k, v, param) else v for k, v in entry.items()
        }
    optimizer.load_state_dict({"state": local, "param_groups": groups})
