"""The "sharded" format: a PyTorch Distributed Checkpoint directory (``torch.distributed.checkpoint``).

Every rank writes its own shards; each shard is described to DCP as its piece of the global tensor (a ``DTensor`` with
``Shard(0)`` and the global shape; our dim-0 split is ``torch.chunk``'s, padding excluded), so DCP can load the
checkpoint at any world size (1, 2, 3, ... ranks, or one plain process). The optimizer's state is keyed by parameter
name (as ``torch.distributed.checkpoint.state_dict`` keys it), so it does not depend on how parameters are split. A
small ``thunderviz.json`` beside DCP's files (``state.SIDE_FILE``) says which entry is the model, which the optimizer,
which plain values.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn
from torch.optim import Optimizer

from thunderviz.process_rank import process_rank
from thunderviz.strategies.checkpoint.state import (
    FORMAT,
    OLD,
    PARTIAL,
    SIDE_FILE,
    CheckpointContext,
    check_requested,
    filtered,
    is_full_per_element,
    is_per_element,
    on_rank0,
    optimizer_fqns,
    parameter_names,
    params_in_order,
    plain_error,
    sibling,
    the_model,
)
from thunderviz.thunder import param_tags
from thunderviz.thunder.comm import distribute
from thunderviz.thunder.modules import user_module

__all__ = ["global_view", "load_sharded", "save_sharded"]


def _mesh(group: tdist.ProcessGroup, device: torch.device, cache: dict[int, Any]) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    if id(group) not in cache:
        cache[id(group)] = DeviceMesh.from_group(group, device.type)
    return cache[id(group)]


def global_view(tensor: torch.Tensor, like: torch.Tensor, meshes: dict[int, Any]) -> torch.Tensor:
    """How DCP should see a local tensor shaped like ``like``'s shard: the global tensor it is a piece of.

    Sharded: a DTensor over this rank's real rows (padding excluded), sharing their storage so loading writes in
    place. A 0-dim parameter's shard cannot be a dim-0 piece: it is gathered (every rank, a collective). Anything
    replicated is a plain tensor, which DCP saves once and loads on every rank.
    """
    if not distribute.is_sharded(like):
        return tensor
    shape = param_tags.full_shape(like)
    if not shape:
        return distribute.gather_full(tensor, like)
    from torch.distributed.tensor import DTensor, Shard

    local = distribute.unpadded(tensor.detach(), like)
    stride = torch.empty(shape, device="meta").stride()
    mesh = _mesh(param_tags.param_group(like), tensor.device, meshes)
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=stride)


def save_sharded(
    ctx: CheckpointContext, path: Path, state: dict[str, Any], model_key: str, filters: dict[str, Callable]
) -> None:
    import torch.distributed.checkpoint as dcp

    meshes: dict[int, Any] = {}
    entries: dict[str, str] = {}
    converted: dict[str, Any] = {}
    for key, obj in state.items():
        if isinstance(obj, nn.Module):
            module = user_module(obj)
            sd = {n: global_view(t.detach(), t, meshes) for n, t in module.state_dict(keep_vars=True).items()}
            entries[key] = "model" if key == model_key else "object"
        elif isinstance(obj, Optimizer):
            fqns = optimizer_fqns(ctx, obj, model_key, state[model_key])
            params = params_in_order(obj)
            raw = obj.state_dict()
            sd = {
                "state": {
                    fqns[idx]: {
                        k: global_view(v, params[idx], meshes) if is_per_element(v, params[idx]) else v
                        for k, v in entry.items()
                    }
                    for idx, entry in raw["state"].items()
                },
                "param_groups": [{**g, "params": [fqns[i] for i in g["params"]]} for g in raw["param_groups"]],
            }
            entries[key] = "optimizer"
        elif hasattr(obj, "state_dict") and callable(obj.state_dict):
            sd, entries[key] = obj.state_dict(), "object"
        else:
            sd, entries[key] = obj, "object"
        converted[key] = filtered(key, sd, filters)

    tmp = sibling(path, PARTIAL)

    def prepare() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)

    on_rank0(ctx, prepare)
    try:
        dcp.save(converted, checkpoint_id=tmp)
    except BaseException as err:
        if ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise plain_error(err, f"fabric.save({str(path)!r}, ...)", f"nothing was written at {str(path)!r}") from err

    def finish() -> None:
        world = process_rank().world_size
        side = {"format": FORMAT, "version": 1, "saved_world_size": world, "entries": entries}
        (tmp / SIDE_FILE).write_text(json.dumps(side, indent=1))
        old = sibling(path, OLD)
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)

    try:
        on_rank0(ctx, finish)
    finally:
        if ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def _set_path(root: dict[str, Any], path: tuple, value: Any) -> None:
    node: Any = root
    for here, nxt in itertools.pairwise(path):
        if isinstance(node, list):
            while len(node) <= here:
                node.append(None)
            if node[here] is None:
                node[here] = [] if isinstance(nxt, int) else {}
            node = node[here]
        else:
            node = node.setdefault(here, [] if isinstance(nxt, int) else {})
    last = path[-1]
    if isinstance(node, list):
        while len(node) <= last:
            node.append(None)
    node[last] = value


def _from_metadata(metadata: Any, paths: dict[str, tuple], prefix: tuple) -> Any:
    """A load target for the saved entry at ``prefix`` as it was saved: empty tensors of the saved global shapes,
    placeholders for plain values. Used for plain entries, where there is nothing of ours to load into in place."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    root: dict[str, Any] = {}
    n = len(prefix)
    for flat, path in paths.items():
        if path[:n] != prefix:
            continue
        md = metadata.state_dict_metadata[flat]
        value = torch.empty(md.size, dtype=md.properties.dtype) if isinstance(md, TensorStorageMetadata) else None
        _set_path(root, path, value)
    node: Any = root
    for part in prefix:
        node = node[part]
    return node


