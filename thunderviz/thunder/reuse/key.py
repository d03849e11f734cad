"""The key under which compile reuse keeps thunder's interpreted trace (``thunderviz.thunder.reuse.compile_reuse``).

A key describes everything the interpreter's result could depend on, as hashable data, or raises ``NotReusable``:
"when in doubt, compile". What it covers is listed in ``compile_reuse``'s docstring; how:

- a jitted module (cases 1 and 3) is keyed by its tree (``_module_key``);
- a jitted function (case 2) by its code and everything it reaches (``_function_key``): globals its code loads,
  closure cells, defaults, and its arguments. Every ``nn.Module`` met on the way is a *root*: keyed in full where it
  is first met (its tree, state and plans, never its identity), by position where it is met again. The trace reads
  such a module through the function (``fn.__closure__[0].cell_contents``, ``fn.__globals__['model']``) or its
  arguments at run time, so a new function object holding an equal model reuses correctly once the prologue is bound
  to it; ``roots`` tells ``compile_reuse`` which new module takes the place of which old one (per-parameter plans are
  rebound by it);
- a tensor met twice (tied weights, or a submodule passed next to its parent) is marked as such: our sync hook
  gathers a tied parameter once, so tying changes a distributed trace.

Neither lightning nor IPython is imported: Fabric's wrapper is recognised by its class (``_fabric_inner``).
"""

from __future__ import annotations

import dataclasses
import dis
import enum
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from thunderviz.thunder.jit.checkpointed_forward import CheckpointedForward
from thunderviz.thunder.reuse.identified import class_members, config_value, identity, is_identified

__all__ = [
    "FUNCTION",
    "MARK",
    "PLAN_NEUTRAL",
    "NotReusable",
    "describe_tensors_with",
    "group_key",
    "key_of",
    "modules_reached",
    "plan_key",
]

#: the attribute ``compile_reuse.mark`` sets on a module (read here to leave it out of the module's own key)
MARK = "_thunderviz_compile_reuse"
#: a key's first part for a jitted function: (FUNCTION, its ``_function_key``); a module's is its ``_module_key``
FUNCTION = "jitted function"
#: modules whose code cannot change under a running process: named, not fingerprinted
_LIBRARIES = ("torch", "thunder", "lightning", "lightning_utilities", "builtins", "typing", "functools", "math")
#: what Fabric's strategy and precision are named by (their code cannot change under a running process either)
_NAMED_PACKAGES = (*_LIBRARIES, "lightning_fabric", "thunderviz")


#: the constants a dataclass's fields and generated ``__init__`` hold in place of a default
_DATACLASS_MARKERS = tuple(
    m for m in (dataclasses.MISSING, getattr(dataclasses, "_HAS_DEFAULT_FACTORY", None), dataclasses.KW_ONLY) if m
)
#: the type of a dataclass's ``__dataclass_params__`` (its decorator's options; not public under a name of its own)
_DATACLASS_PARAMS = type(dataclasses.make_dataclass("_Options", []).__dataclass_params__)


class NotReusable(Exception):
    """Something the key (or a replayed effect) cannot describe safely: compile."""


@dataclasses.dataclass
class _Walk:
    """What one key has met so far: classes and functions keyed already (met again: named only), tensors (met again:
    tied), and for a jitted function the modules it reaches (``roots``, each keyed in full once)."""

    seen: dict[int, Any] = dataclasses.field(default_factory=dict)
    tensors: dict[int, int] = dataclasses.field(default_factory=dict)
    roots: list[torch.nn.Module] | None = None
    root_at: dict[int, int] = dataclasses.field(default_factory=dict)


