"""Our torch.compile fusion regions called straight into inductor's compiled code, not through Dynamo's frame.

Why: a thunder ``torchcompile`` region is a ``torch.compile``'d function, so every call runs Dynamo's frame
evaluation (its eval-frame callback, the guards on each input, the compiled bytecode that unpacks the arguments) and
thunder's two wrappers around it (``no_grad``, ``no_autocast``) before inductor's code starts. On the host-bound CPU
proxy (``bench/host_overhead.py``) that was about 100 us per call, and FSDP calls a region per bucket: with ZERO2
BLOCK, 18 region calls a step where one-process ``thunder.jit`` makes 2. Calling the compiled graph directly took
our DDP from 1.13x to 1.07x of one-process thunder's host time per step, ZERO2 BLOCK from 2.27x to 2.00x (measured
side by side in one process).

How: on a region's first call its function (the one thunder hands to ``torch.compile``) is traced by ``make_fx`` on
fake copies of the arguments and compiled by inductor's ``compile_fx``: the same AOTAutograd and inductor passes
Dynamo's graph goes through, so outputs aliasing inputs, RNG and input mutations are handled as they are there.

Why skipping Dynamo's guards is safe here, input by input: a region belongs to one thunder cache entry, whose
prologue has checked every input's shape, dtype and device on this very call; the region's other inputs are computed
from those by the trace's own ops, so their shapes, dtypes and devices are fixed too. Strides are the one thing
thunder does not check, and inductor's generated code begins with ``assert_size_stride`` on every input before any
kernel runs (``torch._inductor.config.size_asserts``, on by default; with it off, regions take Dynamo's path): a
region called with other strides than it was compiled for raises there and is answered by thunder's own
``torch.compile``'d region from then on. Of the global state Dynamo guards on, thunder's traces call their regions
with grad and autocast off; a call with either on takes Dynamo's path, and so does a call while a torch function mode
or dispatch mode is active (a ``MemTracker``, a ``FlopCounterMode``): Dynamo decides what such a mode sees.
Regions that write into a tensor (where they write depends on which inputs share storage, which Dynamo guards on),
regions first called with one tensor as two arguments (AOTAutograd compiles them as one argument, which Dynamo guards
on), regions taking numbers (Dynamo guards on their values), regions with a ``torch.compile`` mode
(``reduce-overhead``: CUDA graphs), and anything that cannot be traced or compiled this way take Dynamo's path as
thunder builds it.
``THUNDERVIZ_DIRECT_REGIONS=0`` turns this off (every call through Dynamo).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["ENV_VARIABLE", "DirectRegion", "counts", "direct", "find_wrapped"]

ENV_VARIABLE = "THUNDERVIZ_DIRECT_REGIONS"

_counts = {"direct": 0, "straight": 0, "guarded": 0, "refused": 0}
_lock = threading.Lock()


def counts() -> dict[str, int]:
    """This process's regions: compiled for direct calls (``straight``: of those, called with no AOTAutograd wrapper),
    left on Dynamo's path, and moved to it after a refusal."""
    with _lock:
        return dict(_counts)


def _count(what: str) -> None:
    with _lock:
        _counts[what] += 1


def direct(built: Callable[..., Any], mode: Any) -> Callable[..., Any]:
    """``built`` (thunder's region callable) called directly where it can be, else ``built`` itself."""
    if os.environ.get(ENV_VARIABLE, "1") == "0" or mode is not None:
        return built
    function = _compiled_function(built)
    if function is None:
        return built  # not a torch.compile'd region (a rehearsal's uncompiled fusion): nothing to skip
    return DirectRegion(built, function)


def _compiled_function(built: Callable[..., Any]) -> Callable[..., Any] | None:
    """The function thunder handed to ``torch.compile``, found under thunder's wrappers, or None."""
    found = find_wrapped(built, lambda f: getattr(f, "_torchdynamo_orig_callable", None) is not None)
    return None if found is None else found._torchdynamo_orig_callable


