"""Libraries whose code compile reuse keys by identity rather than by content: Hugging Face ``transformers``.

Why not as torch (named only): transformers' code is patched in running processes — liger-kernel and similar
replace ``modeling_llama.apply_rotary_pos_emb``, ``LlamaRMSNorm`` or ``LlamaForCausalLM.forward``, and attention
implementations are registered by name (``AttentionInterface.register``) — so a name alone could reuse a trace of the
code before the patch. Why not as user code (fingerprinted): walking a transformers model's classes reaches all of
``PreTrainedModel`` and ``GenerationMixin`` and, through their globals, loggers, locks, sympy and the hub client, none
of which a key can describe.

So a transformers class is described by the objects themselves: every attribute of its transformers classes (their
methods, as the function objects), and every global of the transformers modules its code can reach (the modules of
those classes, then, transitively, the modules of the transformers functions and classes their globals hold),
registries (a mapping such as ``ALL_ATTENTION_FUNCTIONS``) by their items. A patch anywhere there is a new object,
hence a different key. The key holds these objects, so none of them can be freed and its address taken by another.
A model's configuration (``PretrainedConfig``, ``GenerationConfig``) is keyed by its values.

transformers is never imported here: what is found in ``sys.modules`` is what a model of it can use.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["IDENTIFIED", "class_members", "config_value", "identity", "is_identified"]

#: top-level packages whose classes and functions are keyed by identity
IDENTIFIED = ("transformers",)


def is_identified(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".", 1)[0] in IDENTIFIED


def identity(v: Any) -> Any:
    """``v`` itself where it hashes (a function, a class, a string), a registry's or a plain dict's items so
    described, else only its type: a logger's or a lock's state is no code."""
    items = _registry_items(v)
    if items is not None:
        return ("mapping", type(v).__qualname__, tuple((repr(k), _hashed(x)) for k, x in items))
    return _hashed(v)


def _registry_items(v: Any) -> list[tuple[Any, Any]] | None:
    """The items of a plain dict, or of a transformers registry (``GeneralInterface``: ``ALL_ATTENTION_FUNCTIONS``,
    ``ALL_MASK_ATTENTION_FUNCTIONS``) read from its own two dicts; None for anything else. Other mappings are not
    iterated: transformers' lazy auto-mappings import every model family when their items are read."""
    if type(v) is dict:
        return list(v.items())
    own = getattr(type(v), "_global_mapping", None)  # the class first: an instance's __getattr__ may import
    local = vars(v).get("_local_mapping") if type(own) is dict and hasattr(v, "__dict__") else None
    if type(local) is dict:
        return [*own.items(), *local.items()]
    return None


def _hashed(v: Any) -> Any:
    try:
        hash(v)
    except Exception:  # TypeError, or whatever a library's __hash__ raises
        return ("unhashable", type(v).__qualname__)
    return ("object", v)


def class_members(cls: type, seen: dict[int, Any]) -> tuple[Any, ...]:
    """An identified class's description (see the module docstring): ``(owner, attribute, identity)`` for the
    attributes of its identified classes, then for the globals of each module reached that ``seen`` (the key's
    memo) has not met yet."""
    members: list[Any] = []
    klasses = [k for k in cls.__mro__ if is_identified(k)]
    for klass in klasses:
        for attr, value in sorted(vars(klass).items()):
            if attr not in ("__dict__", "__weakref__", "__doc__"):
                members.append((klass.__qualname__, attr, identity(value)))
    todo = [sys.modules.get(k.__module__) for k in klasses]
    while todo:
        module = todo.pop()
        if module is None or id(module) in seen:
            continue
        seen[id(module)] = module
        for name, value in sorted(vars(module).items()):
            if name.startswith("__"):
                continue
            members.append((module.__name__, name, identity(value)))
            todo.extend(_modules_of(value))
    return tuple(members)


def _modules_of(value: Any) -> list[types.ModuleType | None]:
    """The identified modules a global leads to: its own (a submodule), a function's or class's, a registry's items'."""
    if isinstance(value, types.ModuleType):
        return [value] if value.__name__.split(".", 1)[0] in IDENTIFIED else []
    if isinstance(value, (types.FunctionType, type)) and is_identified(value):
        return [sys.modules.get(value.__module__)]
    items = _registry_items(value)
    if items is None:
        return []
    return [sys.modules.get(x.__module__) for _, x in items if isinstance(x, types.FunctionType) and is_identified(x)]


def config_value(v: Any, describe: Callable[[Any], Any]) -> Any | None:
    """A transformers configuration described by its class and values (``describe`` describes each value), or None
    for anything else."""
    configs = [
        getattr(sys.modules.get("transformers.configuration_utils"), "PretrainedConfig", None),
        getattr(sys.modules.get("transformers.generation.configuration_utils"), "GenerationConfig", None),
    ]
    if not any(c is not None and isinstance(v, c) for c in configs):
        return None
    return ("config", type(v).__module__, type(v).__qualname__, describe(dict(sorted(vars(v).items()))))