def load_sharded(ctx: CheckpointContext, path: Path, state: dict[str, Any] | None, strict: bool) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    call = f"fabric.load({str(path)!r}, state)"
    if not state:
        raise ValueError(
            f"`{call}` got state={state!r}, but a sharded checkpoint is loaded into the objects it restores. Pass"
            " them: `fabric.load(path, {'model': model, 'optimizer': optimizer})`. To read it as one dict instead,"
            " convert it first: `from torch.distributed.checkpoint.format_utils import dcp_to_torch_save;"
            " dcp_to_torch_save(path, 'full.pt')`, then `torch.load('full.pt')`."
        )
    model_key = the_model(ctx, state, "fabric.load(path, state)")
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    paths: dict[str, tuple] = metadata.planner_data or {}
    side_file = path / SIDE_FILE
    entries: dict[str, str] = json.loads(side_file.read_text())["entries"] if side_file.is_file() else {}
    present = {p[0] for p in paths.values()}
    check_requested(path, state, present, strict)

    def saved(prefix: tuple) -> dict[tuple, Any]:
        n = len(prefix)
        return {p[n:]: metadata.state_dict_metadata[f] for f, p in paths.items() if p[:n] == prefix}

    def check_shape(where: str, md: Any, shape: tuple[int, ...]) -> None:
        if not isinstance(md, TensorStorageMetadata) or tuple(md.size) != tuple(shape):
            found = tuple(md.size) if isinstance(md, TensorStorageMetadata) else "a non-tensor value"
            raise ValueError(
                f"`{call}`: {where} is {found} in the checkpoint but {tuple(shape)} here. Load a checkpoint of"
                " this model and optimizer (same configuration); the world size may differ."
            )

    meshes: dict[int, Any] = {}
    target: dict[str, Any] = {}
    after: list[Callable[[], None]] = []
    for key, obj in state.items():
        if key not in present:
            continue
        if isinstance(obj, nn.Module):
            target[key] = _module_target(call, key, obj, saved((key,)), strict, check_shape, meshes, after)
        elif isinstance(obj, Optimizer):
            target[key] = _optimizer_target(
                call, key, obj, state[model_key], saved((key,)), metadata, paths, check_shape, meshes, after
            )
        else:
            target[key] = _from_metadata(metadata, paths, (key,))
    remainder_keys = [k for k in sorted(present - set(state)) if entries.get(k, "object") == "object"]
    for key in remainder_keys:
        target[key] = _from_metadata(metadata, paths, (key,))

    try:
        dcp.load(target, checkpoint_id=str(path))
    except BaseException as err:
        raise plain_error(err, call, "the objects in `state` may be partly loaded; load again") from err

    for fn in after:
        fn()
    for key, obj in state.items():
        if key not in target or isinstance(obj, (nn.Module, Optimizer)):
            continue
        if hasattr(obj, "load_state_dict") and callable(obj.load_state_dict):
            obj.load_state_dict(target[key])
        else:
            state[key] = target[key]
    return {k: target[k] for k in remainder_keys}


