"""Shortcuts through thunder 0.2.6's interpreter and trace passes that give the same results: global names, module
calls, decoded bytecode, exception frames, provenance records, the call site, symbol signatures and dataclass
flattening.

thunder's first call of a model is mostly its bytecode interpreter, and two things it does for every model cost far
more than the model's own code:

- **Global names.** Every ``LOAD_GLOBAL`` (``interpreter.globals_lookup``) *interprets* ``lambda d, k: d[k]`` on
  the frame's globals, and for a builtin (``len``, ``isinstance``, ``getattr``) first on the globals for
  ``__builtins__`` and then on that dict: two to four interpreted frames, each looking up and calling the dict
  wrapper's ``__getitem__``, per name. A 2-layer GPT-2's forward and backward load ~12,800 names this way (978
  module globals, 11,784 builtins). What those frames end with is the dict wrapper's ``__getitem__``
  (``MutMappingWrapperMethods.__getitem__``): the item's wrapped value, provenance ``BINARY_SUBSCR(globals,
  name)``, cached in the dict's wrapper. The shortcut calls it directly. A name found nowhere (thunder raises its
  NameError), globals that are not a plain dict, or a module as ``__builtins__`` (``__main__``'s) take thunder's path.
- **Module calls.** ``module(x)`` is interpreted through ``nn.Module._wrapped_call_impl`` and ``_call_impl``, which
  read eight hook dictionaries (four of them module globals) before calling ``self.forward``. When the module has
  no hook of any kind, no global hook is registered, it was not ``torch.compile``d in place and torch's JIT is not
  tracing, ``_call_impl`` calls ``self.forward(*args, **kwargs)`` and nothing else: the shortcut interprets just that
  (``self.forward`` still looked up by the interpreter, so a forward replaced on the instance, such as activation
  checkpointing's, is the one called). Any other module call is interpreted as torch wrote it.
- **Decoded bytecode.** Every interpreted frame starts by decoding its code object (``dis.get_instructions`` in
  ``interpreter._run_frame``), thousands of times for the same few functions. Code objects and instructions are
  immutable, and equal code objects (same bytecode, constants, names and line table) decode to equal instructions,
  so the decoded tuple is kept per code object (the most recent 8,192). TinyGPT's first call (forward and backward,
  one process, 2 cores at a load of 3): 11.3-11.8 s -> 10.5 s of CPU on top of the other two.
- **Exception frames.** An exception leaving an interpreted frame gets a Python frame for its traceback
  (``InterpreterFrame.get_or_make_python_frame``): thunder compiles a stand-in that raises at that line, runs it in a
  new thread (so that nothing links the frame to the interpreter's stack) and *spins* until the thread has run. Every
  ``for`` loop that ends raises ``StopIteration`` through thunder's iterator frames, so a model's first call makes
  dozens of these, and each spin holds the interpreter lock until Python's 5 ms switch interval hands it to the
  thread: a 2-block litgpt GPT's first call made 70 of them, 0.53 s of its 4.6 s of CPU. The shortcut waits on a
  lock instead (the thread runs at once) and keeps the frame per place (file, first line, name, qualified name,
  line; the most recent 4,096): a finished frame holds nothing but that place, so one serves every traceback
  through it.
- **Provenance records.** Every value the interpreter touches gets a ``ProvenanceRecord`` (a 2-block GPT's first
  call makes 100,000), whose ``__post_init__`` checks its inputs with a generator and folds their flags with
  ``functools.reduce`` and a lambda: 7% of that call. The shortcut does the same checks and the same fold in one
  loop.
- **The call site.** Each interpretation records where it was called from (``InterpreterRuntimeCtx`` reads
  ``inspect.stack()[2]``), and ``inspect.stack()`` reads the source lines of *every* frame on the stack (pytest's, a
  kernel's, Fabric's): 1.4% of thunder's compile time over the test suite. The interpreter's ``inspect`` gets a
  ``stack()`` whose frames are made when read, each as ``inspect.stack`` makes it (thunder reads the call site at
  once).
- **Symbol signatures.** Every bound symbol's arguments are bound to its meta function's signature, computed again
  each time (``Symbol.normalize``: ``inspect.signature``), 3.6% of thunder's compile time over the test suite; the
  signature is kept per meta function (by identity, while the function lives).
- **Dataclass flattening.** Every bound symbol's arguments and outputs are flattened by
  ``pytree.tree_flatten_with_dataclass``, which first rebuilds the whole tree with ``optree.tree_map`` and a Python
  callback per leaf (to register the dataclass types it meets) and then flattens it: most of thunder's pytree time,
  which was 18% of thunder's compile time over this project's test suite. The shortcut flattens once, looks at each
  leaf's type once per process, and flattens again only when it registered a type: the same leaves and spec.

None of them changes what thunder records: the prologue and the traces, forward and backward, are the same text with and
without them (``tests/thunder/test_interpreter_shortcuts.py``; also checked on a 2-layer Llama and GPT-2). CPU time of
the first call (forward and backward, one process, a load of 7-13 on 2 cores, 2026-12-05): GPT-2 2 layers 33 s ->
17 s with the global-name shortcut; Llama 2 layers then 17.7 s -> 15.3 s with the module-call shortcut; the
tutorial's TinyGPT (2 blocks) 22 s -> 10.5 s with the first two (a load of 3).

The last five, on the first call of a 2-block litgpt GPT (``bench/first_call.py`` and the same call with some
shortcuts put back: CPU seconds, second-best of 4 rounds, 2026-12-06): thunder's paths 8.58 s, the first three
shortcuts 3.80 s, six (exception frames, provenance records, dataclass flattening) 3.14 s; in another run six 3.64 s
and all eight 3.23 s (its stack is shallow: the call site saves most under pytest or a kernel).

Installed once per process by every distribution (``thunder.hooks.install_sync_hook``), which the plan's rehearsal
uses too; from then on they serve every ``thunder.jit`` in the process. ``THUNDERVIZ_INTERPRETER_SHORTCUTS=0`` keeps
thunder's own paths.
"""

