"""Checkpoints for models whose parameters our strategies sharded (FSDP) or replicated (DDP) in place.

Two formats, chosen by the strategy's ``state_dict_type`` when saving; loading recognises either by what is on disk
(a file is "full", a directory is "sharded"), so ``fabric.load_raw`` of a plain state dict works with either setting:

- ``"full"``: one ``torch.save`` file of full tensors, written by rank 0: a model's state dict as one process would
  have it, an optimizer's ``state_dict()`` with full-size state (indexed as torch indexes it). Loadable anywhere:
  ``torch.load``, a plain model's ``load_state_dict``, any world size.
- ``"sharded"``: a PyTorch Distributed Checkpoint directory (``torch.distributed.checkpoint``). Every rank writes
  its own shards; each shard is described to DCP as its piece of the global tensor (a ``DTensor`` with ``Shard(0)``
  and the global shape; our dim-0 split is ``torch.chunk``'s, padding excluded), so DCP can load the checkpoint at
  any world size (1, 2, 3, ... ranks, or one plain process) and convert it to one file::

      from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
      dcp_to_torch_save("ckpt_dir", "ckpt.pt")   # one torch.save file; fabric.load / torch.load read it

  The optimizer's state is keyed by parameter name (as ``torch.distributed.checkpoint.state_dict`` keys it), so
  it does not depend on how parameters are split. A small ``thunderviz.json`` beside DCP's files says which entry
  is the model, which the optimizer, which plain values.

Both formats are written to a temporary sibling (``.NAME.thunderviz-partial``) and renamed into place at the end,
so an interrupted save never leaves a half-written checkpoint at ``path``. A checkpoint holds exactly one model
set up by the strategy (the optimizer's state is matched to that model's parameters), like Fabric's own FSDP.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn
from torch.optim import Optimizer

from thunderviz.process_rank import process_rank
from thunderviz.thunder import param_tags
from thunderviz.thunder.comm import distribute
from thunderviz.thunder.modules import user_module

__all__ = ["SIDE_FILE", "CheckpointContext", "load_checkpoint", "save_checkpoint"]

SIDE_FILE = "thunderviz.json"
_FORMAT = "thunderviz-dcp"
_PARTIAL = ".thunderviz-partial"
_OLD = ".thunderviz-old"


@dataclass(frozen=True)
class CheckpointContext:
    """What the checkpoint code needs from the strategy, so it does not depend on Fabric's classes."""

    strategy: str  # class name, for messages
    rank: int
    sharded: bool  # the strategy's state_dict_type == "sharded" (only decides the format when saving)

    @property
    def setting(self) -> str:
        return f"{self.strategy}(state_dict_type={'sharded' if self.sharded else 'full'!r})"


# -- what is in a state ------------------------------------------------------------------------------------------


def is_set_up(obj: Any) -> bool:
    """True for a module whose parameters one of our strategies distributed."""
    return isinstance(obj, nn.Module) and any(param_tags.sync_tag(p) is not None for p in user_module(obj).parameters())


def _the_model(ctx: CheckpointContext, state: dict[str, Any], call: str) -> str:
    keys = [k for k, v in state.items() if is_set_up(v)]
    if not keys:
        raise ValueError(
            f"`{call}` got a state with no model set up by {ctx.strategy} (keys: {sorted(state)}). A checkpoint"
            f" holds one model and what belongs to it: pass the object `fabric.setup` returned, e.g."
            f" `{call.split('(')[0]}(path, {{'model': model, 'optimizer': optimizer}})`."
        )
    if len(keys) > 1:
        raise ValueError(
            f"`{call}` got a state with {len(keys)} models set up by {ctx.strategy} ({', '.join(map(repr, keys))});"
            " a checkpoint holds one model (its optimizer state is matched to that model's parameter names). Save"
            " each model, with its own optimizer, to its own path."
        )
    return keys[0]