def key_of(fn: Any, args: Any, kwargs: Any, jit: Callable[[], tuple[Any, ...]]) -> tuple[Any, list[Any] | None]:
    """``((subject, args, kwargs, jit()), roots)``: roots is None for a module (it is its own root), the modules a
    function reaches in the order keyed otherwise. Raises ``NotReusable``."""
    if isinstance(fn, torch.nn.Module):
        walk = _Walk()
        subject: Any = _module_key(fn, walk)
    elif isinstance(fn, types.FunctionType):
        walk = _Walk(roots=[])
        subject = (FUNCTION, _function_key(fn, walk))
    else:
        raise NotReusable(f"only modules and plain functions are reused, not a {type(fn).__name__}")
    key = (subject, _value(args, walk), _value(kwargs, walk), jit())
    return key, walk.roots


def modules_reached(fn: Any, args: Any, kwargs: Any) -> Iterator[torch.nn.Module]:
    """The modules a jitted callable is handed or names directly (arguments, closure cells, defaults, the globals its
    code loads; Fabric's wrapper opened): what tells whether our strategies set up what it traces. Cheap; the key
    walks further."""
    found: list[Any] = [args, kwargs]
    if isinstance(fn, types.FunctionType):
        found += [_cell(c) for c in fn.__closure__ or ()]
        found += [fn.__defaults__, fn.__kwdefaults__]
        found += [fn.__globals__[n] for n in _global_loads(fn.__code__, deep=True) if n in fn.__globals__]
    elif isinstance(fn, types.MethodType):
        found.append(fn.__self__)
    for v in found:
        yield from _modules_in(v, depth=0)


#: where Fabric's ``_FabricModule`` is defined (``thunder.modules`` knows the same; importing it here would close an
#: import cycle through ``hooks``)
_FABRIC_WRAPPERS = ("lightning.fabric.wrappers", "lightning_fabric.wrappers")


def _fabric_inner(v: Any) -> Any:
    """The module inside Fabric's wrapper, or None when ``v`` is not one."""
    cls = type(v)
    if cls.__name__ == "_FabricModule" and cls.__module__ in _FABRIC_WRAPPERS:
        return v._forward_module
    return None


#: containers longer than this are not searched for modules (a global list of samples the function loads)
_SCANNED = 64


def _modules_in(v: Any, depth: int) -> Iterator[torch.nn.Module]:
    if isinstance(v, torch.nn.Module):
        yield v
        inner = _fabric_inner(v)
        if inner is not None:
            yield inner
    elif depth < 4 and isinstance(v, (tuple, list)) and len(v) <= _SCANNED:
        for x in v:
            yield from _modules_in(x, depth + 1)
    elif depth < 4 and isinstance(v, dict) and len(v) <= _SCANNED:
        for x in v.values():
            yield from _modules_in(x, depth + 1)


def group_key(group: Any) -> tuple[Any, ...]:
    """A process group by identity (a trace calls that very object) and by what it is, should an id be reused."""
    size = getattr(group, "size", None)
    rank = getattr(group, "rank", None)
    return ("group", id(group), size() if callable(size) else None, rank() if callable(rank) else None)


#: what a parameter's plan may differ in and still interpret to the same trace (``plan_key``, ``hooks._plan_of``)
PLAN_NEUTRAL = {"owner_id": 0, "reshard_after_forward": False, "label": "", "bucketing": None}


def plan_key(config: Any) -> str:
    """A parameter's communication plan, less what the replayed plan brings (``hooks._plan_of``): the id of the
    module it belongs to (new with every set-up), ZERO3's resharding (tags set at replay) and FSDP's bucket (its
    label and bucketing: the interpreter only inserts each parameter's gather; the communication pass, after it,
    packs them into buckets from the replayed plan's labels)."""
    if dataclasses.is_dataclass(config) and hasattr(config, "owner_id"):
        # ZERO2 / ZERO3 and BLOCK / LAYER interpret to the same trace: the replayed plan sets what differs
        config = dataclasses.replace(config, **PLAN_NEUTRAL)
    return repr(config)


def _no_facts(t: torch.Tensor) -> tuple[Any, ...]:
    return ()


