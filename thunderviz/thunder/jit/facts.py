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
from thunderviz.parallel.front_doors import FrontDoor
from thunderviz.parallel.option_values import CheckpointPolicy
from thunderviz.thunder import compile_state, param_tags
from thunderviz.thunder.jit.front_doors import dynamo_door, dynamo_inner, thunder_module_door, transformers_facts

__all__ = ["inspect_object"]


def inspect_object(
    obj: Any, checkpoint_policy: CheckpointPolicy | None = None, fabric_compile_kwargs: dict[str, Any] | None = None
) -> ObjectFacts:
    """Read the facts the table needs from a live object (thunder state through ``hooks``); with a
    ``checkpoint_policy``, also which of its modules the policy selects; ``fabric_compile_kwargs``: Fabric unwrapped
    this module from ``torch.compile(module, **kwargs)`` and compiles what the strategy returns again."""
    type_name = type(obj).__name__
    inner = dynamo_inner(obj)
    if inner is not None:
        return ObjectFacts(
            kind=ObjectKind.DYNAMO,
            type_name=type(inner).__name__,
            door=dynamo_door(obj) or FrontDoor(),
            transformers=transformers_facts(inner),
        )
    if compile_state.is_thunder_module(obj):
        inner = compile_state.original_module(obj)
        door, distributed = thunder_module_door(obj)
        recompiled = dynamo_door(obj, fabric_compile_kwargs) if fabric_compile_kwargs is not None else None
        return _with_checkpointing(
            inner,
            checkpoint_policy,
            ObjectFacts(
                kind=ObjectKind.THUNDER_MODULE,
                type_name=type(inner).__name__,
                has_run=compile_state.has_run(obj),
                cached_traces=compile_state.cached_trace_count(obj),
                distributed_by_thunder=distributed,
                distributed_by_us=any(param_tags.sync_tag(p) is not None for p in inner.parameters()),
                blocks=tuple(find_blocks(inner)),
                door=recompiled or door,
                transformers=transformers_facts(inner),
            ),
        )
    if isinstance(obj, torch.nn.Module):
        return _with_checkpointing(
            obj,
            checkpoint_policy,
            ObjectFacts(
                kind=ObjectKind.MODULE,
                type_name=type_name,
                distributed_by_us=any(param_tags.sync_tag(p) is not None for p in obj.parameters()),
                blocks=tuple(find_blocks(obj)),
                door=dynamo_door(obj, fabric_compile_kwargs) or FrontDoor(),
                transformers=transformers_facts(obj),
            ),
        )
    if compile_state.is_jitted(obj):
        return ObjectFacts(kind=ObjectKind.JITTED_FUNCTION, type_name=getattr(obj, "__name__", type_name))
    return ObjectFacts(kind=ObjectKind.OTHER, type_name=type_name)


def _with_checkpointing(module: torch.nn.Module, policy: CheckpointPolicy | None, facts: ObjectFacts) -> ObjectFacts:
    if policy is None:
        return facts
    return dataclasses.replace(
        facts, checkpointed=select_checkpointed(module, policy), module_classes=module_classes(module)
    )
