"""Measure the per-rank peak of real training steps with torch's own accounting, never the process's RSS.

A *step* ends when an optimizer's ``step()`` returns (any ``torch.optim`` optimizer; Fabric's wrapper calls it), so
a window runs from one step's end to the next's, the way ``thunder.memory.rehearsal`` counts a predicted step. The first
step of a measurement compiles and creates the optimizer state, so the windows start after it (after ``skip``
steps: a cell recording a timeline leaves the steps the profiler times to it, since MemTracker's dispatch mode would
slow them several times over); ``steps`` windows are measured (2 by default) and the result is the largest peak
among them, after which the measurement costs nothing more.

- CUDA: ``torch.cuda.reset_peak_memory_stats()`` when a window opens, ``torch.cuda.max_memory_allocated()`` when it
  closes: the caching allocator's own count of allocated blocks, so everything alive counts.
- CPU: torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``): a dispatch mode that counts every storage
  created in the window, plus the parameters (with their gradients), buffers and optimizer state registered when it
  opens, split into PARAM/BUFFER, GRAD, OPT and the rest (``trace.memory.MEASURED_GROUPS``). It is entered without
  its module tracker: that tracker's global module hooks are interpreted by thunder if a step retraces, and thunder
  fails on them; what is lost is only MemTracker's split of activations from temporaries, which a thunder-compiled
  module (one opaque call) cannot give anyway.

Besides MemTracker's split (``StepMemory.groups``, which ``trace.memory.compare`` checks a prediction against), the
CPU meter puts the peak in the account every view draws (``StepMemory.parts``, ``trace.memory.ACCOUNT``). That needs
more than the labels in force at the peak, so the window keeps a log: when each storage was made, resized and freed,
and the moment of the peak. When the window closes each storage alive at the peak is put where it belongs:

- ``parameters``: the modules' parameters and buffers; ``optimizer state``: the optimizer's state tensors (what its
  ``step()`` allocates besides is a temporary);
- ``gradients``: every storage that MemTracker's gradient hooks saw reach a ``.grad``, also when that happened after
  the peak: thunder's backward hands every gradient to autograd at its end, so at a peak inside backward the
  gradients computed so far (under DDP: the all-reduced buckets the ``.grad`` become views of) were still unlabelled
  and the measured bar had no gradients at all;
- ``saved for backward``: what autograd saved (``torch.autograd.graph.saved_tensors_hooks``) before the peak;
- ``temporaries``: the rest, communication buffers included (MemTracker cannot tell them apart; the prediction counts
  them there too, ``trace.memory``).

The hooks are torch's global optimizer step hooks, registered once at ``start`` and removed at ``stop`` (never from
inside a hook: torch iterates them while calling them).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from thunderviz.trace.memory import ACCOUNT, MEASURED_GROUPS, StepMemory

__all__ = ["DEFAULT_MEASURED_STEPS", "StepMemoryMeter"]

#: How many steps after the first a meter measures when not told.
DEFAULT_MEASURED_STEPS = 2

_INDUCTOR = (
    "not measured: torch.compile's kernels ran in the measured steps (thunder's torchcompile executor), and torch's"
    " MemTracker cannot see inside them on CPU (bench/jit_decisions.py measured 153 MiB and 7x the step time for a"
    " step whose real peak is below eager's 28 MiB); measure with thunder's default executors on CPU, or on a GPU"
)

_NO_STEP = (
    "no step was measured: a step ends when an optimizer's step() returns, and {skipped}; run at least {need}"
    " optimizer steps"
)
_FIRST_SKIPPED = "the first one (which compiles and creates the optimizer state) is not measured"


def _step_tracker(modules: Iterable[nn.Module], optimizer: torch.optim.Optimizer) -> Any:
    """A ``MemTracker`` that counts what ``modules`` and ``optimizer`` hold now plus everything made from here on."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.utils._python_dispatch import TorchDispatchMode

    class _WindowTracker(MemTracker):
        """MemTracker's accounting without its module tracker (see the module docstring); the optimizer-region flag
        is set by the meter's own hooks. Keeps the log the account is made from (``_Log``)."""

        def __init__(self) -> None:
            super().__init__()
            self.log = _Log()
            self._saved_hooks: Any = None

        def _update_snap(self, u_type: Any, winfo: Any, *args: Any, **kwargs: Any) -> None:
            super()._update_snap(u_type, winfo, *args, **kwargs)
            self.log.changed(winfo, u_type.name)

        def _update_peak_stats(self, peak_state: Any) -> None:
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != before:
                self.log.peak()

        def _saved(self, t: torch.Tensor) -> torch.Tensor:
            for st in get_untyped_storages(t):
                winfo, _ = self._WINFO.get(st, (None, None))
                if winfo is not None:
                    self.log.saved(winfo)
            return t.detach()  # the same storage; the tensor itself would tie its own grad_fn in a cycle

        def __enter__(self) -> Any:
            self._track_resize()
            self._peak_mem_snap = self.get_tracker_snapshot()
            self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}
            self.log.peak()
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._saved, lambda t: t)
            self._saved_hooks.__enter__()
            TorchDispatchMode.__enter__(self)
            return self

        def __exit__(self, *args: Any) -> None:
            self._deregister_param_and_optimizer_hooks()
            self._restore_resize()
            if self._saved_hooks is not None:
                self._saved_hooks.__exit__(None, None, None)
                self._saved_hooks = None
            TorchDispatchMode.__exit__(self, *args)

    from torch.distributed._tools.common_utils import get_untyped_storages

    tracker = _WindowTracker()
    seen: set[int] = set()
    for m in modules:
        if id(m) not in seen:
            seen.add(id(m))
            tracker._track_module_params_and_buffers(m, install_grad_hooks=True)
    tracker._track_optimizer_states(_MemRefType.OPT, optimizer)
    return tracker