#: what our strategies attached to a tensor (process group, plan, full shape): ``hooks`` registers the reader
#: (``describe_tensors_with``), since hooks imports this module and not the reverse
_tensor_facts: Callable[[torch.Tensor], tuple[Any, ...]] = _no_facts


def describe_tensors_with(facts: Callable[[torch.Tensor], tuple[Any, ...]]) -> None:
    """Register what, beyond shape, dtype, device and requires_grad, the key must know of a tensor."""
    global _tensor_facts
    _tensor_facts = facts


def _tensor_key(t: torch.Tensor, walk: _Walk) -> tuple[Any, ...]:
    n = len(walk.tensors)
    first = walk.tensors.setdefault(id(t), n)
    return (
        tuple(t.shape),
        str(t.dtype),
        str(t.device),
        t.requires_grad,
        _tensor_facts(t),
        repr(getattr(t, "distparallel_type", None)),
        repr(getattr(t, "_thunder_fsdp_padding_size", None)),
        None if first == n else first,  # the same tensor met before (tied): which one
    )


_MODULE_BOOKKEEPING = {
    "_parameters",
    "_buffers",
    "_modules",
    "_non_persistent_buffers_set",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_is_full_backward_hook",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
    "training",
    MARK,
}


def _attributes_key(m: torch.nn.Module, walk: _Walk, skip: frozenset[str] = frozenset()) -> tuple[Any, ...]:
    attrs = []
    for attr, value in sorted(vars(m).items()):
        if attr in _MODULE_BOOKKEEPING or attr in skip:
            continue
        if attr in ("_forward_hooks", "_forward_pre_hooks"):  # keyed by handle ids: their functions count
            attrs.append((attr, tuple(_value(h, walk) for h in value.values())))
            continue
        if attr == "forward" and _checkpoints_own_forward(m, value):  # the strategy's activation checkpointing
            attrs.append((attr, ("checkpointed", _value(value.forward.__func__, walk))))
            continue
        attrs.append((attr, _value(value, walk)))
    return tuple(attrs)


def _checkpoints_own_forward(m: torch.nn.Module, value: Any) -> bool:
    """``value`` is ``checkpointed_forward.CheckpointedForward`` around ``m``'s own bound ``forward``: what activation
    checkpointing sets on each selected module. Keyed as that method's function under checkpointing, not by the
    module's identity, so an equal model checkpointed the same way reuses."""
    inner = getattr(value, "forward", None)
    return isinstance(value, CheckpointedForward) and isinstance(inner, types.MethodType) and inner.__self__ is m


def _module_key(module: torch.nn.Module, walk: _Walk) -> tuple[Any, ...]:
    out: list[Any] = []
    for name, m in module.named_modules(remove_duplicate=False):
        out.append(
            (
                name,
                _class_key(type(m), walk),
                m.training,
                _attributes_key(m, walk),
                tuple((n, _tensor_key(p, walk)) for n, p in m.named_parameters(recurse=False)),
                tuple((n, None if b is None else _tensor_key(b, walk)) for n, b in m.named_buffers(recurse=False)),
            )
        )
    return tuple(out)


def _root_key(v: torch.nn.Module, walk: _Walk) -> tuple[Any, ...]:
    """A module a jitted function reaches: in full where first met, by position where met again."""
    assert walk.roots is not None
    at = walk.root_at.get(id(v))
    if at is not None:
        return ("nn.Module", at)
    walk.root_at[id(v)] = at = len(walk.roots)
    walk.roots.append(v)
    if _fabric_inner(v) is not None:
        return ("Fabric", at, _fabric_key(v, walk))
    if type(v).__name__ == "ThunderModule" and _is_library(type(v)):
        raise NotReusable("a jitted module is called inside the jitted function")
    return ("nn.Module", at, _module_key(v, walk))


SET_UP_ONLY = "__thunderviz_set_up_only__"
"""Marks a function a strategy installs on Fabric's objects that runs at set-up only (the front-door check on the
precision's ``convert_module``): never in forward, so the key skips it (its closure reaches the whole strategy)."""