from __future__ import annotations

import _thread
import contextlib
import dis
import functools
import inspect
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.nn.modules import module as torch_module

from thunderviz.thunder.jit.lookasides import function_copy, register_lookaside

__all__ = ["ENV_VARIABLE", "install", "installed", "suspended"]

ENV_VARIABLE = "THUNDERVIZ_INTERPRETER_SHORTCUTS"

_lock = threading.Lock()
_original_globals_lookup: Any = None


@functools.lru_cache(maxsize=8192)
def _decoded(code: types.CodeType) -> tuple[dis.Instruction, ...]:
    return tuple(dis.get_instructions(code))


class _DecodedOnce(types.ModuleType):
    """``dis`` as thunder's interpreter sees it: the same module but for ``get_instructions``, kept per code."""

    get_instructions = staticmethod(_decoded)

    def __getattr__(self, name: str) -> Any:
        return getattr(dis, name)


_DIS = _DecodedOnce("dis")


class _LazyStack(Sequence):
    """``inspect.stack()`` from a frame outwards, each ``FrameInfo`` made when it is read."""

    def __init__(self, frame: types.FrameType | None, context: int) -> None:
        self._frames: list[types.FrameType] = []
        while frame is not None:
            self._frames.append(frame)
            frame = frame.f_back
        self._context = context

    def __len__(self) -> int:
        return len(self._frames)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        frame = self._frames[i]
        info = inspect.getframeinfo(frame, self._context)  # what inspect.getouterframes makes of each frame
        return inspect.FrameInfo(frame, *info, positions=info.positions)


class _OneFrameAtATime(types.ModuleType):
    """``inspect`` as thunder's interpreter sees it: the same module but for ``stack``, read lazily."""

    @staticmethod
    def stack(context: int = 1) -> _LazyStack:
        return _LazyStack(sys._getframe(1), context)

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)


