"""What the timeline recorder changes while it records, each change undone on exit (also after an error).

``timeline.record`` owns the recording (the profiler, the steps, the clock); these are the hooks and wrappers it puts
in place for that time, each an ``Instrumentation`` that notes how to undo every change as it makes it:

- ``forward#M`` around each call of a watched module: hooks on the modules passed as ``modules=``
  (``ModuleHooks``), else a wrapper of ``ThunderModule.forward`` (``ThunderForward``);
- ``optimizer`` around every ``torch.optim`` optimizer's ``step()`` (``OptimizerHooks``, which also ends a step);
- ``collective#K`` around each call of a ``torch.distributed`` collective, and ``wait#K`` around its async work's
  ``wait()`` (``CollectiveWrappers``), with what it sends noted as plain values (``describe_collective``);
- ``backward`` around ``fabric.backward`` (``FabricBackward``).

Like the recorder, this imports torch only inside the functions that run on a rank while it records.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from thunderviz.timeline.raw_events import MARK, CollectiveMeta

__all__ = [
    "WRAPPED_COLLECTIVES",
    "Instrumentation",
    "Recording",
    "describe_collective",
    "instrumentations",
]

#: ``torch.distributed`` functions wrapped while recording, and the collective kind each one is.
WRAPPED_COLLECTIVES = {
    "all_gather_into_tensor": "all_gather",
    "all_gather": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
    "barrier": "barrier",
    "all_to_all_single": "all_to_all",
    "reduce": "reduce",
}


class Recording(Protocol):
    """What an instrumentation reads of, and calls back on, the recorder (``timeline.record.TimelineRecorder``)."""

    recording: bool
    _open: dict[str, Any]
    _counter: Iterator[int]
    _collectives: dict[int, tuple[Any, ...]]
    _world: int

    def _rf(self, label: str) -> Any: ...
    def _open_mark(self, key: str, label: str) -> None: ...
    def _close_mark(self, key: str) -> None: ...
    def _enter_forward(self, m: Any) -> bool: ...
    def _exit_forward(self) -> None: ...
    def _enter_optimizer(self) -> None: ...
    def _exit_optimizer(self) -> None: ...


def instrumentations(recorder: Recording, modules: list[Any] | None, fabric: Any) -> list[Instrumentation]:
    """What a recording puts in place, in install order: the forward labels (of ``modules``, else of every
    ``ThunderModule``), the optimizer hooks, the collective wrappers, and ``fabric.backward``'s label when given."""
    forward: Instrumentation = ThunderForward(recorder) if modules is None else ModuleHooks(recorder, modules)
    out = [forward, OptimizerHooks(recorder), CollectiveWrappers(recorder)]
    if fabric is not None and hasattr(fabric, "backward"):
        out.append(FabricBackward(recorder, fabric))
    return out


class TimedWork:
    """An async collective's work handle whose ``wait()`` is labelled ``thunderviz.wait#K``."""

    def __init__(self, work: Any, number: int, recorder: Recording) -> None:
        self._work, self._number, self._recorder = work, number, recorder

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if not self._recorder.recording:
            return self._work.wait(*args, **kwargs)
        with self._recorder._rf(f"{MARK}wait#{self._number}"):
            return self._work.wait(*args, **kwargs)

    def __getattr__(self, item: str) -> Any:
        return getattr(self._work, item)