def _fabric_key(wrapper: torch.nn.Module, walk: _Walk) -> tuple[Any, ...]:
    """Fabric's ``_FabricModule``: its forward runs the strategy's precision (input and output casts, autocast), so
    the strategy's and precision's classes and the precision's settings count, and the modules it wraps."""
    strategy = getattr(wrapper, "_strategy", None)
    precision = getattr(strategy, "precision", None)
    if strategy is None or precision is None:
        raise NotReusable("Fabric's wrapper has no strategy or precision")
    return (
        _named_class(type(strategy), walk),
        _named_class(type(precision), walk),
        tuple((k, _value(x, walk)) for k, x in sorted(vars(precision).items()) if not getattr(x, SET_UP_ONLY, False)),
        wrapper.training,
        _attributes_key(wrapper, walk, skip=frozenset({"_strategy"})),
        tuple((n, _root_key(m, walk)) for n, m in wrapper._modules.items() if m is not None),
    )


def _named_class(cls: type, walk: _Walk) -> Any:
    if (cls.__module__ or "").split(".", 1)[0] in _NAMED_PACKAGES:
        return ("class", cls.__module__, cls.__qualname__)
    return _class_key(cls, walk)


def _is_library(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".", 1)[0] in _LIBRARIES


def _class_key(cls: type, walk: _Walk) -> Any:
    if id(cls) in walk.seen:
        return ("class", cls.__qualname__)
    walk.seen[id(cls)] = True
    if _is_library(cls):
        return ("class", cls.__module__, cls.__qualname__)
    members = []
    for klass in cls.__mro__:
        if klass is object or _is_library(klass) or is_identified(klass):
            continue
        for attr, value in sorted(vars(klass).items()):
            if attr in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__"):
                continue
            members.append((klass.__qualname__, attr, _value(value, walk)))
    if any(is_identified(klass) for klass in cls.__mro__):  # a transformers class, or the user's subclass of one
        members.extend(class_members(cls, walk.seen))
    return ("class", cls.__module__, cls.__qualname__, tuple(members))


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME", "DELETE_NAME"})