def _module_target(
    call: str,
    key: str,
    module: nn.Module,
    saved: dict[tuple, Any],
    strict: bool,
    check_shape: Callable[[str, Any, tuple[int, ...]], None],
    meshes: dict[int, Any],
    after: list[Callable[[], None]],
) -> dict[str, Any]:
    own = user_module(module).state_dict(keep_vars=True)
    in_file = {p[0] for p in saved}
    missing, unexpected = sorted(set(own) - in_file), sorted(in_file - set(own))
    if strict and (missing or unexpected):
        raise ValueError(
            f"`{call}`: the checkpoint's {key!r} does not match the model: missing keys {missing}, unexpected keys"
            f" {unexpected}. Load a checkpoint of this model, or pass `strict=False` to load the keys that match."
        )
    target: dict[str, Any] = {}
    for name, t in own.items():
        if (name,) not in saved:
            continue
        check_shape(f"{key}.{name}", saved[(name,)], param_tags.full_shape(t))
        if distribute.is_sharded(t) and not param_tags.full_shape(t):
            full = torch.empty((), dtype=t.dtype)
            target[name] = full

            def copy_back(t: torch.Tensor = t, full: torch.Tensor = full) -> None:
                with torch.no_grad():
                    t.data.copy_(distribute.local_shard_of(full, t).to(t.device))

            after.append(copy_back)
        else:
            target[name] = global_view(t.detach(), t, meshes)
    return target


def _optimizer_target(
    call: str,
    key: str,
    optimizer: Optimizer,
    model: nn.Module,
    saved: dict[tuple, Any],
    metadata: Any,
    paths: dict[str, tuple],
    check_shape: Callable[[str, Any, tuple[int, ...]], None],
    meshes: dict[int, Any],
    after: list[Callable[[], None]],
) -> dict[str, Any]:
    """Targets for an optimizer's state, built from this rank's parameters (each per-element tensor a fresh padded
    shard, loaded through a DTensor view), then handed to ``optimizer.load_state_dict`` in torch's own indexing."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    params = params_in_order(optimizer)
    names = parameter_names(model)
    index = {names[id(p)]: i for i, p in enumerate(params) if id(p) in names}
    saved_state: dict[str, dict[str, Any]] = {}
    for p, md in saved.items():
        if p[0] == "state" and len(p) == 3:
            saved_state.setdefault(p[1], {})[p[2]] = md
    unknown = sorted(set(saved_state) - set(index))
    if unknown:
        raise ValueError(
            f"`{call}`: the checkpoint's {key!r} holds state for {unknown[:5]}, which this optimizer does not"
            " update. Build the optimizer over the same parameters it was saved with."
        )
    local_state: dict[int, dict[str, Any]] = {}
    state_target: dict[str, dict[str, Any]] = {}
    for fqn, items in saved_state.items():
        param = params[index[fqn]]
        entry_target: dict[str, Any] = {}
        local_entry: dict[str, Any] = {}
        for name, md in items.items():
            if not isinstance(md, TensorStorageMetadata):
                entry_target[name] = None
                continue
            shape = param_tags.full_shape(param)
            per_element = is_full_per_element(name, torch.empty(md.size, device="meta"), param)
            if per_element and shape:
                local = torch.zeros(param.shape, dtype=md.properties.dtype, device=param.device)
                entry_target[name] = global_view(local, param, meshes)
                local_entry[name] = local
            else:
                entry_target[name] = torch.empty(md.size, dtype=md.properties.dtype)
                if per_element:  # 0-dim parameter: the full () value becomes this rank's (1,) shard after loading
                    local_entry[name] = ("shard", entry_target[name])
        state_target[fqn] = entry_target
        local_state[index[fqn]] = local_entry
    groups_target = _from_metadata(metadata, paths, (key, "param_groups"))
    target = {"state": state_target, "param_groups": groups_target}

    def apply() -> None:
        groups = target["param_groups"]
        if len(groups) != len(optimizer.param_groups):
            raise ValueError(
                f"`{call}`: the checkpoint's {key!r} has {len(groups)} parameter groups, this optimizer"
                f" {len(optimizer.param_groups)}. Build the optimizer with the same groups it was saved with."
            )
        sd_state: dict[int, dict[str, Any]] = {}
        for fqn, entry in target["state"].items():
            idx = index[fqn]
            param = params[idx]
            out = {}
            for name, value in entry.items():
                held = local_state[idx].get(name)
                if isinstance(held, tuple):
                    out[name] = distribute.local_shard_of(held[1], param)
                elif held is not None:
                    out[name] = held
                else:
                    out[name] = value
            sd_state[idx] = out
        sd_groups = []
        for g in groups:
            absent = [p for p in g["params"] if p not in index]
            if absent:
                raise ValueError(
                    f"`{call}`: the checkpoint's {key!r} updates {absent[:5]}, which this optimizer does not."
                    " Build the optimizer over the same parameters it was saved with."
                )
            sd_groups.append({**g, "params": [index[p] for p in g["params"]]})
        optimizer.load_state_dict({"state": sd_state, "param_groups": sd_groups})

    after.append(apply)
    return target