_INSPECT = _OneFrameAtATime("inspect")


def _replaced(interpreter: Any) -> list[tuple[Any, str]]:
    """Where the shortcuts replace one of thunder's functions by one that carries ``__thunderviz_original__``."""
    return [
        (interpreter, "globals_lookup"),
        (interpreter.InterpreterFrame, "get_or_make_python_frame"),
        (interpreter.ProvenanceRecord, "__post_init__"),
        (_symbol_class(), "normalize"),
        *((m, "tree_flatten_with_dataclass") for m in _flattening_modules()),
    ]


def installed() -> bool:
    from thunder.core import interpreter

    return (
        _original_globals_lookup is not None
        and interpreter.dis is _DIS
        and interpreter.inspect is _INSPECT
        and all(hasattr(getattr(owner, name), "__thunderviz_original__") for owner, name in _replaced(interpreter))
    )


def install() -> None:
    """Install the shortcuts, once per process (unless ``THUNDERVIZ_INTERPRETER_SHORTCUTS=0``)."""
    global _original_globals_lookup
    if os.environ.get(ENV_VARIABLE, "1") == "0":
        return
    from thunder.core import interpreter

    with _lock:
        if _original_globals_lookup is not None:
            return
        original = interpreter.globals_lookup
        interpreter.globals_lookup = _globals_lookup(interpreter, original)
        interpreter.dis = _DIS
        register_lookaside(torch.nn.Module._wrapped_call_impl, _module_call(interpreter))
        _run_dynamos_module_tag(interpreter)
        frames = interpreter.InterpreterFrame
        frames.get_or_make_python_frame = _kept_frames(frames.get_or_make_python_frame)
        interpreter.ProvenanceRecord.__post_init__ = _provenance_post_init(interpreter)
        interpreter.inspect = _INSPECT
        _symbol_class().normalize = _kept_signatures(_symbol_class().normalize)
        flatten = _flatten_with_dataclass()
        for module in _flattening_modules():
            module.tree_flatten_with_dataclass = flatten
        _original_globals_lookup = original


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """thunder's own paths while the block runs (in every thread): what a test compares the shortcuts with."""
    from thunder.core import interpreter, jit_ext

    install()
    lookasides = jit_ext._general_jit_lookaside_map
    call = lookasides.pop(torch.nn.Module._wrapped_call_impl, None)
    replaced = [(owner, name, getattr(owner, name)) for owner, name in _replaced(interpreter)]
    for owner, name, ours in replaced:
        setattr(owner, name, getattr(ours, "__thunderviz_original__", ours))
    decoder, interpreter.dis = interpreter.dis, dis
    looks, interpreter.inspect = interpreter.inspect, inspect
    try:
        yield
    finally:
        for owner, name, ours in replaced:
            setattr(owner, name, ours)
        interpreter.dis = decoder
        interpreter.inspect = looks
        if call is not None:
            lookasides[torch.nn.Module._wrapped_call_impl] = call


def _globals_lookup(interpreter: Any, original: Any) -> Any:
    mapping_getitem = interpreter.MutMappingWrapperMethods.__getitem__
    wrapped_value, unwrap, wrap_const = interpreter.WrappedValue, interpreter.unwrap, interpreter.wrap_const

    def globals_lookup(globals_dict: Any, name: Any) -> Any:
        plain = unwrap(globals_dict)
        if isinstance(globals_dict, wrapped_value) and type(plain) is dict:
            key = unwrap(name)
            if key in plain:
                return mapping_getitem(globals_dict, name)
            builtins = plain.get("__builtins__")
            if type(builtins) is dict and key in builtins:
                return mapping_getitem(mapping_getitem(globals_dict, wrap_const("__builtins__")), name)
        return original(globals_dict, name)

    globals_lookup.__thunderviz_original__ = original  # type: ignore[attr-defined]
    return globals_lookup


