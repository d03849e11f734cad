"""Why a compile could not reuse an earlier trace, in a user's words: ``explain_miss`` (``compile_reuse`` puts the
sentence on the cell report's compile line: ``interpreted in 9.3 s: the code of Block.forward changed``).

It compares a key (``thunder.reuse.key.key_of``) with the latest earlier key of the same subject — the same root class
for a
module, the same function name for a jitted function — because a user who edits a cell and re-runs it compares with
what that cell set up before, and names the first difference found; one is enough to explain a compile.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from thunderviz.thunder.reuse.key import FUNCTION

__all__ = ["explain_miss"]

_JIT_PARTS = (
    "the executors",
    "the jit options",
    "the cache option",
    "the sharp-edges option",
    "torch autograd support",
    "grad mode, autocast or no_sync",
)


def explain_miss(key: Any, earlier: Sequence[Any]) -> str:
    """What differs between ``key`` and the latest earlier key of the same subject (see the module docstring)."""
    subject = _subject(key)
    same = [k for k in earlier if _subject(k) == subject]
    name = str(subject[2]).rsplit("<locals>.", 1)[-1]  # a function defined in another: its own name
    if not same:
        if subject[0] == FUNCTION:
            return f"the first call of {name} in this process"
        return f"the first set-up of a {_qualname(subject)} in this process"
    old = same[-1]
    first, args, kwargs, jit = key
    if first != old[0]:
        if subject[0] == FUNCTION:
            return _function_change(name, first[1], old[0][1])
        return _module_change(first, old[0])
    if (args, kwargs) != (old[1], old[2]):
        if subject[0] == FUNCTION:  # named by position: its arguments are models as well as tensors
            for i, (a, b) in enumerate(zip(_items(args), _items(old[1]), strict=False)):
                if a != b:
                    inside = _module_difference(a, b)
                    return f"argument {i}: {inside}" if inside else _input_change(a, b, f"argument {i}")
        return _input_change((args, kwargs), (old[1], old[2]))
    for label, new_part, old_part in zip(_JIT_PARTS, jit, old[3], strict=True):
        if new_part != old_part:
            return f"{label} changed"
    return ""


def _subject(key: Any) -> tuple[Any, ...]:
    """(FUNCTION, module, qualname) for a jitted function's key, the root class's (kind, module, qualname) for a
    module's."""
    first = key[0]
    if first[0] == FUNCTION:
        return (FUNCTION, first[1][1], first[1][2])
    return tuple(first[0][1][:3])


def _items(value: Any) -> tuple[Any, ...]:
    """The items of a key's description of a tuple or list (``("tuple", (...))``)."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] in ("tuple", "list"):
        return tuple(value[1])
    return ()


def _qualname(class_key: Any) -> str:
    return str(class_key[2] if len(class_key) > 2 else class_key[1])


def _shown(value: Any) -> str:
    """A key's description of a plain value as the user wrote it (``('float', '1e-05')`` -> ``1e-05``)."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str):
        return value[1]
    return "..."


def _module_difference(new: Any, old: Any) -> str:
    """The first difference between two modules a jitted function reaches (``thunder.reuse.key._root_key``) found
    inside two
    parts of its key, in ``_module_change``'s words; "" when none of the difference is inside a module."""
    if new == old or not (isinstance(new, tuple) and isinstance(old, tuple)):
        return ""
    if new[:1] in (("nn.Module",), ("Fabric",)) and new[:1] == old[:1] and isinstance(new[1], int):
        if len(new) != len(old) or new[1] != old[1]:
            return "which modules are one and the same object changed"
        if new[0] == "nn.Module":
            return _module_change(new[2], old[2])
        *wrapper_new, inner_new = new[2]
        *wrapper_old, inner_old = old[2]
        if wrapper_new != wrapper_old:
            return "Fabric's strategy or precision changed"
        return _module_difference(inner_new, inner_old)
    for a, b in zip(new, old, strict=False):
        if a != b:
            found = _module_difference(a, b)
            if found:
                return found
    return ""


