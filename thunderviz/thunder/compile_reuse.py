"""Reuse thunder's initial trace when a cell sets up a model whose code and structure did not change (issue 29).

Why: thunder 0.2.6 spends most of a first call in ``thunder_general_jit`` (its bytecode interpreter: 78% of 13 s
for the tutorial's TinyGPT on these machines), and a notebook pays it on every rank for every cell, also when the
user re-runs a cell or switches ZERO2 to ZERO3 on the same model class. Its cache cannot help: it lives in one jitted
object, and a prologue checks values, never code. So the interpreter's result (prologue, computation and epilogue
traces) is kept here per process, under a key that covers everything the trace could depend on, and a later jitted
object with the same key gets a copy bound to its own module; thunder then runs everything after the interpreter as
usual (our transforms, autodiff, executors, fusion), and the new module still passes through a prologue that checks
its values.

The key (``reuse_key``), "when in doubt, compile":

- code: every class in the module tree and the code of every function reachable from its methods (helpers through
  globals and closures, recursively; library code by name), an instance's own functions (a replaced ``forward``),
  and forward hooks: any change is a different key;
- state: parameter and buffer names, shapes, dtypes, devices, ``requires_grad`` and what our strategies attached to
  them (process group, communication plan, full shape); each module's plain attributes (numbers, strings, dtypes,
  dataclass configs); an attribute of any other kind makes the call compile;
- the call: the inputs' metadata, thunder's compile options, executors, cache option and the cache info it keys on
  (grad mode, autocast, ``no_sync``), and the transforms (only ours may be present).

What our sync hook does while thunder interprets (``hooks._note_for_comm_pass``, ``hooks._key_cache_on_no_sync``)
is recorded with the entry and replayed for the new jitted object. Only modules our strategies marked (``mark``)
are reused, never a user's own ``thunder.jit`` elsewhere in the process; ``THUNDERVIZ_COMPILE_REUSE=0`` turns it off.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import os
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "ENV_VARIABLE",
    "NotReusable",
    "ReuseStats",
    "describe_tensors_with",
    "enabled",
    "group_key",
    "install",
    "mark",
    "plan_key",
    "recorded",
    "reuse_key",
    "stats",
    "take_events",
]

ENV_VARIABLE = "THUNDERVIZ_COMPILE_REUSE"
_MARK = "_thunderviz_compile_reuse"
#: entries kept per process (each holds three traces; a notebook compares a handful of strategies)
_CAPACITY = 16
#: modules whose code cannot change under a running process: named, not fingerprinted
_LIBRARIES = ("torch", "thunder", "lightning", "lightning_utilities", "builtins", "typing", "functools", "math")


@dataclasses.dataclass
class ReuseStats:
    """What the last calls did: ``hits`` reused a trace, ``misses`` interpreted (``last`` says which and why)."""

    hits: int = 0
    misses: int = 0
    last: str = ""
    last_interpret_s: float = 0.0


@dataclasses.dataclass
class _Entry:
    results: Any
    effects: list[tuple[Callable[..., Any], tuple[Any, ...], Any]]
    interpret_s: float


_lock = threading.Lock()
_store: OrderedDict[Any, _Entry] = OrderedDict()
_stats = ReuseStats()
#: what each marked compile did since the last ``take_events`` (a cell report shows them)
_events: list[str] = []
_recording = threading.local()
_installed = False


def enabled() -> bool:
    """Whether reuse is on in this process (``THUNDERVIZ_COMPILE_REUSE=0`` turns it off)."""
    return os.environ.get(ENV_VARIABLE, "1") != "0"


def stats() -> ReuseStats:
    """This process's counters (a copy)."""
    return dataclasses.replace(_stats)


def take_events() -> list[str]:
    """What each marked compile did since the last call (``reused ...`` / ``interpreted in 9.1 s: why``), and forget
    them: a rank calls it when a cell starts and when it ends."""
    out = list(_events)
    _events.clear()
    return out


