"""Activation checkpointing as thunder understands it: each selected module's forward under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.

Why wrap the forward, not the module: thunder 0.2.6 traces exactly this call into its own recompute-in-backward
(the jit lookaside in ``thunder/core/jit_ext.py`` tags everything the region computes as *recompute in backward*),
while torch's ``CheckpointWrapper`` — what Fabric's own ``FSDPStrategy`` applies — is not supported and would also
rename every parameter (``blocks.0._checkpoint_wrapped_module.attn.weight``). Replacing the instance's ``forward``
keeps the module tree, the parameter names and the optimizer's view unchanged, works the same in eager PyTorch, and
is seen by whatever thunder traces the module next: the strategy's own ``thunder.jit`` (case 1), the user's jitted
function (case 2), or the user's ThunderModule (case 3, whose stale traces the strategy clears).

The lookaside takes positional arguments only; keyword arguments of the forward (litgpt's ``Block.forward(x, cos,
sin, mask=None, input_pos=None)``) are bound in a closure, which thunder interprets like any other Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

__all__ = ["CheckpointedForward", "checkpoint_modules_", "is_checkpointed"]


class CheckpointedForward:
    """A module's ``forward``, run under non-reentrant ``torch.utils.checkpoint`` (picklable: no local function)."""

    def __init__(self, forward: Any) -> None:
        self.forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            return torch.utils.checkpoint.checkpoint(self.forward, *args, use_reentrant=False)
        forward = self.forward

        def run(*positional: Any) -> Any:
            return forward(*positional, **kwargs)

        return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False)


def is_checkpointed(module: nn.Module) -> bool:
    return isinstance(module.__dict__.get("forward"), CheckpointedForward)


def checkpoint_modules_(model: nn.Module, names: Iterable[str]) -> list[str]:
    """Run the forward of each named submodule of ``model`` (``""``: the model itself) under checkpointing.

    Idempotent: a module already wrapped is left as it is. Returns the names wrapped now.
    """
    done = []
    for name in names:
        module = model.get_submodule(name) if name else model
        if is_checkpointed(module):
            continue
        module.forward = CheckpointedForward(module.forward)  # type: ignore[method-assign]
        done.append(name)
    return done
