"""A model as a rehearsal runs it: a meta-device twin (nothing allocated), cut to its first blocks when asked,
with meta inputs, the optimizer a rank would build, and its parameters sharded or replicated as the strategies do.

``thunder.memory.rehearsal`` counts one training step of this twin; ``thunder.memory.saved_compare`` runs it eagerly
to compare what each keeps for backward.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from thunderviz.parallel.buckets import find_blocks
from thunderviz.parallel.option_values import Parallelism
from thunderviz.parallel.strategy_options import StrategyOptions
from thunderviz.thunder import hooks, param_tags
from thunderviz.thunder.comm.distribute import shard_tensor
from thunderviz.thunder.comm.setup import configure_comm

__all__ = ["block_container", "cut_blocks", "distribute_on_meta", "make_optimizer", "meta_inputs", "meta_twin"]


def meta_twin(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are meta tensors of the same shapes and dtypes.

    Nothing is allocated and nothing is shared with ``module``; tied parameters stay tied (one tensor, one copy).
    """
    memo: dict[int, Any] = {}
    for _, p in module.named_parameters(remove_duplicate=True):
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for _, b in module.named_buffers(remove_duplicate=True):
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(module, memo)


def block_container(module: nn.Module) -> tuple[str, int] | None:
    """``(qualified name of the container of the repeated blocks, number of blocks)``, or None (see
    ``parallel.buckets.find_blocks``)."""
    blocks = find_blocks(module)
    if not blocks:
        return None
    return blocks[0].rpartition(".")[0], len(blocks)


def cut_blocks(module: nn.Module, keep: int) -> nn.Module:
    """A meta copy of ``module`` with only the first ``keep`` of its repeated blocks (same names, same classes).

    Raises:
        ValueError: the module has no repeated blocks, or fewer than ``keep``.
    """
    found = block_container(module)
    if found is None or found[1] < keep:
        raise ValueError(f"cut_blocks: {type(module).__name__} has {found[1] if found else 0} blocks, not {keep}")
    path, _ = found
    twin = meta_twin(module)
    parent = twin.get_submodule(path.rpartition(".")[0]) if "." in path else twin
    name = path.rpartition(".")[2]
    container = twin.get_submodule(path)
    kept = list(container.children())[:keep]
    setattr(parent, name, type(container)(kept))
    return twin


def meta_inputs(example_input: Any, dtype: torch.dtype | None) -> tuple[Any, ...]:
    """``example_input`` (a tensor or a tuple of arguments) as meta tensors; floating ones cast to ``dtype`` (what
    Fabric's ``-true`` precisions do to inputs)."""
    args = example_input if isinstance(example_input, tuple) else (example_input,)

    def convert(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            t = torch.empty_like(a, device="meta")
            return t.to(dtype) if dtype is not None and t.is_floating_point() else t
        return a

    return tuple(convert(a) for a in args)


def make_optimizer(optimizer: Any, params: Sequence[nn.Parameter], device: str) -> torch.optim.Optimizer:
    """The optimizer a rank would build, on the rehearsal's parameters.

    ``"adamw"``: ``torch.optim.AdamW`` with its defaults; ``"sgd"``: ``torch.optim.SGD`` with its defaults (no
    momentum, so no state); a class or any callable taking the parameters (``functools.partial(SGD, momentum=0.9)``).
    Left to choose, torch runs its per-tensor loop on CPU and the ``foreach`` form on CUDA (whose temporaries span
    every parameter at once); the rehearsal's meta tensors would get the per-tensor loop, so for a CUDA target
    ``foreach`` is set as torch would set it there.
    """
    if isinstance(optimizer, str):
        known = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
        if optimizer.lower() not in known:
            raise ValueError(
                f"optimizer={optimizer!r}: use 'adamw', 'sgd', an optimizer class, or a callable taking the parameters"
            )
        opt = known[optimizer.lower()](params)
    elif callable(optimizer):
        opt = optimizer(params)
    else:
        raise ValueError(f"optimizer={optimizer!r}: use 'adamw', 'sgd', an optimizer class, or a callable")
    if not isinstance(opt, torch.optim.Optimizer):
        raise ValueError(f"optimizer={optimizer!r} built a {type(opt).__name__}, not a torch.optim.Optimizer")
    if device == "cuda":
        for group in opt.param_groups:
            if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                group["foreach"] = True
    return opt


def distribute_on_meta(module: nn.Module, jitted: Any, options: StrategyOptions, group: Any) -> None:
    """Shard (FSDP) or replicate (DDP) ``module``'s parameters in place as rank 0 of ``group`` and attach the
    communication plan: ``thunder.comm.distribute.shard_param_`` / ``replicate_param_`` and the strategies'
    ``_after_distribute``, with the rank taken from the group object itself (it is registered nowhere)."""
    hooks.ensure_supported_thunder()
    hooks.install_sync_hook()
    world = group.size()
    for _, p in module.named_parameters(remove_duplicate=True):
        shape = tuple(p.shape)
        if options.parallelism is Parallelism.FSDP:
            with torch.no_grad():
                if p.dim() == 0:
                    p.data = p.data.reshape(1)
                shard, padding = shard_tensor(p.data, 0, world)
                p.data = shard
            param_tags.tag_param(p, param_tags.SyncKind.FULLY_SHARDED, group=group, padding=padding, full_shape=shape)
        else:
            param_tags.tag_param(p, param_tags.SyncKind.REPLICATED, group=group, padding=0, full_shape=shape)
    if options.parallelism is Parallelism.DDP:
        hooks.mark_module_ddp(module, jitted, group, options.bucket_size_in_mb)
    configure_comm(module, options)
