"""Turning a model built on the meta device into real tensors, one module at a time, identically on every rank.

Why: ``fabric.init_module(empty_init=True)`` (or ``torch.device("meta")``) builds a model of any size without
memory. At ``fabric.setup`` each module that owns meta tensors gets real, uninitialized storage on the target
device and its ``reset_parameters()`` fills it; the strategy's ``keep`` callback then runs on that module's
parameters at once (FSDP keeps only this rank's shard), so a rank's peak is its shards so far plus the largest
single module.

Rules that keep the result one consistent model:
- Order: ``module.named_modules()`` (parents before children, registration order), the same on every rank.
- Randomness: every rank draws from a copy of rank 0's generator for the target device; afterwards rank 0's
  generator has advanced exactly as on one process, the other ranks get their own state back. So the shards equal
  ``materialize_(model, device)`` called on one process with rank 0's seed.
- ``reset_parameters()`` is called only on modules that own newly materialized tensors, and may write only those:
  a reset that changes another module's tensor (a child's, or a tied weight already materialized and possibly
  sharded) raises, because on ranks that already hold shards the result could not equal the one-process result.
- A tied parameter is materialized once and the same ``Parameter`` object is put back everywhere it was shared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as tdist
from torch import nn

__all__ = ["MaterializationError", "has_meta_tensors", "materialize_", "rank0_generator_state"]


class MaterializationError(ValueError):
    """A module built on the meta device cannot be initialized the same way on every rank."""


def has_meta_tensors(module: nn.Module) -> bool:
    """True when any parameter or buffer of ``module`` is on the meta device (built with ``empty_init=True``)."""
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())


def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


@contextmanager
def rank0_generator_state(device: torch.device, group: tdist.ProcessGroup | None) -> Iterator[None]:
    """Within this block every rank's generator for ``device`` starts from rank 0's state (see the module doc)."""
    if group is None or not tdist.is_initialized():
        yield
        return
    own = _rng_state(device)
    box = [own]
    tdist.broadcast_object_list(
        box, src=tdist.get_global_rank(group, 0), group=group, device=device if device.type == "cuda" else None
    )
    _set_rng_state(device, box[0].cpu())
    try:
        yield
    finally:
        if tdist.get_rank(group) != 0:
            _set_rng_state(device, own)


def _direct_meta(module: nn.Module) -> bool:
    tensors = [*module._parameters.values(), *module._buffers.values()]
    return any(t is not None and t.is_meta for t in tensors)


@torch.no_grad()
def materialize_(
    module: nn.Module,
    device: torch.device,
    keep: Callable[[str, nn.Parameter], None] | None = None,
) -> dict[int, torch.Tensor]:
    """Give every meta parameter and buffer of ``module`` real storage on ``device`` and initialize it.

    Args:
        module: the model; modified in place (its meta ``Parameter`` objects are replaced by new ones).
        device: where the real tensors live.
        keep: called as ``keep(qualified_name, parameter)`` for each newly materialized parameter right after its
            module's ``reset_parameters()``; FSDP shards the parameter here so the full tensor is freed at once.

    Returns:
        ``{id(old meta tensor): new tensor}`` for every replaced parameter and buffer, so callers can re-point
        what still holds the old objects (an optimizer built before set-up, a ThunderModule's parameter table).

    Raises:
        MaterializationError: a module owning meta tensors has no ``reset_parameters()``, or its reset changed a
            tensor it does not own.
    """
    replaced: dict[int, torch.Tensor] = {}
    for prefix, mod in module.named_modules():
        if not _direct_meta(mod):
            continue
        fresh: list[tuple[str, str, int, torch.Tensor]] = []  # (store, name, id of the meta tensor, new tensor)
        for store_name in ("_parameters", "_buffers"):
            store = getattr(mod, store_name)
            for name, t in list(store.items()):
                if t is None or not t.is_meta:
                    continue
                if id(t) in replaced:  # shared with a module materialized earlier (tied weights)
                    store[name] = replaced[id(t)]
                    continue
                real = torch.empty_like(t, device=device)
                new = nn.Parameter(real, requires_grad=t.requires_grad) if store_name == "_parameters" else real
                replaced[id(t)] = new
                store[name] = new
                fresh.append((store_name, name, id(t), new))
        if not fresh:
            continue
        qualified = prefix or type(mod).__name__
        reset = getattr(mod, "reset_parameters", None)
        if not callable(reset):
            names = ", ".join(f"{prefix + '.' if prefix else ''}{n}" for _, n, _, _ in fresh)
            raise MaterializationError(
                f"`fabric.setup` cannot initialize {qualified!r} ({type(mod).__name__}), built on the meta device"
                f" (`fabric.init_module(empty_init=True)`): it owns {names} but has no `reset_parameters()` method."
                f" Give {type(mod).__name__} a `reset_parameters()` that initializes its own parameters and buffers,"
                " or build the model without `empty_init=True`."
            )
        own = {id(t) for *_, t in fresh}
        watched = [
            (n, t, t._version)
            for n, t in (*mod.named_parameters(remove_duplicate=False), *mod.named_buffers(remove_duplicate=False))
            if id(t) not in own
        ]
        reset()
        changed = sorted({f"{prefix + '.' if prefix else ''}{n}" for n, t, v in watched if t._version != v})
        if changed:
            raise MaterializationError(
                f"`{type(mod).__name__}.reset_parameters()` of {qualified!r} changed {', '.join(changed)}, which it"
                " does not own (a child module's tensor or a tied weight). Modules are materialized one at a time,"
                " parents first, and each rank keeps only its shard at once, so that write cannot be reproduced."
                f" Make {type(mod).__name__}.reset_parameters() initialize only its own parameters and buffers"
                " (tie weights after `fabric.setup`, or let the child's own reset_parameters() do its part)."
            )
        for store_name, name, old_id, _ in fresh:
            current = getattr(mod, store_name)[name]  # a reset may assign a new tensor (litgpt's rope cache does)
            replaced[old_id] = current
            if keep is not None and store_name == "_parameters":
                keep(f"{prefix + '.' if prefix else ''}{name}", current)
    return replaced
