"""What a checkpoint's state holds, and how either format is written safely: the parts "full" and "sharded" share.

The state is what ``fabric.save`` / ``fabric.load`` get: a dict of one model set up by our strategy, its optimizer
(its parameters named as the model names them) and plain values. A checkpoint is written to a temporary sibling
(``.NAME.thunderviz-partial``) and renamed into place at the end, by rank 0 where one process writes, with every
rank raising when it failed; DCP's own failures become a plain ``RuntimeError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn
from torch.optim import Optimizer

from thunderviz.thunder import param_tags
from thunderviz.thunder.comm import distribute
from thunderviz.thunder.modules import user_module

__all__ = [
    "OLD",
    "PARTIAL",
    "SIDE_FILE",
    "CheckpointContext",
    "check_requested",
    "check_save_target",
    "filtered",
    "is_dcp",
    "is_full_per_element",
    "is_per_element",
    "is_set_up",
    "on_rank0",
    "optimizer_fqns",
    "parameter_names",
    "params_in_order",
    "plain_error",
    "sibling",
    "the_model",
    "type_name",
]

#: The side file beside DCP's files in a sharded checkpoint: which entry is the model, the optimizer, plain values.
SIDE_FILE = "thunderviz.json"
FORMAT = "thunderviz-dcp"
#: Suffixes of the hidden siblings a save writes into (``PARTIAL``) and moves an older checkpoint aside to (``OLD``).
PARTIAL = ".thunderviz-partial"
OLD = ".thunderviz-old"


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


def the_model(ctx: CheckpointContext, state: dict[str, Any], call: str) -> str:
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


def params_in_order(optimizer: Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def parameter_names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in user_module(model).named_parameters()}


def optimizer_fqns(ctx: CheckpointContext, optimizer: Optimizer, model_key: str, model: nn.Module) -> list[str]:
    names = parameter_names(model)
    fqns = []
    for p in params_in_order(optimizer):
        if id(p) not in names:
            raise ValueError(
                f"The optimizer in this checkpoint state updates a parameter of shape {tuple(p.shape)} that is not"
                f" in the model {model_key!r}. Build the optimizer from `model.parameters()` of the model that"
                " `fabric.setup` returned, and save it together with that model."
            )
        fqns.append(names[id(p)])
    return fqns


def type_name(obj: Any) -> str:
    return type(user_module(obj) if isinstance(obj, nn.Module) else obj).__name__


def is_per_element(value: Any, param: torch.Tensor) -> bool:
    """A local optimizer-state tensor that holds one value per element of ``param``'s shard."""
    return isinstance(value, torch.Tensor) and distribute.is_sharded(param) and value.shape == param.shape


def is_full_per_element(name: str, value: Any, param: torch.Tensor) -> bool:
    """A full-size optimizer-state tensor to be sharded like ``param``. For a 0-dim parameter the per-element state
    and the scalar ``step`` have the same shape; torch's optimizers name their scalar state ``step``."""
    if not (isinstance(value, torch.Tensor) and distribute.is_sharded(param)):
        return False
    return tuple(value.shape) == param_tags.full_shape(param) and (value.dim() > 0 or name != "step")


def filtered(key: str, sd: Any, filters: dict[str, Callable[[str, Any], bool]]) -> Any:
    if key in filters and isinstance(sd, dict):
        return {k: v for k, v in sd.items() if filters[key](k, v)}
    return sd


def check_requested(path: Path, state: dict[str, Any], present: set[str], strict: bool) -> None:
    absent = sorted(set(state) - present)
    if strict and absent:
        raise ValueError(
            f"`fabric.load({str(path)!r}, state)`: the checkpoint has no {', '.join(map(repr, absent))} (it holds"
            f" {', '.join(map(repr, sorted(present))) or 'nothing'}). Remove them from `state`, or pass"
            " `strict=False` to load only what is there."
        )


# -- paths and writes --------------------------------------------------------------------------------------------


def sibling(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}{suffix}")


def is_dcp(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file()


def check_save_target(ctx: CheckpointContext, path: Path) -> None:
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
        if path.is_dir() and any(path.iterdir()) and not is_dcp(path):
            raise ValueError(
                f"`{call}`: the path is a directory that is not a checkpoint, and saving would replace everything"
                " in it. Choose a new path (or remove the directory yourself)."
            )
    elif path.is_dir():
        raise ValueError(
            f"`{call}`: the path is a directory, but {ctx.setting} writes one file. Choose a file path, or set"
            " `state_dict_type='sharded'` to write a PyTorch Distributed Checkpoint directory."
        )


def on_rank0(ctx: CheckpointContext, fn: Callable[[], None]) -> None:
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


def plain_error(err: BaseException, call: str, consequence: str) -> BaseException:
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
