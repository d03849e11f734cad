"""What the decision table needs to know about the object handed to ``fabric.setup``, read from the live object.

``thunderviz.parallel.decisions`` decides on plain ``ObjectFacts`` so every row is testable without thunder; this is
the one place that turns a module, a ThunderModule or a jitted function into those facts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from thunderviz.parallel.buckets import find_blocks
from thunderviz.parallel.checkpointing import module_classes, select_checkpointed
from thunderviz.parallel.decisions import ObjectFacts, ObjectKind
from thunderviz.parallel.options import CheckpointPolicy
from thunderviz.thunder import hooks

__all__ = ["inspect_object"]


def inspect_object(obj: Any, checkpoint_policy: CheckpointPolicy | None = None) -> ObjectFacts:
    """Read the facts the table needs from a live object (thunder state through ``hooks``); with a
    ``checkpoint_policy``, also which of its modules the policy selects."""
    type_name = type(obj).__name__
    if hooks.is_thunder_module(obj):
        inner = hooks.original_module(obj)
        return _with_checkpointing(
            inner,
            checkpoint_policy,
            ObjectFacts(
                kind=ObjectKind.THUNDER_MODULE,
                type_name=type(inner).__name__,
                has_run=hooks.has_run(obj),
                cached_traces=hooks.cached_trace_count(obj),
                distributed_by_thunder=hooks.thunder_distributed_kind(obj),
                distributed_by_us=any(hooks.sync_tag(p) is not None for p in inner.parameters()),
                blocks=tuple(find_blocks(inner)),
            ),
        )
    if isinstance(obj, torch.nn.Module):
        return _with_checkpointing(
            obj,
            checkpoint_policy,
            ObjectFacts(
                kind=ObjectKind.MODULE,
                type_name=type_name,
                distributed_by_us=any(hooks.sync_tag(p) is not None for p in obj.parameters()),
                blocks=tuple(find_blocks(obj)),
            ),
        )
    if hooks.is_jitted(obj):
        return ObjectFacts(kind=ObjectKind.JITTED_FUNCTION, type_name=getattr(obj, "__name__", type_name))
    return ObjectFacts(kind=ObjectKind.OTHER, type_name=type_name)


def _with_checkpointing(module: torch.nn.Module, policy: CheckpointPolicy | None, facts: ObjectFacts) -> ObjectFacts:
    if policy is None:
        return facts
    return dataclasses.replace(
        facts, checkpointed=select_checkpointed(module, policy), module_classes=module_classes(module)
    )
