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

The registration is process-wide and keyed on transformers' own function, so it changes nothing for other code;
it must be, because with ``jit=False`` the function the user jits (and so its compile data) is not known at setup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from thunderviz.parallel.front_doors import Preparation

__all__ = ["broadcast_masks_registered", "prepare_transformers", "register_broadcast_masks"]

_lock = threading.Lock()
_registered: Callable[..., Any] | None = None


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


def register_broadcast_masks() -> bool:
    """Have thunder trace transformers' ``_vmap_for_bhqkv`` as ``_broadcast_for_bhqkv`` (once per process); False
    when the installed transformers has no such function (it builds masks without vmap)."""
    global _registered
    from thunder.core import jit_ext
    from thunder.core.interpreter import _interpret_call

    try:
        from transformers import masking_utils
    except ImportError:
        return False
    target = getattr(masking_utils, "_vmap_for_bhqkv", None)
    if target is None:
        return False
    with _lock:
        if _registered is target and jit_ext._general_jit_lookaside_map.get(target) is not None:
            return True

        def lookaside(*args: Any, **kwargs: Any) -> Any:
            return _interpret_call(_broadcast_for_bhqkv, *args, **kwargs)

        jit_ext._general_jit_lookaside_map[target] = lookaside
        _registered = target
    return True


def broadcast_masks_registered() -> bool:
    """True once ``register_broadcast_masks`` registered the lookaside in this process."""
    from thunder.core import jit_ext

    return _registered is not None and _registered in jit_ext._general_jit_lookaside_map


def prepare_transformers(module: Any, steps: tuple[Preparation, ...]) -> None:
    """Carry out a decision's ``prepare`` steps on the user's transformers model (before thunder traces it)."""
    for step in steps:
        if step is Preparation.MASKS_BY_BROADCASTING:
            register_broadcast_masks()
        elif step is Preparation.NO_GENERATION_CACHE:
            module.config.use_cache = False