class _Log:
    """A window's storages over time (see the module docstring): for each MemTracker ``_WeakRefInfo``, its bytes
    from each event on (the last entry 0 once freed), when autograd saved it, and the event of the peak."""

    def __init__(self) -> None:
        self.event = 0
        self.peak_event = 0
        self.sizes: dict[int, tuple[Any, list[tuple[int, int]]]] = {}  # id(winfo) -> (winfo, [(event, bytes)])
        self.saved_at: dict[int, int] = {}

    def changed(self, winfo: Any, how: str) -> None:
        self.event += 1
        if how == "REF":
            return
        _, sizes = self.sizes.setdefault(id(winfo), (winfo, []))
        sizes.append((self.event, 0 if how == "DEL" else int(winfo.mem_consumed)))

    def peak(self) -> None:
        self.peak_event = self.event

    def saved(self, winfo: Any) -> None:
        self.saved_at.setdefault(id(winfo), self.event)

    def at_peak(self, winfo_id: int) -> int:
        """The storage's bytes at the peak."""
        n = 0
        for event, size in self.sizes[winfo_id][1]:
            if event > self.peak_event:
                break
            n = size
        return n


def _account(
    log: _Log, device: torch.device, total: int, state: set[int], registered: dict[int, str]
) -> dict[str, int]:
    """The peak on ``device`` in the account (``ACCOUNT``): see the module docstring.
    ``state`` holds the ids of the optimizer state's ``_WeakRefInfo``, ``registered`` the category of each one
    registered when the window opened."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    out = dict.fromkeys(ACCOUNT, 0)
    for key, (winfo, _) in log.sizes.items():
        if torch.device(winfo.device) != device:
            continue
        n = log.at_peak(key)
        if not n:
            continue
        if winfo.reftype in (_MemRefType.PARAM, _MemRefType.BUFFER):
            category = "parameters"
        elif winfo.reftype == _MemRefType.GRAD:
            category = "gradients"
        elif key in state or registered.get(key) == "optimizer state":
            category = "optimizer state"
        elif log.saved_at.get(key, log.peak_event + 1) <= log.peak_event:
            category = "saved for backward"
        else:
            category = "temporaries"
        out[category] += n
    # what the log missed (storages registered before it started are all in it; this keeps the sum exact)
    out["temporaries"] += total - sum(out.values())
    return out


def _groups(snapshot: dict[str, int]) -> dict[str, int]:
    """MemTracker's per-reference-type bytes (one device) in ``MEASURED_GROUPS``."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    by = {str(getattr(k, "value", k)): v for k, v in snapshot.items()}
    params = by.get(_MemRefType.PARAM.value, 0) + by.get(_MemRefType.BUFFER.value, 0)
    grads = by.get(_MemRefType.GRAD.value, 0)
    opt = by.get(_MemRefType.OPT.value, 0)
    total = by.get("Total", 0)
    out = dict(zip(MEASURED_GROUPS, (params, grads, opt, total - params - grads - opt), strict=True))
    return out