def _params_in_order(optimizer: Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in user_module(model).named_parameters()}


def _optimizer_fqns(ctx: CheckpointContext, optimizer: Optimizer, model_key: str, model: nn.Module) -> list[str]:
    names = _names(model)
    fqns = []
    for p in _params_in_order(optimizer):
        if id(p) not in names:
            raise ValueError(
                f"The optimizer in this checkpoint state updates a parameter of shape {tuple(p.shape)} that is not"
                f" in the model {model_key!r}. Build the optimizer from `model.parameters()` of the model that"
                " `fabric.setup` returned, and save it together with that model."
            )
        fqns.append(names[id(p)])
    return fqns


def _type_name(obj: Any) -> str:
    return type(user_module(obj) if isinstance(obj, nn.Module) else obj).__name__


def _is_per_element(value: Any, param: torch.Tensor) -> bool:
    """A local optimizer-state tensor that holds one value per element of ``param``'s shard."""
    return isinstance(value, torch.Tensor) and distribute.is_sharded(param) and value.shape == param.shape


def _is_full_per_element(name: str, value: Any, param: torch.Tensor) -> bool:
    """A full-size optimizer-state tensor to be sharded like ``param``. For a 0-dim parameter the per-element state
    and the scalar ``step`` have the same shape; torch's optimizers name their scalar state ``step``."""
    if not (isinstance(value, torch.Tensor) and distribute.is_sharded(param)):
        return False
    return tuple(value.shape) == param_tags.full_shape(param) and (value.dim() > 0 or name != "step")


# -- paths -------------------------------------------------------------------------------------------------------


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}{suffix}")