@functools.lru_cache(maxsize=4096)
def _global_loads(code: types.CodeType, deep: bool = False) -> frozenset[str]:
    """The names ``code`` looks up in its globals (not the attribute names ``co_names`` also holds: ``x.loss`` must not
    walk a global ``loss``); with ``deep``, also those of the code nested in it (lambdas, comprehensions)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS}
    if deep:
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                names |= _global_loads(c, deep=True)
    return frozenset(names)


def _code_key(code: types.CodeType, glob: dict[str, Any], walk: _Walk) -> tuple[Any, ...]:
    consts = tuple(
        _code_key(c, glob, walk) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
        for c in code.co_consts
    )
    loads = _global_loads(code)
    names = []
    for n in code.co_names:
        if n in loads and n in glob:
            names.append((n, _value(glob[n], walk, global_name=True)))
        else:
            names.append((n,))
    return (code.co_code, consts, tuple(names), code.co_varnames, code.co_freevars)


_EMPTY = object()


def _cell(c: types.CellType) -> Any:
    try:
        return c.cell_contents
    except ValueError:  # a cell not filled yet (a closure over a name assigned later)
        return _EMPTY


def _function_key(f: types.FunctionType, walk: _Walk) -> Any:
    if id(f) in walk.seen:
        return ("function", f.__qualname__)
    walk.seen[id(f)] = True
    if _is_library(f):
        return ("function", f.__module__, f.__qualname__)
    if is_identified(f):
        return ("function", f.__module__, f.__qualname__, identity(f))
    cells = tuple(_value(_cell(c), walk) for c in (f.__closure__ or ()))
    return (
        "function",
        f.__module__,
        f.__qualname__,
        _code_key(f.__code__, f.__globals__, walk),
        _value(f.__defaults__, walk),
        _value(f.__kwdefaults__, walk),
        cells,
    )


def _value(v: Any, walk: _Walk, *, global_name: bool = False) -> Any:
    """A hashable description of ``v``, or ``NotReusable``: never ``id()`` alone for something whose content matters."""
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return (type(v).__name__, repr(v))
    if v is _EMPTY:
        return ("empty cell",)
    if any(v is marker for marker in _DATACLASS_MARKERS):  # no default; "default from the factory" in __init__
        return ("dataclass marker", type(v).__name__)
    if isinstance(v, (torch.dtype, torch.device, torch.Size, enum.Enum)):
        return (type(v).__name__, repr(v))
    if isinstance(v, (tuple, list, frozenset, set)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return (type(v).__name__, tuple(_value(x, walk) for x in items))
    if isinstance(v, dict):
        return ("dict", tuple((repr(k), _value(x, walk)) for k, x in v.items()))
    if isinstance(v, torch.Tensor):
        if isinstance(v, torch.nn.Parameter) or global_name:
            raise NotReusable("a tensor is read as a constant")
        return ("tensor", _tensor_key(v, walk))
    if isinstance(v, types.FunctionType):
        return _function_key(v, walk)
    if isinstance(v, types.MethodType):
        if walk.roots is not None and isinstance(v.__self__, torch.nn.Module):
            return ("method", _value(v.__func__, walk), _root_key(v.__self__, walk))
        return ("method", _value(v.__func__, walk), id(v.__self__))
    if isinstance(v, (staticmethod, classmethod)):
        return (type(v).__name__, _value(v.__func__, walk))
    if isinstance(v, property):
        return ("property", _value(v.fget, walk), _value(v.fset, walk))
    if isinstance(v, dataclasses.Field):
        # a dataclass's own description of a field (in ``__dataclass_fields__``: litgpt's ``Config``, which its
        # ``GPT`` keeps as ``config``): what the class's instances hold is keyed by their values, the field by the
        # defaults and options a new instance would get
        return ("field", v.name, repr(v.type), _value(v.default, walk), _value(v.default_factory, walk), v.init)
    if isinstance(v, _DATACLASS_PARAMS):
        return ("dataclass params", repr(v))
    if isinstance(v, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)):
        return ("builtin", getattr(v, "__module__", None), getattr(v, "__qualname__", repr(v)))
    if isinstance(v, types.ModuleType):
        return ("module", v.__name__)
    if isinstance(v, type):
        return _class_key(v, walk)
    if isinstance(v, torch.distributed.ProcessGroup):
        return group_key(v)
    if isinstance(v, torch.nn.Module):
        if walk.roots is not None:  # a jitted function's: every module it reaches is keyed whole
            return _root_key(v, walk)
        if global_name:  # a module the code reads from its globals: outside the tree the key walks, so walk it here
            return ("global module", id(v), _module_key(v, walk))
        return ("submodule", type(v).__qualname__)  # its own entry in the module tree covers the rest
    config = config_value(v, lambda x: _value(x, walk))
    if config is not None:
        return config
    if dataclasses.is_dataclass(v):
        return ("dataclass", _class_key(type(v), walk), repr(v))
    if isinstance(v, functools.partial):
        # by what it calls and with what, not by its repr (which names a local function by address): litgpt's
        # initialize_weights gives every Linear and Embedding a partial of a function it defines on each call
        return ("partial", _value(v.func, walk), _value(v.args, walk), _value(v.keywords, walk))
    if _is_library(type(v)) and isinstance(v, Callable):  # e.g. a torch op overload
        return ("library", type(v).__module__, type(v).__qualname__, repr(v))
    if global_name:
        # A global the code names but that is none of the above (a logger, a registry): its identity is enough
        # only when the code does not read data out of it; we cannot tell, so compile.
        raise NotReusable(f"a global of type {type(v).__name__}")
    raise NotReusable(f"an attribute of type {type(v).__name__}")
