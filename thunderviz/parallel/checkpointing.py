"""Which modules an ``activation_checkpointing_policy`` selects, as plain data (no torch, no thunder).

Why the outermost match only: checkpointing a module already inside a checkpointed module saves nothing more (the
outer region is recomputed as a whole) and would nest thunder's checkpoint regions; torch's
``apply_activation_checkpointing`` wraps the outermost match for the same reason. The forwards themselves are
wrapped by ``thunder.jit.checkpointed_forward``; the decision log names what was selected here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thunderviz.parallel.option_values import CheckpointPolicy

if TYPE_CHECKING:  # plain Python: reads modules through named_modules(), never needs torch's code
    from torch import nn

__all__ = ["module_classes", "select_checkpointed", "span"]


def select_checkpointed(module: nn.Module, policy: CheckpointPolicy) -> tuple[str, ...]:
    """Qualified names of the modules ``policy`` selects (``""`` is the module itself), outermost matches only."""
    chosen: list[str] = []
    for name, sub in module.named_modules():
        if any(name.startswith(outer + ".") or outer == "" for outer in chosen):
            continue
        if policy.matches(sub):
            chosen.append(name)
    return tuple(chosen)


def module_classes(module: nn.Module) -> tuple[str, ...]:
    """The class names in ``module`` (sorted, once each): what an error lists when a policy matched nothing."""
    return tuple(sorted({type(m).__name__ for m in module.modules()}))


def span(names: tuple[str, ...]) -> str:
    """``transformer.h.0 ... transformer.h.5`` / ``blocks.0`` / ``the whole model``: names in one phrase."""
    shown = ["the whole model" if n == "" else n for n in names]
    if len(shown) <= 2:
        return ", ".join(shown)
    return f"{shown[0]} ... {shown[-1]}"
