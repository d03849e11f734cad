"""What a Hugging Face transformers model needs before thunder 0.2.6 traces it: the decision's ``prepare`` steps.

transformers >= 4.51 builds its 4D attention masks in ``masking_utils.sdpa_mask_recent_torch`` by applying an
index predicate (``causal_mask_function``, combined with padding, packed-sequence or sliding-window predicates by
``and_masks``/``or_masks``) to every ``(batch, head, query, key)`` index through ``_vmap_for_bhqkv``, i.e.
``torch.vmap``. thunder's interpreter cannot trace ``torch.vmap`` (``_add_batch_dim`` receives a proxy). The
predicates are elementwise tensor expressions (comparisons, ``&``, indexing a padding mask by batch and key index),
so calling the same predicate once on index tensors shaped to broadcast against each other gives the same mask — what
transformers itself does for torch < 2.6 in ``sdpa_mask_older_torch``. ``_vmap_for_bhqkv`` is therefore registered
as a thunder jit lookaside that interprets ``_broadcast_for_bhqkv`` instead: the predicate and transformers' own
mask code are still traced as written, and no opaque op hides a tensor inside a closure (what made thunder's own
``HFTransformers`` recipe fail with "Attempting to execute symbol getitem outside of a tracing context" on packed
sequences).

In case 2 the user's jitted function calls Fabric's wrapper, and thunder traces its ``forward`` too: its hook walk
over the output deep-copies transformers' ``ModelOutput``, which thunder cannot trace, so that walk is traced over
the output's tensors directly (``register_output_hooks_by_leaves``).

The registrations are process-wide and keyed on transformers' and Fabric's own functions, so they change nothing for
other code; they must be, because with ``jit=False`` the function the user jits (and so its compile data) is not
known at setup.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from thunderviz.parallel.decision_types import transformers_preparations
from thunderviz.parallel.front_doors import Preparation
from thunderviz.thunder.jit.front_doors import transformers_facts
from thunderviz.thunder.jit.lookasides import function_copy, register_lookaside, registered

__all__ = [
    "broadcast_masks_registered",
    "prepare_copy",
    "prepare_transformers",
    "register_broadcast_masks",
    "register_output_hooks_by_leaves",
]

#: where Fabric's ``_FabricModule`` is defined (its ``forward`` hooks every output tensor)
_FABRIC_WRAPPERS = ("lightning.fabric.wrappers", "lightning_fabric.wrappers")


def _broadcast_for_bhqkv(mask_function: Callable[..., Any], bh_indices: bool = True) -> Callable[..., Any]:
    """``_vmap_for_bhqkv(mask_function, bh_indices)`` without vmap: the predicate applied once to broadcast indices.

    vmap's result has shape ``(batch, heads, queries, keys)`` (``(queries, keys)`` without ``bh_indices``); a
    predicate that ignores some index broadcasts to fewer dimensions, so the result is expanded to that shape.
    """

    def expanded(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        if bh_indices:
            mask = mask_function(
                batch_idx[:, None, None, None],
                head_idx[None, :, None, None],
                q_idx[None, None, :, None],
                kv_idx[None, None, None, :],
            )
            return mask.expand(batch_idx.shape[0], head_idx.shape[0], q_idx.shape[0], kv_idx.shape[0])
        mask = mask_function(None, None, q_idx[:, None], kv_idx[None, :])
        return mask.expand(q_idx.shape[0], kv_idx.shape[0])

    return expanded


def _vmap_target() -> Callable[..., Any] | None:
    try:
        from transformers import masking_utils
    except ImportError:
        return None
    return getattr(masking_utils, "_vmap_for_bhqkv", None)


def register_broadcast_masks() -> bool:
    """Have thunder trace transformers' ``_vmap_for_bhqkv`` as ``_broadcast_for_bhqkv`` (once per process); False
    when the installed transformers has no such function (it builds masks without vmap)."""
    from thunder.core.interpreter import _interpret_call

    target = _vmap_target()
    if target is None:
        return False

    def lookaside(*args: Any, **kwargs: Any) -> Any:
        return _interpret_call(_broadcast_for_bhqkv, *args, **kwargs)

    register_lookaside(target, lookaside)
    return True


def broadcast_masks_registered() -> bool:
    """True once ``register_broadcast_masks`` registered the lookaside in this process."""
    target = _vmap_target()
    return target is not None and registered(target)


def _hook_leaves(data: Any, hook: Callable[[Any], Any]) -> None:
    """``hook`` on every tensor in ``data`` (a dataclass's fields, a mapping's values, a sequence's items), copying
    nothing: what Fabric's ``apply_to_collection(output, dtype=Tensor, function=hook)`` does for Fabric, which
    discards the copy it returns."""
    if isinstance(data, torch.Tensor):
        hook(data)
    elif dataclasses.is_dataclass(data) and not isinstance(data, type):
        for field in dataclasses.fields(data):
            _hook_leaves(getattr(data, field.name), hook)
    elif isinstance(data, Mapping):
        for value in data.values():
            _hook_leaves(value, hook)
    elif isinstance(data, (list, tuple)):
        for value in data:
            _hook_leaves(value, hook)


def _is_fabric_output_hook(fn: Any) -> bool:
    return (
        isinstance(fn, types.MethodType)
        and getattr(fn.__func__, "__name__", "") == "_register_backward_hook"
        and type(fn.__self__).__module__ in _FABRIC_WRAPPERS
    )


def register_output_hooks_by_leaves() -> None:
    """Have thunder trace Fabric's hook walk over a module's output as ``_hook_leaves`` (once per process).

    Why: in case 2 the user's jitted function calls Fabric's wrapper, whose ``forward`` ends with
    ``apply_to_collection(output, dtype=Tensor, function=self._register_backward_hook)``; for a dataclass output
    (transformers' ``ModelOutput``) that deep-copies the output first, and thunder's interpreter cannot trace the copy
    (``copy._reconstruct``: "object of type 'generator' has no len()"). Every other call of ``apply_to_collection``
    is traced as written.
    """
    from thunder.core.interpreter import INTERPRETER_SIGNALS, _interpret_call, unwrap

    wrappers = next((sys.modules[m] for m in _FABRIC_WRAPPERS if m in sys.modules), None)
    apply_to_collection = getattr(wrappers, "apply_to_collection", None)
    if not isinstance(apply_to_collection, types.FunctionType):  # no Fabric in this process: nothing to trace
        return
    original = function_copy(apply_to_collection)

    def lookaside(*args: Any, **kwargs: Any) -> Any:
        function = kwargs.get("function", args[2] if len(args) > 2 else None)
        data = kwargs.get("data", args[0] if args else None)
        if data is None or not _is_fabric_output_hook(unwrap(function)):
            return _interpret_call(original, *args, **kwargs)
        done = _interpret_call(_hook_leaves, data, function)
        return done if done is INTERPRETER_SIGNALS.EXCEPTION_RAISED else data

    register_lookaside(apply_to_collection, lookaside)


def prepare_transformers(module: Any, steps: tuple[Preparation, ...]) -> None:
    """Carry out a decision's ``prepare`` steps on the user's transformers model (before thunder traces it)."""
    for step in steps:
        if step is Preparation.MASKS_BY_BROADCASTING:
            register_broadcast_masks()
        elif step is Preparation.NO_GENERATION_CACHE:
            module.config.use_cache = False
        elif step is Preparation.OUTPUT_HOOKS_BY_LEAVES:
            register_output_hooks_by_leaves()


def prepare_copy(module: Any) -> tuple[Preparation, ...]:
    """The decision's ``prepare`` steps carried out on a copy of a model that thunder traces outside any strategy
    (the plan's rehearsal of a meta twin): the same steps the strategy would take, so what is planned is what
    trains. Returns them (none for a model that is not a transformers model)."""
    steps = transformers_preparations(transformers_facts(module))
    prepare_transformers(module, steps)
    return steps