def _is_dcp(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file()


def _check_save_target(ctx: CheckpointContext, path: Path) -> None:
    call = f"fabric.save({str(path)!r}, ...)"
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(
                f"`{call}`: {str(parent)!r} is a file, so nothing can be saved below it. Choose another path."
            )
    if ctx.sharded:
        if path.is_file():
            raise ValueError(
                f"`{call}`: the path is a file, but {ctx.setting} writes a directory (PyTorch Distributed"
                " Checkpoint). Choose another path, remove the file, or set `state_dict_type='full'` to write one"
                " file."
            )
        if path.is_dir() and any(path.iterdir()) and not _is_dcp(path):
            raise ValueError(
                f"`{call}`: the path is a directory that is not a checkpoint, and saving would replace everything"
                " in it. Choose a new path (or remove the directory yourself)."
            )
    elif path.is_dir():
        raise ValueError(
            f"`{call}`: the path is a directory, but {ctx.setting} writes one file. Choose a file path, or set"
            " `state_dict_type='sharded'` to write a PyTorch Distributed Checkpoint directory."
        )


def _on_rank0(ctx: CheckpointContext, fn: Callable[[], None]) -> None:
    """Run ``fn`` on rank 0 only and make every rank raise if it failed (so no rank waits for a broken one)."""
    error = None
    if ctx.rank == 0:
        try:
            fn()
        except Exception as err:
            error = err
    if tdist.is_initialized():
        box = [None if error is None else f"{type(error).__name__}: {error}"]
        tdist.broadcast_object_list(box, src=0)
        if box[0] is not None and error is None:
            raise RuntimeError(f"`fabric.save` failed on rank 0: {box[0]}")
    if error is not None:
        raise error


def _plain_error(err: BaseException, call: str, consequence: str) -> BaseException:
    """DCP reports failures as ``CheckpointException``, a ``BaseException`` that ``except Exception`` does not catch;
    turn it into a ``RuntimeError`` naming the ranks and the first cause. Anything else passes through."""
    from torch.distributed.checkpoint.api import CheckpointException

    if not isinstance(err, CheckpointException):
        return err
    failures = err.failures
    first = next(iter(failures.values()), None)
    exc = first[0] if isinstance(first, tuple) else first
    cause = f"{type(exc).__name__}: {exc}" if exc is not None else str(err)
    return RuntimeError(
        f"`{call}` failed in PyTorch Distributed Checkpoint on rank(s) {sorted(failures)}: {cause} ({consequence})."
    )


# -- saving ------------------------------------------------------------------------------------------------------


def save_checkpoint(
    ctx: CheckpointContext,
    path: str | os.PathLike,
    state: dict[str, Any],
    filters: dict[str, Callable[[str, Any], bool]] | None = None,
) -> None:
    """``fabric.save``: write ``state`` (modules and optimizers converted to state dicts) in the strategy's format."""
    path = Path(path)
    model_key = _the_model(ctx, state, "fabric.save(path, state)")
    _check_save_target(ctx, path)
    if ctx.sharded:
        _save_sharded(ctx, path, state, model_key, filters or {})
    else:
        _save_full(ctx, path, state, model_key, filters or {})


def _filtered(key: str, sd: Any, filters: dict[str, Callable[[str, Any], bool]]) -> Any:
    if key in filters and isinstance(sd, dict):
        return {k: v for k, v in sd.items() if filters[key](k, v)}
    return sd


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
    params = _params_in_order(optimizer)
    state = {}
    for idx, entry in sd["state"].items():
        param = params[idx]
        state[idx] = {k: distribute.gather_full(v, param) if _is_per_element(v, param) else v for k, v in entry.items()}
    return {"state": state, "param_groups": sd["param_groups"]} if keep else {}


def _save_full(
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
        converted[key] = _filtered(key, sd, filters)

    def write() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _sibling(path, _PARTIAL)
        try:
            torch.save(converted, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    _on_rank0(ctx, write)


def _mesh(group: tdist.ProcessGroup, device: torch.device, cache: dict[int, Any]) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    if id(group) not in cache:
        cache[id(group)] = DeviceMesh.from_group(group, device.type)
    return cache[id(group)]


def _global_view(tensor: torch.Tensor, like: torch.Tensor, meshes: dict[int, Any]) -> torch.Tensor:
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


def _save_sharded(
    ctx: CheckpointContext, path: Path, state: dict[str, Any], model_key: str, filters: dict[str, Callable]
) -> None:
    import torch.distributed.checkpoint as dcp

    meshes: dict[int, Any] = {}
    entries: dict[str, str] = {}
    converted: dict[str, Any] = {}
    for key, obj in state.items():
        if isinstance(obj, nn.Module):
            module = user_module(obj)
            sd = {n: _global_view(t.detach(), t, meshes) for n, t in module.state_dict(keep_vars=True).items()}
            entries[key] = "model" if key == model_key else "object"
        elif isinstance(obj, Optimizer):
            fqns = _optimizer_fqns(ctx, obj, model_key, state[model_key])
            params = _params_in_order(obj)
            raw = obj.state_dict()
            sd = {
                "state": {
                    fqns[idx]: {
                        k: _global_view(v, params[idx], meshes) if _is_per_element(v, params[idx]) else v
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
        converted[key] = _filtered(key, sd, filters)

    tmp = _sibling(path, _PARTIAL)

    def prepare() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)

    _on_rank0(ctx, prepare)
    try:
        dcp.save(converted, checkpoint_id=tmp)
    except BaseException as err:
        if ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _plain_error(err, f"fabric.save({str(path)!r}, ...)", f"nothing was written at {str(path)!r}") from err

    def finish() -> None:
        world = process_rank().world_size
        side = {"format": _FORMAT, "version": 1, "saved_world_size": world, "entries": entries}
        (tmp / SIDE_FILE).write_text(json.dumps(side, indent=1))
        old = _sibling(path, _OLD)
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)

    try:
        _on_rank0(ctx, finish)
    finally:
        if ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


# -- loading -----------------------------------------------------------------------------------------------------


def load_checkpoint(
    ctx: CheckpointContext,
    path: str | os.PathLike,
    state: nn.Module | Optimizer | dict[str, Any] | None,
    strict: bool = True,
    weights_only: bool | None = None,
) -> dict[str, Any]:
    """``fabric.load`` / ``fabric.load_raw``: restore ``state`` in place; return what the checkpoint holds beyond it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"`fabric.load({str(path)!r}, ...)`: no checkpoint at this path.")
    raw = isinstance(state, (nn.Module, Optimizer))
    if path.is_dir():
        if not _is_dcp(path):
            raise ValueError(
                f"`fabric.load({str(path)!r}, ...)`: the directory is not a PyTorch Distributed Checkpoint (no"
                " .metadata file). Pass the directory `fabric.save` wrote with `state_dict_type='sharded'`, or a"
                " checkpoint file."
            )
        if raw:
            raise ValueError(
                f"`fabric.load_raw({str(path)!r}, {_type_name(state)})` reads one file holding a plain state"
                " dict, but this is a sharded checkpoint directory. Use `fabric.load(path, {'model': model,"
                " 'optimizer': optimizer})`, or convert it to one file first: `from"
                " torch.distributed.checkpoint.format_utils import dcp_to_torch_save; dcp_to_torch_save(path,"
                " 'full.pt')`."
            )
        return _load_sharded(ctx, path, state, strict)
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
    model_key = _the_model(ctx, state, "fabric.load(path, state)")
    _check_requested(path, state, set(checkpoint), strict)
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


def _check_requested(path: Path, state: dict[str, Any], present: set[str], strict: bool) -> None:
    absent = sorted(set(state) - present)
    if strict and absent:
        raise ValueError(
            f"`fabric.load({str(path)!r}, state)`: the checkpoint has no {', '.join(map(repr, absent))} (it holds"
            f" {', '.join(map(repr, sorted(present))) or 'nothing'}). Remove them from `state`, or pass"
            " `strict=False` to load only what is there."
        )


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
    params = _params_in_order(optimizer)
    state = sd["state"]
    groups = sd["param_groups"]
    if any(isinstance(k, str) for k in state) or any(isinstance(p, str) for g in groups for p in g["params"]):
        if model is None:
            raise ValueError(
                "This optimizer state is keyed by parameter name; load it together with its model:"
                " `fabric.load(path, {'model': model, 'optimizer': optimizer})`."
            )
        names = _names(model)
        index = {names[id(p)]: i for i, p in enumerate(params) if id(p) in names}
        state = {index[k]: v for k, v in state.items()}
        groups = [{**g, "params": [index[p] for p in g["params"]]} for g in groups]
    local = {}
    for idx, entry in state.items():
        param = params[int(idx)]
        local[int(idx)] = {
            k: distribute.local_shard_of(v, param) if _is_full_per_element(k, v, param) else v for k, v in entry.items()
        }
    optimizer.load_state_dict({"state": local, "param_groups": groups})


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


def _load_sharded(ctx: CheckpointContext, path: Path, state: dict[str, Any] | None, strict: bool) -> dict[str, Any]:
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
    model_key = _the_model(ctx, state, "fabric.load(path, state)")
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    paths: dict[str, tuple] = metadata.planner_data or {}
    side_file = path / SIDE_FILE
    entries: dict[str, str] = json.loads(side_file.read_text())["entries"] if side_file.is_file() else {}
    present = {p[0] for p in paths.values()}
    _check_requested(path, state, present, strict)

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
        raise _plain_error(err, call, "the objects in `state` may be partly loaded; load again") from err

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
            target[name] = _global_view(t.detach(), t, meshes)
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

    params = _params_in_order(optimizer)
    names = _names(model)
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
            per_element = _is_full_per_element(name, torch.empty(md.size, device="meta"), param)
            if per_element and shape:
                local = torch.zeros(param.shape, dtype=md.properties.dtype, device=param.device)
                entry_target[name] = _global_view(local, param, meshes)
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