class StepMemoryMeter:
    """The peak of steady-state training steps on this rank (see the module docstring).

    Args:
        modules: what the optimizer trains (the modules ``fabric.setup`` returned, or a callable returning them when
            a window opens: a notebook cell may set its model up after the meter started); their parameters,
            gradients and buffers count from the window's start. Only used on CPU.
        steps: windows to measure after the first step.
        skip: optimizer steps left unmeasured before the first window (the first compiles: at least 1).
        skipped: why those steps are not measured, for the note when no step is (default: the first compiles).
    """

    def __init__(
        self,
        modules: Iterable[nn.Module] | Callable[[], Iterable[nn.Module]] = (),
        *,
        steps: int = DEFAULT_MEASURED_STEPS,
        skip: int = 1,
        skipped: str = _FIRST_SKIPPED,
    ) -> None:
        if steps < 1:
            raise ValueError(f"StepMemoryMeter(steps={steps}): measure at least one step")
        if skip < 1:
            raise ValueError(f"StepMemoryMeter(skip={skip}): the first step compiles; skip at least that one")
        self._modules = modules
        self.steps = steps
        self.skip = skip
        self._skipped = skipped
        self.step = 0  # optimizer steps seen
        #: the class names of the optimizers whose step() ran, in the order first seen (what the run trained with)
        self.optimizers: list[str] = []
        self.peaks: list[tuple[int, int, dict[str, int], dict[str, int]]] = []  # (step, peak, groups, account)
        self.source = ""
        self._tracker: Any = None
        self._handles: list[Any] = []
        self._cuda_open = False
        self._inductor = False  # a window saw torch.compile's kernels run: nothing on CPU is measured then
        self._window_start_ns = 0
        self._registered: dict[int, str] = {}

    # -- the hooks ---------------------------------------------------------------------------------------------

    def start(self) -> StepMemoryMeter:
        """Hook the optimizers, after collecting what earlier work left in reference cycles: freed by the cyclic
        collector inside a measured window instead, it moved peaks (in one process running the memory bench's 50
        scenarios, later ZERO3 peaks measured up to 5% above the same scenario run alone; with this collection they
        match)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        gc.collect()

        self._handles = [
            register_optimizer_step_pre_hook(self._before_step),
            register_optimizer_step_post_hook(self._after_step),
        ]
        return self

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._tracker is not None:
            self._tracker._in_opt = True

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.step += 1
        if type(optimizer).__name__ not in self.optimizers:
            self.optimizers.append(type(optimizer).__name__)
        self._close_window(optimizer)
        if self.step >= self.skip and len(self.peaks) < self.steps:
            self._open_window(optimizer)

    def _open_window(self, optimizer: torch.optim.Optimizer) -> None:
        if _on_cuda(optimizer):
            self.source = "cuda"
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._cuda_open = True
            return
        self.source = "memtracker"
        self._window_start_ns = time.perf_counter_ns()
        modules = self._modules() if callable(self._modules) else self._modules
        self._tracker = _step_tracker(list(modules), optimizer)
        self._registered = {key: _category(winfo) for key, (winfo, _) in self._tracker.log.sizes.items()}
        self._tracker.__enter__()

    def _close_window(self, optimizer: torch.optim.Optimizer) -> None:
        if self._cuda_open:
            torch.cuda.synchronize()
            self.peaks.append((self.step, int(torch.cuda.max_memory_allocated()), {}, {}))
            self._cuda_open = False
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        from torch.distributed._tools.mem_tracker import _MemRefType

        tracker._in_opt = False
        tracker._track_optimizer_states(_MemRefType.OPT, optimizer)
        tracker.__exit__(None, None, None)
        snaps = tracker.get_tracker_snapshot("peak")
        host = next(((dev, snap) for dev, snap in snaps.items() if torch.device(dev).type == "cpu"), None)
        if host is None or self._inductor:
            return
        from thunderviz.thunder.jit.executors import inductor_fusions_ran

        self._inductor = inductor_fusions_ran(self._window_start_ns)
        if not self._inductor:
            dev, snap = host
            state = {
                id(tracker._WINFO[st][0])
                for s in optimizer.state.values()
                for v in s.values()
                if isinstance(v, torch.Tensor)
                for st in _storages(v)
                if st in tracker._WINFO
            }
            parts = _account(tracker.log, torch.device(dev), int(snap["Total"]), state, self._registered)
            self.peaks.append((self.step, int(snap["Total"]), _groups(snap), parts))

    # -- the result --------------------------------------------------------------------------------------------

    def stop(self) -> StepMemory:
        """Remove the hooks (and close a window left open without its step ending); the measured peak."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            self._tracker = None
        self._cuda_open = False
        return self.result()

    def result(self) -> StepMemory:
        if self._inductor:
            return StepMemory(None, self.source, note=_INDUCTOR)
        if not self.peaks:
            return StepMemory(None, self.source, note=_NO_STEP.format(skipped=self._skipped, need=self.skip + 1))
        _, peak, groups, parts = max(self.peaks, key=lambda p: p[1])
        return StepMemory(peak, self.source, dict(groups), tuple(p[0] for p in self.peaks), parts=dict(parts))

    def __enter__(self) -> StepMemoryMeter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _category(winfo: Any) -> str:
    """What a storage registered when a window opens is in the account."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    if winfo.reftype in (_MemRefType.PARAM, _MemRefType.BUFFER):
        return "parameters"
    if winfo.reftype == _MemRefType.GRAD:
        return "gradients"
    return "optimizer state" if winfo.reftype == _MemRefType.OPT else "temporaries"


def _storages(t: torch.Tensor) -> Any:
    from torch.distributed._tools.common_utils import get_untyped_storages

    return get_untyped_storages(t)


def _on_cuda(optimizer: torch.optim.Optimizer) -> bool:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return bool(p.is_cuda)
    return False