class Instrumentation:
    """One thing the recorder changes while it records (hooks on modules, a patched function).

    ``install`` notes how to undo each change as it makes it, so ``uninstall`` undoes exactly what was done, also
    after an ``install`` that raised half way.
    """

    def __init__(self, recorder: Recording) -> None:
        self.recorder = recorder
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        raise NotImplementedError

    def uninstall(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            with contextlib.suppress(Exception):  # undo the rest regardless
                undo()


class ModuleHooks(Instrumentation):
    """``forward#M`` around each call of the modules passed as ``modules=``: hooks on the modules themselves, run
    by ``nn.Module.__call__``, outside any jitted code."""

    def __init__(self, recorder: Recording, modules: list[Any]) -> None:
        super().__init__(recorder)
        self.modules = modules

    def install(self) -> None:
        rec = self.recorder

        def pre(mod: Any, _args: Any) -> None:
            mod._thunderviz_marked = rec._enter_forward(mod)

        def post(mod: Any, _args: Any, _out: Any) -> None:
            if getattr(mod, "_thunderviz_marked", False):
                mod._thunderviz_marked = False
                rec._exit_forward()

        for m in self.modules:
            self._undo.append(m.register_forward_pre_hook(pre).remove)
            self._undo.append(m.register_forward_hook(post, always_call=True).remove)


class ThunderForward(Instrumentation):
    """``forward#M`` around each call of any ``ThunderModule`` (the default, without ``modules=``).

    Not global module hooks: thunder would trace them into every submodule call of the model it compiles (slow to
    compile, and its cache would depend on our state). ``ThunderModule.forward`` runs the compiled function and is
    never traced itself.
    """

    def install(self) -> None:
        rec = self.recorder
        for cls in _thunder_module_types():
            orig_forward = cls.forward

            def forward(mod: Any, *args: Any, _orig: Any = orig_forward, **kwargs: Any) -> Any:
                if not rec._enter_forward(mod):
                    return _orig(mod, *args, **kwargs)
                try:
                    return _orig(mod, *args, **kwargs)
                finally:
                    rec._exit_forward()

            cls.forward = forward
            self._undo.append(lambda c=cls, f=orig_forward: setattr(c, "forward", f))


class OptimizerHooks(Instrumentation):
    """``optimizer`` around every ``torch.optim`` optimizer's ``step()`` (global hooks), which also ends a step."""

    def install(self) -> None:
        import torch.optim.optimizer as optim

        rec = self.recorder

        def opt_pre(_opt: Any, _args: Any, _kwargs: Any) -> None:
            rec._enter_optimizer()

        def opt_post(_opt: Any, _args: Any, _kwargs: Any) -> None:
            rec._exit_optimizer()

        self._undo.append(optim.register_optimizer_step_pre_hook(opt_pre).remove)
        self._undo.append(optim.register_optimizer_step_post_hook(opt_post).remove)


class CollectiveWrappers(Instrumentation):
    """The ``torch.distributed`` functions of ``WRAPPED_COLLECTIVES`` replaced by wrappers that label each call
    ``collective#K`` (and its async work's ``wait()`` ``wait#K``) and note what it sends."""

    def install(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        for fname, kind in WRAPPED_COLLECTIVES.items():
            orig = getattr(dist, fname, None)
            if orig is None:
                continue
            setattr(dist, fname, self._wrap(orig, kind))
            self._undo.append(lambda f=fname, o=orig: setattr(dist, f, o))

    def _wrap(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        recorder = self.recorder
        async_at = _async_op_position(fn)  # once per function: inspect.signature costs ~20 us a call

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not recorder.recording:
                return fn(*args, **kwargs)
            number = next(recorder._counter)
            positional = async_at is not None and async_at < len(args) and bool(args[async_at])
            is_async = bool(kwargs.get("async_op", positional))
            recorder._collectives[number] = _sketch(kind, not is_async, args, kwargs, recorder._world)
            with recorder._rf(f"{MARK}collective#{number}"):
                out = fn(*args, **kwargs)
            if is_async and out is not None and hasattr(out, "wait"):
                return TimedWork(out, number, recorder)
            return out

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(fn, "__name__", kind)
        return wrapper


class FabricBackward(Instrumentation):
    """``backward`` around each ``fabric.backward`` call (an instance attribute, removed again on uninstall)."""

    def __init__(self, recorder: Recording, fabric: Any) -> None:
        super().__init__(recorder)
        self.fabric = fabric

    def install(self) -> None:
        rec, fabric = self.recorder, self.fabric
        orig_backward = fabric.backward
        had_attr = "backward" in vars(fabric)

        def backward(*args: Any, **kwargs: Any) -> Any:
            if not rec.recording or "backward" in rec._open:
                return orig_backward(*args, **kwargs)
            rec._open_mark("backward", f"{MARK}backward")
            try:
                return orig_backward(*args, **kwargs)
            finally:
                rec._close_mark("backward")

        fabric.backward = backward

        def restore() -> None:
            if had_attr:
                fabric.backward = orig_backward
            else:
                vars(fabric).pop("backward", None)

        self._undo.append(restore)


def _thunder_module_types() -> tuple[type, ...]:
    try:
        from thunderviz.thunder.compile_state import thunder_module_type

        return (thunder_module_type(),)
    except Exception:
        return ()


def _async_op_position(fn: Callable[..., Any]) -> int | None:
    """Where ``async_op`` sits positionally (thunder: ``all_gather_into_tensor(out, a, group, do_async)``)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("async_op") if "async_op" in params else None


def _sketch(kind: str, sync: bool, args: tuple[Any, ...], kwargs: dict[str, Any], world: int) -> tuple[Any, ...]:
    """What a collective call sends, kept as cheaply as possible while the step runs (``describe_collective`` later).

    Only plain values: shape, dtype and byte count of the tensor sent (the input, not the gathered output),
    and the group's size; no reference to the tensors, so nothing is kept alive.
    """
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)] + [
        a for a in kwargs.values() if isinstance(a, torch.Tensor)
    ]
    group = kwargs.get("group")
    if group is None:
        group = next((a for a in args if type(a).__name__ == "ProcessGroup"), None)
    size = world
    if group is not None:
        try:
            size = group.size()
        except Exception:
            size = None
    if kind in ("all_gather", "reduce_scatter") and len(tensors) >= 2:
        t = tensors[1]  # (output, input)
    else:
        t = tensors[0] if tensors else None
    if t is None:
        return (kind, sync, None, None, None, size)
    return (kind, sync, tuple(t.shape), t.dtype, t.numel() * t.element_size(), size)


def describe_collective(
    kind: str, sync: bool, shape: tuple[int, ...] | None, dtype: Any, nbytes: int | None, size: int | None
) -> CollectiveMeta:
    """A ``_sketch`` as the ``CollectiveMeta`` the timeline builder reads."""
    return CollectiveMeta(
        kind=kind,
        sync=sync,
        shape=None if shape is None else tuple(int(d) for d in shape),
        dtype=None if dtype is None else str(dtype).removeprefix("torch."),
        bytes=None if nbytes is None else int(nbytes),
        group_size=None if size is None else int(size),
    )