def mark(module: torch.nn.Module, reuse: bool = True) -> None:
    """Let this module's jitted calls reuse a trace, or not (our strategies mark what they jit or distribute, with
    their ``compile_reuse`` option)."""
    object.__setattr__(module, _MARK, bool(reuse))


def recorded(
    fn: Callable[..., Any] | None = None, *, rebind: Callable[[tuple[Any, ...], Any], tuple[Any, ...]] | None = None
) -> Any:
    """Decorate a function our hook calls while thunder interprets: the call is recorded with the entry being built,
    and replayed when the entry is reused. ``rebind(args, module)`` gives the arguments for the module being jitted
    now (a parameter's communication plan names its own module); it raises ``NotReusable`` when it cannot."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any) -> Any:
            effects = getattr(_recording, "effects", None)
            if effects is not None:
                effects.append((f, args, rebind))
            return f(*args)

        return wrapper

    return decorate if fn is None else decorate(fn)


@contextmanager
def _record() -> Iterator[list[tuple[Callable[..., Any], tuple[Any, ...], Any]]]:
    previous = getattr(_recording, "effects", None)
    _recording.effects = effects = []
    try:
        yield effects
    finally:
        _recording.effects = previous


def install() -> None:
    """Wrap thunder's interpreter entry point once per process (thunder's ``jit`` looks it up at every cache miss)."""
    global _installed
    with _lock:
        if _installed:
            return
        import thunder

        original = thunder.thunder_general_jit

        @functools.wraps(original)
        def reusing_general_jit(fn: Any, args: Any, kwargs: Any, /, **kw: Any) -> Any:
            marked = getattr(fn, _MARK, None)
            if marked is None:  # not set up by our strategies: thunder as usual, not even counted
                return original(fn, args, kwargs, **kw)
            if not (marked and enabled()):
                t0 = time.perf_counter()
                results = original(fn, args, kwargs, **kw)
                _events.append(f"interpreted in {time.perf_counter() - t0:.1f} s (compile reuse is off)")
                return results
            key, why = reuse_key(fn, args, kwargs)
            entry = None if key is None else _store.get(key)
            if entry is not None:
                try:
                    calls = [(f, a if rebind is None else rebind(a, fn)) for f, a, rebind in entry.effects]
                except NotReusable as e:
                    entry, why = None, str(e)
            if entry is not None:
                _store.move_to_end(key)
                for f, a in calls:
                    f(*a)
                _stats.hits += 1
                _stats.last = f"reused a trace (interpreting it took {entry.interpret_s:.1f} s)"
                _events.append(f"reused an earlier set-up's trace (interpreting it took {entry.interpret_s:.1f} s)")
                return _rebound(entry.results, fn)
            if key is not None and not why:
                why = explain_miss(key, list(_store))
            t0 = time.perf_counter()
            with _record() as effects:
                results = original(fn, args, kwargs, **kw)
            took = time.perf_counter() - t0
            _stats.misses += 1
            _stats.last = f"interpreted in {took:.1f} s" + (f": {why}" if why else "")
            _stats.last_interpret_s = took
            ad_hoc = kw.get("ad_hoc_executor")
            if ad_hoc is not None and getattr(ad_hoc, "implmap", None):
                # Ops the interpreter registered on this jit's own executor (a custom autograd.Function): another
                # jitted object's executor list cannot run them.
                key = None
                _stats.last += " (not kept: it registered ops of its own)"
            _events.append(_stats.last)
            if key is not None:
                _store[key] = _Entry(_rebound(results, None), effects, took)
                while len(_store) > _CAPACITY:
                    _store.popitem(last=False)
            return results

        reusing_general_jit.__thunderviz_original__ = original  # type: ignore[attr-defined]
        thunder.thunder_general_jit = reusing_general_jit
        _installed = True


def _copy_trace(trace: Any, fn: Any = ...) -> Any:
    """A trace that shares the bound symbols (thunder's passes build new traces, never edit these) but not the
    containers a pass appends to; with ``fn``, bound to that callable (None: to nothing, so that a kept entry does
    not keep the module it was traced from alive)."""
    out = copy.copy(trace)
    out._bound_symbols = list(trace.bound_symbols)
    out.scopes = [out._bound_symbols]
    out.names = set(trace.names)
    out._tags = set(trace._tags)
    out._object_ctx = dict(trace._object_ctx)
    if fn is not ...:
        out.fn = fn
    return out


def _rebound(results: Any, fn: Any) -> Any:
    """The cached interpreter result, with the prologue reading its parameters from ``fn``."""
    return type(results)(
        _copy_trace(results.prologue_trace, fn),
        _copy_trace(results.computation_trace),
        None if results.epilogue_trace is None else _copy_trace(results.epilogue_trace),
        results.interpreter_log,
    )


# -- why a set-up compiled --------------------------------------------------------------------------------------


def explain_miss(key: Any, earlier: Sequence[Any]) -> str:
    """What differs between ``key`` and the latest earlier key of the same root class, in a user's words ("the code
    of Block.forward changed"): a user who edits a cell and re-runs it compares with what that cell set up before.
    Names the first difference found, walking the module tree in order; one is enough to explain a compile."""
    root = key[0][0][1][:3]
    same = [k for k in earlier if k[0][0][1][:3] == root]
    if not same:
        return f"the first set-up of a {_qualname(key[0][0][1])} in this process"
    old = same[-1]
    module, args, kwargs, jit = key
    if module != old[0]:
        return _module_change(module, old[0])
    if (args, kwargs) != (old[1], old[2]):
        return _input_change((args, kwargs), (old[1], old[2]))
    labels = (
        "the executors",
        "the jit options",
        "the cache option",
        "the sharp-edges option",
        "torch autograd support",
    )
    for label, new_part, old_part in zip((*labels, "grad mode, autocast or no_sync"), jit, old[3], strict=True):
        if new_part != old_part:
            return f"{label} changed"
    return ""


def _qualname(class_key: Any) -> str:
    return str(class_key[2] if len(class_key) > 2 else class_key[1])


def _shown(value: Any) -> str:
    """A key's description of a plain value as the user wrote it (``('float', '1e-05')`` -> ``1e-05``)."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str):
        return value[1]
    return "..."


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
    """``new``/``old``: ``_function_key``s of the same name. Names the helper a changed global refers to."""
    n_code, o_code = new[3], old[3]
    if n_code[0] != o_code[0] or n_code[1] != o_code[1] or n_code[3:] != o_code[3:]:
        return f"the code of {where} changed"
    for n_name, o_name in zip(n_code[2], o_code[2], strict=False):
        if n_name != o_name:
            return f"{where} reads {n_name[0]}, which changed"
    if new[4:6] != old[4:6]:
        return f"the default arguments of {where} changed"
    return f"a value {where} closes over changed"


def _attribute_change(module: str, new: dict[str, Any], old: dict[str, Any]) -> str:
    prefix = f"{module}." if module else ""
    for attr in sorted(new.keys() | old.keys()):
        n, o = new.get(attr), old.get(attr)
        if n == o:
            continue
        if attr == "forward":
            return f"forward was replaced on {module or 'the root module'}"
        if attr in ("_forward_hooks", "_forward_pre_hooks"):
            return f"the forward hooks of {module or 'the root module'} changed"
        if n is None or o is None:
            return f"attribute {prefix}{attr} was {'added' if o is None else 'removed'}"
        return f"attribute {prefix}{attr} changed ({_shown(o)} -> {_shown(n)})"
    return f"the attributes of {module or 'the root module'} changed"


_TENSOR_FIELDS = ("shape", "dtype", "device", "requires_grad", "process group or sharding plan", "sharding", "padding")


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


def _input_change(new: Any, old: Any) -> str:
    for i, (a, b) in enumerate(zip(_flat(old), _flat(new), strict=False)):
        for field, x, y in zip(_TENSOR_FIELDS[:4], a[1], b[1], strict=False):
            if x != y:
                return f"input {i}'s {field} changed ({x} -> {y})"
    return "the inputs changed"


def _flat(v: Any) -> Iterator[Any]:
    """The ``("tensor", key)`` descriptions in a key's nested tuples, in order."""
    if isinstance(v, tuple) and v[:1] == ("tensor",):
        yield v
    elif isinstance(v, tuple):
        for x in v:
            yield from _flat(x)


# -- the key ----------------------------------------------------------------------------------------------------


class NotReusable(Exception):
    """Something the key (or a replayed effect) cannot describe safely: compile."""


def reuse_key(fn: Any, args: Any, kwargs: Any) -> tuple[Any, str]:
    """(key, "") for a call that may reuse a trace, or (None, why not)."""
    if not isinstance(fn, torch.nn.Module):
        return None, "only modules are reused"
    try:
        seen: dict[int, Any] = {}
        return (
            (
                _module_key(fn, seen),
                _value(args, seen),
                _value(kwargs, seen),
                _thunder_key(),
            ),
            "",
        )
    except NotReusable as e:
        return None, f"not reusable: {e}"


def _thunder_key() -> tuple[Any, ...]:
    import thunder
    from thunder.core.compile_data import get_compile_data

    from thunderviz.thunder.comm_pass import CommTransform

    cd = get_compile_data()
    if cd is None:
        raise NotReusable("no compile data")
    if any(not isinstance(t, CommTransform) for t in cd.transforms or ()):
        raise NotReusable("the jitted object has transforms of its own")
    options = tuple(sorted((k, repr(v)) for k, v in (cd.compile_options or {}).items()))
    info = tuple(sorted((k, repr(v)) for k, v in thunder._get_cache_info().items()))
    return (
        # every jit has its own ad hoc executor (named by id): what it holds is checked when an entry is kept
        tuple(ex.name for ex in cd.executors_list if not ex.name.startswith("__ad_hoc_executor")),
        options,
        str(cd.cache_option),
        str(cd.sharp_edges),
        bool(cd.disable_torch_autograd_support),
        info,
    )


def group_key(group: Any) -> tuple[Any, ...]:
    """A process group by identity (a trace calls that very object) and by what it is, should an id be reused."""
    size = getattr(group, "size", None)
    rank = getattr(group, "rank", None)
    return ("group", id(group), size() if callable(size) else None, rank() if callable(rank) else None)


def plan_key(config: Any) -> str:
    """A parameter's communication plan, less what the replayed plan brings (``hooks._plan_of``): the id of the
    module it belongs to (new with every set-up) and ZERO3's resharding (tags set at replay)."""
    if dataclasses.is_dataclass(config) and hasattr(config, "owner_id"):
        # ZERO2 and ZERO3 interpret to the same trace: the replayed plan sets the tags that differ
        config = dataclasses.replace(config, owner_id=0, reshard_after_forward=False)
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


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (
        tuple(t.shape),
        str(t.dtype),
        str(t.device),
        t.requires_grad,
        _tensor_facts(t),
        repr(getattr(t, "distparallel_type", None)),
        repr(getattr(t, "_thunder_fsdp_padding_size", None)),
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
    _MARK,
}


def _module_key(module: torch.nn.Module, seen: dict[int, Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for name, m in module.named_modules(remove_duplicate=False):
        attrs = []
        for attr, value in sorted(vars(m).items()):
            if attr in _MODULE_BOOKKEEPING:
                continue
            if attr in ("_forward_hooks", "_forward_pre_hooks"):
                attrs.append((attr, tuple(_value(h, seen) for h in value.values())))
                continue
            attrs.append((attr, _value(value, seen)))
        out.append(
            (
                name,
                _class_key(type(m), seen),
                m.training,
                tuple(attrs),
                tuple((n, _tensor_key(p)) for n, p in m.named_parameters(recurse=False)),
                tuple((n, None if b is None else _tensor_key(b)) for n, b in m.named_buffers(recurse=False)),
            )
        )
    return tuple(out)


def _is_library(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".", 1)[0] in _LIBRARIES


def _class_key(cls: type, seen: dict[int, Any]) -> Any:
    if id(cls) in seen:
        return ("class", cls.__qualname__)
    seen[id(cls)] = True
    if _is_library(cls):
        return ("class", cls.__module__, cls.__qualname__)
    members = []
    for klass in cls.__mro__:
        if klass is object or _is_library(klass):
            continue
        for attr, value in sorted(vars(klass).items()):
            if attr in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__"):
                continue
            members.append((klass.__qualname__, attr, _value(value, seen)))
    return ("class", cls.__module__, cls.__qualname__, tuple(members))


def _code_key(code: types.CodeType, glob: dict[str, Any], seen: dict[int, Any]) -> tuple[Any, ...]:
    consts = tuple(
        _code_key(c, glob, seen) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
        for c in code.co_consts
    )
    names = []
    for n in code.co_names:
        if n in glob:
            names.append((n, _value(glob[n], seen, global_name=True)))
        else:
            names.append((n,))
    return (code.co_code, consts, tuple(names), code.co_varnames, code.co_freevars)


def _function_key(f: types.FunctionType, seen: dict[int, Any]) -> Any:
    if id(f) in seen:
        return ("function", f.__qualname__)
    seen[id(f)] = True
    if _is_library(f):
        return ("function", f.__module__, f.__qualname__)
    cells = tuple(_value(c.cell_contents, seen) for c in (f.__closure__ or ()))
    return (
        "function",
        f.__module__,
        f.__qualname__,
        _code_key(f.__code__, f.__globals__, seen),
        _value(f.__defaults__, seen),
        _value(f.__kwdefaults__, seen),
        cells,
    )


def _value(v: Any, seen: dict[int, Any], *, global_name: bool = False) -> Any:
    """A hashable description of ``v``, or ``NotReusable``: never ``id()`` alone for something whose content matters."""
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return (type(v).__name__, repr(v))
    if isinstance(v, (torch.dtype, torch.device, torch.Size, enum.Enum)):
        return (type(v).__name__, repr(v))
    if isinstance(v, (tuple, list, frozenset, set)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return (type(v).__name__, tuple(_value(x, seen) for x in items))
    if isinstance(v, dict):
        return ("dict", tuple((repr(k), _value(x, seen)) for k, x in v.items()))
    if isinstance(v, torch.Tensor):
        if isinstance(v, torch.nn.Parameter) or global_name:
            raise NotReusable("a tensor is read as a constant")
        return ("tensor", _tensor_key(v))
    if isinstance(v, types.FunctionType):
        return _function_key(v, seen)
    if isinstance(v, types.MethodType):
        return ("method", _value(v.__func__, seen), id(v.__self__))
    if isinstance(v, (staticmethod, classmethod)):
        return (type(v).__name__, _value(v.__func__, seen))
    if isinstance(v, property):
        return ("property", _value(v.fget, seen), _value(v.fset, seen))
    if isinstance(v, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)):
        return ("builtin", getattr(v, "__module__", None), getattr(v, "__qualname__", repr(v)))
    if isinstance(v, types.ModuleType):
        return ("module", v.__name__)
    if isinstance(v, type):
        return _class_key(v, seen)
    if isinstance(v, torch.distributed.ProcessGroup):
        return group_key(v)
    if isinstance(v, torch.nn.Module):
        if global_name:  # a module the code reads from its globals: outside the tree the key walks, so walk it here
            return ("global module", id(v), _module_key(v, seen))
        return ("submodule", type(v).__qualname__)  # its own entry in the module tree covers the rest
    if dataclasses.is_dataclass(v):
        return ("dataclass", _class_key(type(v), seen), repr(v))
    if _is_library(type(v)) and isinstance(v, Callable):  # e.g. a torch op overload, functools.partial of torch
        return ("library", type(v).__module__, type(v).__qualname__, repr(v))
    if global_name:
        # A global the code names but that is none of the above (a logger, a registry): its identity is enough
        # only when the code does not read data out of it; we cannot tell, so compile.
        raise NotReusable(f"a global of type {type(v).__name__}")
    raise NotReusable(f"an attribute of type {type(v).__name__}")