def _forward_of(module: Any, *args: Any, **kwargs: Any) -> Any:
    return module.forward(*args, **kwargs)


def _without_hooks(m: torch.nn.Module) -> bool:
    """What ``_call_impl`` checks before calling ``forward`` alone (and ``_wrapped_call_impl`` before it)."""
    return not (
        m.__dict__.get("_compiled_call_impl") is not None
        or torch._C._get_tracing_state()
        or m._backward_hooks
        or m._backward_pre_hooks
        or m._forward_hooks
        or m._forward_pre_hooks
        or torch_module._global_backward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
    )


def _module_call(interpreter: Any) -> Any:
    as_torch_wrote_it = function_copy(torch.nn.Module._wrapped_call_impl)

    def module_call(module: Any, *args: Any, **kwargs: Any) -> Any:
        m = interpreter.unwrap(module)
        if isinstance(m, torch.nn.Module) and _without_hooks(m):
            return interpreter._interpret_call(_forward_of, module, *args, **kwargs)
        return interpreter._interpret_call(as_torch_wrote_it, module, *args, **kwargs)

    module_call.__thunderviz_shortcut__ = True  # type: ignore[attr-defined]
    return module_call


#: How many places' exception frames are kept (a model's first call raises at a few dozen).
FRAMES_KEPT = 4096


def _frame_raised_at(filename: str, firstlineno: int, name: str, qualname: str, lineno: int) -> types.FrameType:
    """A finished Python frame of a function ``name`` of ``filename`` that raised at ``lineno``, made in a thread of
    its own so that nothing but that place is reachable from it (its ``f_back`` is the thread's first frame)."""
    made: list[types.FrameType] = []
    done = _thread.allocate_lock()
    done.acquire()

    def raise_there() -> None:
        try:
            source = "\n" * (lineno - firstlineno) + "raise ValueError()"
            code = compile(source, filename, "exec").replace(
                co_filename=filename, co_firstlineno=firstlineno, co_name=name, co_qualname=qualname
            )
            try:
                types.FunctionType(code, {})()
            except ValueError as e:
                tb = e.__traceback__
                while tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
                if tb is not None:
                    made.append(tb.tb_frame)
        finally:
            done.release()

    _thread.start_new_thread(raise_there, ())
    done.acquire()  # blocks (the lock is released by the thread): the thread runs now, nothing spins
    if not made:
        raise RuntimeError(f"thunderviz: could not make a Python frame for {qualname} at {filename}:{lineno}")
    return made[0]


def _kept_frames(original: Callable[[Any], types.FrameType]) -> Callable[[Any], types.FrameType]:
    kept: dict[tuple[str, int, str, str, int], types.FrameType] = {}

    def get_or_make_python_frame(self: Any) -> types.FrameType:
        assert self.positions is not None
        code = self.code
        lineno = self.positions.lineno if self.positions.lineno is not None else code.co_firstlineno
        place = (code.co_filename, code.co_firstlineno, code.co_name, self.qualname, lineno)
        frame = kept.get(place)
        if frame is None:
            if len(kept) >= FRAMES_KEPT:
                kept.clear()
            frame = kept[place] = _frame_raised_at(*place)
        return frame

    get_or_make_python_frame.__thunderviz_original__ = original  # type: ignore[attr-defined]
    return get_or_make_python_frame


def _flattening_modules() -> list[types.ModuleType]:
    """thunder's modules that call ``tree_flatten_with_dataclass`` by the name they imported."""
    import thunder.core.symbol
    import thunder.core.transforms
    import thunder.transforms.autodiff
    from thunder.core import pytree

    return [pytree, thunder.core.symbol, thunder.core.transforms, thunder.transforms.autodiff]


