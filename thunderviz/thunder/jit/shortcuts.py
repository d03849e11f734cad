"""Three shortcuts through thunder 0.2.6's interpreter that give the same results: global names, module calls and
decoded bytecode.

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

None of them changes what thunder records: the prologue and the traces, forward and backward, are the same text with and
without them (``tests/thunder/test_interpreter_shortcuts.py``; also checked on a 2-layer Llama and GPT-2). CPU time of
the first call (forward and backward, one process, a load of 7-13 on 2 cores, 2026-12-05): GPT-2 2 layers 33 s ->
17 s with the global-name shortcut; Llama 2 layers then 17.7 s -> 15.3 s with the module-call shortcut; the
tutorial's TinyGPT (2 blocks) 22 s -> 10.5 s with the first two (a load of 3).

Installed once per process by every distribution (``thunder.hooks.install_sync_hook``), which the plan's rehearsal
uses too; from then on they serve every ``thunder.jit`` in the process. ``THUNDERVIZ_INTERPRETER_SHORTCUTS=0`` keeps
thunder's own paths.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import os
import threading
import types
from collections.abc import Iterator
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


def installed() -> bool:
    from thunder.core import interpreter

    return (
        _original_globals_lookup is not None
        and interpreter.globals_lookup is not _original_globals_lookup
        and interpreter.dis is _DIS
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
        _original_globals_lookup = original


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """thunder's own paths while the block runs (in every thread): what a test compares the shortcuts with."""
    from thunder.core import interpreter, jit_ext

    install()
    lookasides = jit_ext._general_jit_lookaside_map
    call = lookasides.pop(torch.nn.Module._wrapped_call_impl, None)
    lookup = interpreter.globals_lookup
    interpreter.globals_lookup = getattr(lookup, "__thunderviz_original__", lookup)
    decoder, interpreter.dis = interpreter.dis, dis
    try:
        yield
    finally:
        interpreter.globals_lookup = lookup
        interpreter.dis = decoder
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