def find_wrapped(root: Any, wanted: Callable[[Any], bool]) -> Any | None:
    """The first object ``wanted`` accepts among ``root`` and what its closures and ``__wrapped__`` reach: how a
    callable is found under the decorators and wrappers thunder, Dynamo and AOTAutograd put around it."""
    seen: set[int] = set()
    todo: list[Any] = [root]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if wanted(f):
            return f
        if getattr(f, "__wrapped__", None) is not None:
            todo.append(f.__wrapped__)
        for cell in getattr(f, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:
                continue
    return None


class _Checks(NamedTuple):
    """The torch functions every region call asks (looked up once: importing them on every call cost a region call)."""

    function_mode: Callable[[], Any]
    dispatch_mode: Callable[[], Any]
    profiling: Callable[[], bool]
    eval_frame_callback: Callable[[], Any]


@functools.cache
def _checks() -> _Checks:
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _Checks(
        torch._C._is_torch_function_mode_enabled,
        _get_current_dispatch_mode,
        torch._C._autograd._profiler_enabled,
        torch._C._dynamo.eval_frame.get_eval_frame_callback,
    )


def _modes_active() -> bool:
    """Whether a torch function mode or dispatch mode is active."""
    checks = _checks()
    return bool(checks.function_mode()) or checks.dispatch_mode() is not None


def _stride_refusal(error: AssertionError) -> bool:
    """Whether ``error`` is inductor's input size/stride assertion (raised before any kernel ran)."""
    text = str(error)
    return text.startswith(("expected size", "wrong number of dimensions"))


class DirectRegion:
    """A region whose calls go to inductor's compiled graph, compiled at the first call (see the module doc)."""

    __slots__ = ("_compiled", "_function", "_guarded", "_lock", "_straight")

    def __init__(self, guarded: Callable[..., Any], function: Callable[..., Any]) -> None:
        self._guarded: Callable[..., Any] = guarded
        self._function: Callable[..., Any] | None = function
        self._compiled: Callable[..., Any] | None = None
        self._straight: Callable[[list[Any]], Any] | None = None
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if _modes_active():  # (a first call under a mode compiles nothing: a later call without one will)
            return self._guarded(*args)
        compiled = self._compiled
        if compiled is None:
            compiled = self._compile(args)
        if compiled is self._guarded:
            return self._guarded(*args)
        import torch

        # thunder's traces call their regions with grad and autocast off already: set them only where they are not
        if torch.is_grad_enabled() or torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
            return self._guarded(*args)
        try:
            straight = self._straight
            if straight is not None and _straight_allowed():
                return list(straight(list(args)))
            return compiled(*args)
        except AssertionError as error:
            if not _stride_refusal(error):
                raise
            self._compiled = self._guarded  # inputs laid out unlike the first call's: Dynamo's guards from now on
            self._straight = None
            _count("refused")
        return self._guarded(*args)

    def _compile(self, args: tuple[Any, ...]) -> Callable[..., Any]:
        with self._lock:
            if self._compiled is not None:
                return self._compiled
            function, self._function = self._function, None
            compiled = _compile_fx(function, args)
            if compiled is None:
                self._compiled = self._guarded
                _count("guarded")
            else:
                with contextlib.suppress(AttributeError, ImportError):  # another torch's internals: wrapped calls
                    self._straight = _straight_call(*compiled)
                self._compiled = compiled[0]
                _count("direct")
                if self._straight is not None:
                    _count("straight")
            return self._compiled


def _compile_fx(function: Any, args: tuple[Any, ...]) -> tuple[Callable[..., Any], int | None, tuple[Any, ...]] | None:
    """``function`` traced on fake copies of ``args`` and compiled by inductor (with what ``_plain_outputs`` says of
    the traced graph, and the arguments), or None where that is refused."""
    import torch
    from torch._guards import TracingContext, tracing
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if not config.size_asserts or not all(isinstance(a, torch.Tensor) for a in args):
        return None
    if len({id(a) for a in args}) < len(args):
        # One tensor passed as two arguments: AOTAutograd compiles the graph for one argument there and drops the
        # other at every call, which Dynamo guards on and a direct call would not see (a later call with two
        # different tensors would compute with the first twice)
        return None
    try:
        with torch.no_grad():
            # pre_dispatch: the ops as the region calls them (a matmul stays a matmul), for AOTAutograd to decompose
            # on its own trace; decomposed here, a matmul's views were fixed to the strides this trace saw, which
            # AOTAutograd's functionalized trace did not always reproduce (litgpt's attention: "Cannot view a
            # tensor ..."), and such a region was compiled twice
            graph = make_fx(function, tracing_mode="fake", pre_dispatch=True)(*args)
            if _mutates(graph):
                return None
            outputs = _plain_outputs(graph)  # read before compile_fx, which may rewrite a graph's output
            # Inside a tracing context whose fake mode has a shape environment, as under Dynamo: inductor's and
            # AOTAutograd's caches refuse a graph compiled without one ("No shape env"), and every region would be
            # compiled again in every process (the proxy's 8-block TinyGPT, ZERO2: a first step of 38-42 s against
            # 22 s from the cache).
            # The inputs handed over as fakes of fixed shape, as Dynamo hands over a first compile's: given the real
            # tensors, AOTAutograd fakes them in the context's mode, whose shape environment made every size a symbol
            # (shape-generic code reading sizes at every call, outputs marked dynamic, so never called straight),
            # for a region whose shapes thunder's prologue has fixed.
            fake_mode = FakeTensorMode(shape_env=ShapeEnv())
            fakes = [fake_mode.from_tensor(a, static_shapes=True) for a in args]
            with tracing(TracingContext(fake_mode)):
                compiled = compile_fx(graph, fakes)
    except Exception:  # whatever cannot be compiled this way is compiled as thunder does
        return None
    # another torch's internals (AttributeError, ImportError): the label stays, nothing else changes
    with contextlib.suppress(AttributeError, ImportError):
        _label_only_when_profiling(compiled)
    return compiled, outputs, args


_STRAIGHT_REFUSALS = (
    "num_mutated_inp_runtime_indices",
    "num_outputs_aliased",
    "num_intermediate_bases",
    "tokens",
    "is_rng_op_functionalized",
    "dynamic_outputs",
)
_MISSING = object()


def _straight_call(
    compiled: Callable[..., Any], outputs: int | None, args: tuple[Any, ...]
) -> Callable[[list[Any]], Any] | None:
    """inductor's compiled graph itself, where AOTAutograd's runtime wrapper around it has nothing to do, else None.

    Why: that wrapper (and Dynamo's disable context around it) cost about 35 us a region call on the proxy, a sixth
    of a small region's call, to find on every call that there is no input to update, no output to regenerate as a
    view, no RNG state, effect token or dynamic dimension. Its metadata says so once: where every one of those is
    absent, the graph's only inputs are the region's arguments (none lifted from the traced module) and it returns
    a tuple of ``outputs`` tensors (nothing re-nested), the wrapper's result is the graph's outputs as a list. A
    region first called with one tensor twice never gets here (AOTAutograd would have dropped the duplicate). Under
    the profiler or inside Dynamo's frame evaluation (a thunder function run by a torch.compile'd caller) calls take
    the wrapped path, labels and Dynamo's disable included.
    """
    import torch
    from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta
    from torch._inductor.output_code import CompiledFxGraph

    meta = find_wrapped(compiled, lambda f: isinstance(f, ViewAndMutationMeta))
    inner = find_wrapped(compiled, lambda f: isinstance(f, CompiledFxGraph))
    if meta is None or inner is None or getattr(meta, "grad_enabled_mutation", _MISSING) is not None:
        return None
    if any(getattr(meta, name, _MISSING) is _MISSING or getattr(meta, name) for name in _STRAIGHT_REFUSALS):
        return None
    if outputs is None or len(meta.output_info) != outputs:
        return None
    if any(type(a) not in (torch.Tensor, torch.nn.Parameter) for a in args):
        return None
    return inner.current_callable


def _plain_outputs(graph: Any) -> int | None:
    """How many values a traced region returns as a flat tuple of computed values, or None (outputs nested or
    constant, or state lifted from the traced module as inputs: inductor's and AOTAutograd's wrappers then re-nest,
    supply or add to what the graph sees)."""
    import torch
    from torch._inductor.compile_fx import graph_returns_tuple

    if not graph_returns_tuple(graph) or next(graph.parameters(), None) is not None:
        return None
    if next(graph.buffers(), None) is not None:
        return None
    returned = graph.graph.find_nodes(op="output")[0].args[0]
    if not isinstance(returned, (tuple, list)) or not all(isinstance(r, torch.fx.Node) for r in returned):
        return None
    return len(returned)


def _straight_allowed() -> bool:
    """Neither a profiler running (it gets AOTAutograd's and inductor's labels) nor Dynamo's frame evaluation on."""
    checks = _checks()
    return not checks.profiling() and checks.eval_frame_callback() is None


def _mutates(graph: Any) -> bool:
    """Whether the traced region writes into a tensor (an in-place op: thunder's ``copy_`` of an updated buffer).

    Such a region stays on Dynamo's path: where it writes depends on which inputs share storage, which Dynamo
    guards on and a direct call would not see change between calls.
    """
    for node in graph.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def _label_only_when_profiling(compiled: Callable[..., Any]) -> None:
    """Skip the profiler label inductor opens around each call of the compiled graph while no profiler runs.

    ``CompiledFxGraph.__call__`` wraps every call in ``record_function("## Call CompiledFxGraph ... ##")``, which
    costs a dispatcher call and a pytree walk of its arguments even with no profiler active: about 15 us a call, a
    sixth of a small region's call on the proxy. Under ``torch.profiler`` the label is there as before. The graph is
    found under AOTAutograd's wrappers; where it is not (another torch), nothing changes.
    """
    from torch._inductor.output_code import CompiledFxGraph

    graph = find_wrapped(compiled, lambda f: type(f) is CompiledFxGraph)
    if graph is not None:
        graph.__class__ = _unlabelled_class()


@functools.cache
def _unlabelled_class() -> type:
    from torch._inductor.output_code import CompiledFxGraph

    profiling = _checks().profiling

    class UnlabelledCompiledFxGraph(CompiledFxGraph):
        """inductor's compiled graph, labelled for the profiler only while one runs (``direct_regions``)."""

        def __call__(self, inputs: Any) -> Any:
            if profiling():
                return super().__call__(inputs)
            return self.current_callable(inputs)

    return UnlabelledCompiledFxGraph
