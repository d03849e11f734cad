"""Reuse thunder's initial trace when a cell sets up a model whose code and structure did not change.

Why: thunder 0.2.6 spends most of a first call in ``thunder_general_jit`` (its bytecode interpreter: 78% of 13 s for
the tutorial's TinyGPT on these machines), and a notebook pays it on every rank for every cell, also when the user
re-runs a cell or switches ZERO2 to ZERO3 or BLOCK to LAYER on the same model class. Its cache cannot help: it lives
in one jitted object, and a prologue checks values, never code. So the interpreter's result (prologue, computation and
epilogue traces) is kept here per process, under a key that covers everything the trace could depend on, and a later
call with the same key gets a copy whose prologue is bound to its own module or function; thunder then runs everything
after the interpreter as usual (our transforms, autodiff, executors, fusion), and the new call still passes through a
prologue that checks its values.

What is reused: a module our strategies jit (case 1) or distribute (case 3), and a function the user jitted that is
handed, or names, a module our strategies set up with ``jit=False`` (case 2: ``thunder.jit(train_step)``). A
function's prologue reads its modules at run time through its arguments, globals or closure cells, so a re-run cell
that sets up an equal model (or redefines the function with the same code around an equal model) reuses, and every
plan recorded for a module is rebound to the module in the same place now.

The key (``thunder.reuse.key.key_of``), "when in doubt, compile":

- code: every class in the module tree and the code of every function reachable from its methods, or from the jitted
  function (helpers through the globals the code loads and through closures, recursively; library code by name), an
  instance's own functions (a replaced ``forward``), and forward hooks: any change is a different key;
- state: parameter and buffer names, shapes, dtypes, devices, ``requires_grad``, tying, and what our strategies
  attached to them (process group, communication plan, full shape); each module's plain attributes (numbers,
  strings, dtypes, dataclass configs); an attribute or global of any other kind makes the call compile. A function's
  modules (arguments, closure cells, globals, Fabric's wrapper with its precision) are keyed whole, not by identity;
- the call: the inputs' metadata, thunder's compile options, executors, cache option and the cache info it keys on
  (grad mode, autocast, ``no_sync``), and the transforms (only ours may be present).

Why a call compiled anyway is said by ``thunder.reuse.why_not.explain_miss``. What our sync hook does while thunder
interprets
(``hooks._note_for_comm_pass``, ``hooks._key_cache_on_no_sync``) is recorded with the entry and replayed for the new
call. Only what our strategies marked (``mark``) is reused, never a user's own ``thunder.jit`` of anything else in
the process; ``THUNDERVIZ_COMPILE_REUSE=0`` turns it off. A plan's rehearsals (``thunder.memory.rehearsal``) mark their
meta-device copies ``QUIET``: they reuse each other's traces, apart from the set-ups and unseen by the cell.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from thunderviz.errors import ThundervizError
from thunderviz.thunder.jit.untraceable import explain as explain_trace_failure
from thunderviz.thunder.jit.untraceable import leave_half_traced_vmap
from thunderviz.thunder.reuse.key import MARK as _MARK
from thunderviz.thunder.reuse.key import (
    PLAN_NEUTRAL,
    NotReusable,
    describe_tensors_with,
    group_key,
    key_of,
    modules_reached,
    plan_key,
)
from thunderviz.thunder.reuse.why_not import explain_miss

__all__ = [
    "ENV_VARIABLE",
    "PLAN_NEUTRAL",
    "QUIET",
    "NotReusable",
    "ReuseStats",
    "describe_tensors_with",
    "enabled",
    "explain_miss",
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
#: entries kept per process (each holds three traces; a notebook compares a handful of strategies), and as many
#: of the predictions' (``QUIET``)
_CAPACITY = 16


@dataclasses.dataclass
class ReuseStats:
    """What the last calls did: ``hits`` reused a trace, ``misses`` interpreted (``last`` says which and why)."""

    hits: int = 0
    misses: int = 0
    last: str = ""
    last_interpret_s: float = 0.0
    #: compiles for a prediction (``QUIET``) that reused a trace; they are in none of the fields above
    quiet_hits: int = 0


@dataclasses.dataclass
class _Entry:
    results: Any
    #: (function, arguments, rebind, owner): owner is the position, among the modules a jitted function reaches, of
    #: the module whose plan the call carries (None: the jitted module itself, or no plan)
    effects: list[tuple[Callable[..., Any], tuple[Any, ...], Any, int | None]]
    interpret_s: float
    #: kept for a prediction (``QUIET``): not what a set-up is compared with, nor counted against its capacity
    quiet: bool = False


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


#: the mark of a module jitted to predict, not to train (``thunder.memory.rehearsal``'s meta copy): it reuses and is
#: kept like the others, but it is nobody's set-up, so it stays out of ``stats`` and of the cell's compile log
QUIET = "quiet"


def mark(module: torch.nn.Module, reuse: bool = True, *, quiet: bool = False) -> None:
    """Let this module's jitted calls, and those of a jitted function that takes it, reuse a trace, or not (our
    strategies mark what they set up, with their ``compile_reuse`` option); ``quiet``: see ``QUIET``."""
    object.__setattr__(module, _MARK, QUIET if reuse and quiet else bool(reuse))


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

        interpret = thunder.thunder_general_jit

        def original(fn: Any, args: Any, kwargs: Any, /, **kw: Any) -> Any:
            # A model our strategies set up that thunder cannot trace: the error names its module, line and op.
            try:
                return interpret(fn, args, kwargs, **kw)
            except ThundervizError:
                raise
            except Exception as err:
                leave_half_traced_vmap()
                explained = explain_trace_failure(err, _roots(fn, args, kwargs))
                if explained is None:
                    raise
                raise explained from err

        @functools.wraps(interpret)
        def reusing_general_jit(fn: Any, args: Any, kwargs: Any, /, **kw: Any) -> Any:
            marked = _marked(fn, args, kwargs)
            if marked is None:  # not set up by our strategies: thunder as usual, not even counted
                return interpret(fn, args, kwargs, **kw)
            quiet = marked == QUIET
            if not (marked and enabled()):
                t0 = time.perf_counter()
                results = original(fn, args, kwargs, **kw)
                if not quiet:
                    _events.append(f"interpreted in {time.perf_counter() - t0:.1f} s (compile reuse is off)")
                return results
            key, why, roots = _keyed(fn, args, kwargs)
            entry = None if key is None else _store.get(key)
            if entry is not None:
                try:
                    calls = [
                        (f, a if rebind is None else rebind(a, fn if owner is None or roots is None else roots[owner]))
                        for f, a, rebind, owner in entry.effects
                    ]
                except NotReusable as e:
                    entry, why = None, str(e)
            if entry is not None:
                _store.move_to_end(key)
                for f, a in calls:
                    f(*a)
                if quiet:
                    _stats.quiet_hits += 1
                else:
                    _stats.hits += 1
                    _stats.last = f"reused a trace (interpreting it took {entry.interpret_s:.1f} s)"
                    _events.append(f"reused an earlier set-up's trace (interpreting it took {entry.interpret_s:.1f} s)")
                return _rebound(entry.results, fn)
            if key is not None and not why and not quiet:
                why = explain_miss(key, [k for k, e in _store.items() if not e.quiet])
            t0 = time.perf_counter()
            with _record() as effects:
                results = original(fn, args, kwargs, **kw)
            took = time.perf_counter() - t0
            last = f"interpreted in {took:.1f} s" + (f": {why}" if why else "")
            ad_hoc = kw.get("ad_hoc_executor")
            if ad_hoc is not None and getattr(ad_hoc, "implmap", None):
                # Ops the interpreter registered on this jit's own executor (a custom autograd.Function): another
                # jitted object's executor list cannot run them.
                key = None
                last += " (not kept: it registered ops of its own)"
            owners: list[int | None] = [None] * len(effects)
            if key is not None and roots is not None:
                try:
                    owners = _owners(effects, roots)
                except NotReusable as e:
                    key = None
                    last += f" (not kept: {e})"
            if not quiet:
                _stats.misses += 1
                _stats.last, _stats.last_interpret_s = last, took
                _events.append(last)
            if key is not None:
                kept = [(f, a, rebind, owner) for (f, a, rebind), owner in zip(effects, owners, strict=True)]
                _store[key] = _Entry(_rebound(results, None), kept, took, quiet)
                alike = [k for k, e in _store.items() if e.quiet == quiet]
                for old in alike[: max(0, len(alike) - _CAPACITY)]:
                    del _store[old]
            return results

        reusing_general_jit.__thunderviz_original__ = interpret  # type: ignore[attr-defined]
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


# -- the key and the modules behind it ----------------------------------------------------------------------------


def reuse_key(fn: Any, args: Any, kwargs: Any) -> tuple[Any, str]:
    """(key, "") for a call that may reuse a trace, or (None, why not)."""
    key, why, _roots = _keyed(fn, args, kwargs)
    return key, why


def _keyed(fn: Any, args: Any, kwargs: Any) -> tuple[Any, str, list[Any] | None]:
    try:
        key, roots = key_of(fn, args, kwargs, _thunder_key)
    except NotReusable as e:
        return None, f"not reusable: {e}", None
    return key, "", roots


def _roots(fn: Any, args: Any, kwargs: Any) -> list[torch.nn.Module]:
    """The modules a failed trace may have stopped in: the jitted module, or those a jitted function reaches."""
    return [fn] if isinstance(fn, torch.nn.Module) else list(modules_reached(fn, args, kwargs))


def _marked(fn: Any, args: Any, kwargs: Any) -> bool | None:
    """A module's mark (``mark``); for a jitted function, the marks of the modules it is handed or names: None when
    our strategies set up none of them, False when one was set up with ``compile_reuse=False``."""
    if isinstance(fn, torch.nn.Module):
        return getattr(fn, _MARK, None)
    marks = {getattr(m, _MARK, None) for m in modules_reached(fn, args, kwargs)} - {None}
    return all(marks) if marks else None


def _owners(effects: Sequence[tuple[Any, tuple[Any, ...], Any]], roots: Sequence[Any]) -> list[int | None]:
    """For each recorded call of a jitted function's interpretation, the position among ``roots`` of the module its
    plan belongs to (a plan names its module by ``owner_id``), so that a reuse rebinds it to the module in that place
    now; None for a call without a plan. Raises ``NotReusable`` for a plan whose module the function does not take
    whole (a submodule passed alone): no position to rebind it by."""
    at = {id(m): i for i, m in enumerate(roots)}
    owners: list[int | None] = []
    for _f, args, rebind in effects:
        owner_id = next((a.owner_id for a in args if isinstance(getattr(a, "owner_id", None), int)), None)
        if rebind is None or owner_id is None:
            owners.append(None)
        elif owner_id in at:
            owners.append(at[owner_id])
        else:
            raise NotReusable("a parameter's plan belongs to a module the function does not take whole")
    return owners


def _thunder_key() -> tuple[Any, ...]:
    import thunder
    from thunder.core.compile_data import get_compile_data
    from thunder.distributed import get_skip_data_parallel_grad_sync

    from thunderviz.thunder.comm.comm_pass import CommTransform

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
        # thunder's cache info holds no_sync only for what it knows to be DDP (our hook adds it while tracing)
        (*info, ("no_sync", bool(get_skip_data_parallel_grad_sync()))),
    )
