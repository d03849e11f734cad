"""``fabric.save`` and ``fabric.load`` for models whose parameters our strategies sharded (FSDP) or replicated (DDP)
in place.

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

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn
from torch.optim import Optimizer

from thunderviz.strategies.checkpoint.full import load_full, save_full
from thunderviz.strategies.checkpoint.sharded import load_sharded, save_sharded
from thunderviz.strategies.checkpoint.state import CheckpointContext, check_save_target, is_dcp, the_model, type_name

__all__ = ["load_checkpoint", "save_checkpoint"]


def save_checkpoint(
    ctx: CheckpointContext,
    path: str | os.PathLike,
    state: dict[str, Any],
    filters: dict[str, Callable[[str, Any], bool]] | None = None,
) -> None:
    """``fabric.save``: write ``state`` (modules and optimizers converted to state dicts) in the strategy's format."""
    path = Path(path)
    model_key = the_model(ctx, state, "fabric.save(path, state)")
    check_save_target(ctx, path)
    if ctx.sharded:
        save_sharded(ctx, path, state, model_key, filters or {})
    else:
        save_full(ctx, path, state, model_key, filters or {})


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
        if not is_dcp(path):
            raise ValueError(
                f"`fabric.load({str(path)!r}, ...)`: the directory is not a PyTorch Distributed Checkpoint (no"
                " .metadata file). Pass the directory `fabric.save` wrote with `state_dict_type='sharded'`, or a"
                " checkpoint file."
            )
        if raw:
            raise ValueError(
                f"`fabric.load_raw({str(path)!r}, {type_name(state)})` reads one file holding a plain state"
                " dict, but this is a sharded checkpoint directory. Use `fabric.load(path, {'model': model,"
                " 'optimizer': optimizer})`, or convert it to one file first: `from"
                " torch.distributed.checkpoint.format_utils import dcp_to_torch_save; dcp_to_torch_save(path,"
                " 'full.pt')`."
            )
        return load_sharded(ctx, path, state, strict)
    return load_full(ctx, path, state, strict, weights_only)