def _module_change(new: tuple[Any, ...], old: tuple[Any, ...]) -> str:
    new_by, old_by = {e[0]: e for e in new}, {e[0]: e for e in old}
    added = [n for n in new_by if n not in old_by]
    removed = [n for n in old_by if n not in new_by]
    if added or removed:
        parts = ([f"added {', '.join(added[:3])}"] if added else []) + (
            [f"removed {', '.join(removed[:3])}"] if removed else []
        )
        return f"the module tree changed ({'; '.join(parts)})"
    for name, n in new_by.items():
        o = old_by[name]
        if n == o:
            continue
        where = name or "the root module"
        _, n_class, n_training, n_attrs, n_params, n_buffers = n
        _, o_class, o_training, o_attrs, o_params, o_buffers = o
        if n_class != o_class:
            return _class_change(where, n_class, o_class)
        if n_training != o_training:
            return f"{where} switched between train() and eval()"
        for kind, n_t, o_t in (("parameter", n_params, o_params), ("buffer", n_buffers, o_buffers)):
            if n_t != o_t:  # before the attributes: a Linear's new shape is its weight's, not its in_features
                return _tensor_change(kind, name, dict(n_t), dict(o_t))
        if n_attrs != o_attrs:
            return _attribute_change(name, dict(n_attrs), dict(o_attrs))
    return "the module changed"


def _class_change(where: str, new: Any, old: Any) -> str:
    if _qualname(new) != _qualname(old) or len(new) != len(old):
        return f"{where} is now {_qualname(new)} (was {_qualname(old)})"
    n_members = {(k, a): v for k, a, v in new[3]}
    o_members = {(k, a): v for k, a, v in old[3]}
    for (klass, attr), value in n_members.items():
        before = o_members.get((klass, attr))
        if before == value:
            continue
        if before is None:
            return f"{klass} gained {attr}"
        if value[0] == "function" and before[0] == "function" and len(value) > 3 and len(before) > 3:
            return _function_change(f"{klass}.{attr}", value, before)
        return f"{klass}.{attr} changed"
    removed = [f"{k}.{a}" for k, a in o_members if (k, a) not in n_members]
    return f"{removed[0]} was removed" if removed else f"the class {_qualname(new)} changed"


def _function_change(where: str, new: Any, old: Any) -> str:
    """``new``/``old``: ``_function_key``s of the same name. Names the global, default or closure cell that changed,
    and what changed in a module it holds."""
    n_code, o_code = new[3], old[3]
    same_names = [n[0] for n in n_code[2]] == [o[0] for o in o_code[2]]
    if n_code[0] != o_code[0] or n_code[1] != o_code[1] or n_code[3:] != o_code[3:] or not same_names:
        return f"the code of {where} changed"
    for n_name, o_name in zip(n_code[2], o_code[2], strict=False):
        if n_name != o_name:
            inside = _module_difference(n_name, o_name)
            return f"{where} reads {n_name[0]}: {inside}" if inside else f"{where} reads {n_name[0]}, which changed"
    if new[4:6] != old[4:6]:
        inside = _module_difference(new[4:6], old[4:6])
        return f"a default argument of {where}: {inside}" if inside else f"the default arguments of {where} changed"
    for name, n_cell, o_cell in zip(n_code[4], new[6], old[6], strict=False):
        if n_cell != o_cell:
            inside = _module_difference(n_cell, o_cell)
            return f"{where} closes over {name}: {inside}" if inside else f"{name}, which {where} closes over, changed"
    return f"a value {where} closes over changed"


#: What thunder's DDP sets on a module it replicates (ours too: ``hooks.mark_module_ddp``); the user set none of them,
#: so a change is said as the strategy's (issue: "attribute bucket_size_in_mb was added" after switching FSDP to DDP).
_DDP_MARK = "use_ddp"
_DDP_WORDS = {
    "bucket_size_in_mb": "DDP's gradient bucket size",
    "process_group_for_ddp": "DDP's process group",
}


def _replicated(attributes: dict[str, Any]) -> bool:
    """DDP's marks: ``use_ddp`` with DDP's process group. ``use_ddp`` alone is what makes thunder key a trace on
    ``no_backward_sync`` (``hooks._key_cache_on_no_sync``, set on an FSDP module during its first compile too)."""
    return attributes.get(_DDP_MARK) is not None and "process_group_for_ddp" in attributes