def _flatten_with_dataclass() -> Callable[[Any], Any]:
    from thunder.core import pytree

    original, flatten = pytree.tree_flatten_with_dataclass, pytree.tree_flatten
    registered = pytree._registered_dataclasses
    settled: set[type] = set()  # leaf types that need no registering: not dataclasses, or registered already

    def tree_flatten_with_dataclass(tree: Any) -> Any:
        leaves, spec = flatten(tree)
        unsettled = set(map(type, leaves)) - settled
        new: list[type] = []
        for leaf in leaves if unsettled else ():
            kind = type(leaf)
            if kind not in unsettled or kind in new:
                continue
            # what ``pytree._maybe_register_dataclass`` asks of a leaf (a class is never registered), the same for
            # every leaf of one type
            if not isinstance(leaf, type) and hasattr(kind, "__dataclass_fields__") and kind not in registered:
                new.append(kind)
            else:
                settled.add(kind)
                unsettled.discard(kind)
        if not new:
            return leaves, spec
        for kind in new:
            pytree.register_pytree_node_dataclass(kind)
            registered.add(kind)
        return flatten(tree)

    tree_flatten_with_dataclass.__thunderviz_original__ = original  # type: ignore[attr-defined]
    return tree_flatten_with_dataclass


def _provenance_post_init(interpreter: Any) -> Callable[[Any], None]:
    record, kinds = interpreter.ProvenanceRecord, (dis.Instruction, interpreter.PseudoInst)

    def __post_init__(self: Any) -> None:
        inputs = self.inputs
        assert isinstance(self.inst, kinds), f"{self.inst} is not Instruction or PseudoInst"
        assert isinstance(inputs, list)
        flag = -1  # every bit set: the fold of one flag is that flag
        for i in inputs:
            assert isinstance(i, record)
            flag &= i.ext_flag
        self.inputs = inputs.copy()
        self.ext_flag = flag if inputs else 0

    __post_init__.__thunderviz_original__ = record.__post_init__  # type: ignore[attr-defined]
    return __post_init__


def _symbol_class() -> type:
    from thunder.core.symbol import Symbol

    return Symbol


#: How many meta functions' signatures are kept (thunder has a few thousand symbols).
SIGNATURES_KEPT = 65536


def _kept_signatures(original: Callable[..., Any]) -> Callable[..., Any]:
    kept: dict[int, tuple[weakref.ref, inspect.Signature]] = {}

    def normalize(self: Any, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        meta = self.meta
        assert meta is not None
        entry = kept.get(id(meta))
        if entry is not None and entry[0]() is meta:
            signature = entry[1]
        else:
            signature = inspect.signature(meta)
            try:
                ref = weakref.ref(meta)
            except TypeError:  # not weakly referenceable: not kept
                pass
            else:
                if len(kept) >= SIGNATURES_KEPT:
                    kept.clear()
                kept[id(meta)] = (ref, signature)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args, bound.kwargs

    normalize.__thunderviz_original__ = original  # type: ignore[attr-defined]
    return normalize


def _run_dynamos_module_tag(interpreter: Any) -> None:
    """Dynamo's tag of each new module run as plain Python when thunder meets it, not interpreted.

    Why: once anything in the process has entered a torch.compile'd function (a region on Dynamo's path), Dynamo patches
    ``nn.Module.__init__`` to record every new module in a weak-key dict (``GenerationTracker.tag``). A model that
    makes a module in ``forward`` (litgpt's GPT: ``nn.Identity()`` each call) has thunder interpret that record, and
    thunder's dict tracking walks the whole dict, one entry per module made since, which a garbage collection can
    shrink mid-walk (its weakref callbacks): the suite's litgpt test failed once with "dictionary changed size during
    iteration" while tracing GPT. The tag is Dynamo's bookkeeping, with no part in the trace; run as Python it
    records the same entry.
    """
    try:
        from torch._dynamo.mutation_guard import GenerationTracker
    except ImportError:
        return
    tag = getattr(GenerationTracker.tag, "__func__", None)
    if tag is not None:
        register_lookaside(tag, interpreter.interpreter_needs_wrap(tag))