def _attribute_change(module: str, new: dict[str, Any], old: dict[str, Any]) -> str:
    prefix = f"{module}." if module else ""
    if _replicated(new) == _replicated(old) and (new.get(_DDP_MARK) is None) != (old.get(_DDP_MARK) is None):
        return "no_backward_sync changed: a trace that accumulates gradients is kept apart from one that syncs them"
    if _replicated(new) != _replicated(old):
        model = f"{module} is" if module else "the model is"
        if _replicated(new):
            return f"the strategy changed: {model} now replicated by DDP (before: sharded by FSDP, or not distributed)"
        return f"the strategy changed: {model} no longer replicated by DDP"
    for attr in sorted(new.keys() | old.keys()):
        n, o = new.get(attr), old.get(attr)
        if n == o:
            continue
        if attr in _DDP_WORDS:
            shown = f" ({_shown(o)} -> {_shown(n)} MB)" if attr == "bucket_size_in_mb" else ""
            return f"{_DDP_WORDS[attr]} changed{shown}"
        if attr == "forward":
            return f"forward was replaced on {module or 'the root module'}"
        if attr in ("_forward_hooks", "_forward_pre_hooks"):
            return f"the forward hooks of {module or 'the root module'} changed"
        if n is None or o is None:
            return f"attribute {prefix}{attr} was {'added' if o is None else 'removed'}"
        if n[:1] == o[:1] == ("config",):
            return _config_change(f"{prefix}{attr}", n, o)
        return f"attribute {prefix}{attr} changed ({_shown(o)} -> {_shown(n)})"
    return f"the attributes of {module or 'the root module'} changed"


def _config_change(where: str, new: Any, old: Any) -> str:
    """A transformers configuration's first changed value (``thunder.reuse.identified.config_value``):
    ``attribute config.rms_norm_eps changed (1e-06 -> 1e-05)``."""
    if new[1:3] != old[1:3]:
        return f"attribute {where} is now a {new[2]} (was a {old[2]})"
    n_values, o_values = dict(new[3][1]), dict(old[3][1])
    for name in [*n_values, *(k for k in o_values if k not in n_values)]:
        n, o = n_values.get(name), o_values.get(name)
        if n != o:
            field = f"{where}.{name.strip(chr(39))}"
            if n is None or o is None:
                return f"attribute {field} was {'added' if o is None else 'removed'}"
            return f"attribute {field} changed ({_shown(o)} -> {_shown(n)})"
    return f"attribute {where} changed"


_TENSOR_FIELDS = (
    "shape",
    "dtype",
    "device",
    "requires_grad",
    "process group or sharding plan",
    "sharding",
    "padding",
    "tying to another tensor",
)


def _tensor_change(kind: str, module: str, new: dict[str, Any], old: dict[str, Any]) -> str:
    prefix = f"{module}." if module else ""
    for name in [*new, *(k for k in old if k not in new)]:  # in the module's own order
        n, o = new.get(name), old.get(name)
        if n == o:
            continue
        if n is None or o is None:
            return f"{kind} {prefix}{name} was {'added' if o is None else 'removed'}"
        for field, a, b in zip(_TENSOR_FIELDS, o, n, strict=True):
            if a != b:
                shown = f" ({a} -> {b})" if field in _TENSOR_FIELDS[:4] else ""
                return f"{kind} {prefix}{name}: its {field} changed{shown}"
    return f"a {kind} of {module or 'the root module'} changed"


def _input_change(new: Any, old: Any, what: str = "") -> str:
    """The first tensor whose metadata differs (``input 1``, counting tensors; or ``what`` when that is one)."""
    for i, (a, b) in enumerate(zip(_flat(old), _flat(new), strict=False)):
        for field, x, y in zip(_TENSOR_FIELDS[:4], a[1], b[1], strict=False):
            if x != y:
                return f"{what or f'input {i}'}'s {field} changed ({x} -> {y})"
    return f"{what} changed" if what else "the inputs changed"


def _flat(v: Any) -> Iterator[Any]:
    """The ``("tensor", key)`` descriptions in a key's nested tuples, in order."""
    if isinstance(v, tuple) and v[:1] == ("tensor",):
        yield v
    elif isinstance(v, tuple):
        for x in v:
            yield from _flat(x)
