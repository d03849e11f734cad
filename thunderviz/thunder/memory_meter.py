"""Measure the per-rank peak of real training steps with torch's own accounting, never the process's RSS.

A *step* ends when an optimizer's ``step()`` returns (any ``torch.optim`` optimizer; Fabric's wrapper calls it), so
a window runs from one step's end to the next's, the way ``thunder.rehearsal`` counts a predicted step. The first
step of a measurement compiles and creates the optimizer state, so the windows start after it; ``steps`` windows
are measured (2 by default) and the result is the largest peak among them, after which the measurement costs
nothing more.

- CUDA: ``torch.cuda.reset_peak_memory_stats()`` when a window opens, ``torch.cuda.max_memory_allocated()`` when it
  closes: the caching allocator's own count of allocated blocks, so everything alive counts.
- CPU: torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``): a dispatch mode that counts every storage
  created in the window, plus the parameters (with their gradients), buffers and optimizer state registered when it
  opens, split into PARAM/BUFFER, GRAD, OPT and the rest (``trace.memory.MEASURED_GROUPS``). It is entered without
  its module tracker: that tracker's global module hooks are interpreted by thunder if a step retraces, and thunder
  fails on them; what is lost is only MemTracker's split of activations from temporaries, which a thunder-compiled
  module (one opaque call) cannot give anyway.

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

from thunderviz.trace.memory import MEASURED_GROUPS, StepMemory

__all__ = ["DEFAULT_MEASURED_STEPS", "StepMemoryMeter"]

#: How many steps after the first a meter measures when not told.
DEFAULT_MEASURED_STEPS = 2

_INDUCTOR = (
    "not measured: torch.compile's kernels ran in the measured steps (thunder's torchcompile executor), and torch's"
    " MemTracker cannot see inside them on CPU (bench/jit_decisions.py measured 153 MiB and 7x the step time for a"
    " step whose real peak is below eager's 28 MiB); measure with thunder's default executors on CPU, or on a GPU"
)

_NO_STEP = (
    "no step was measured: a step ends when an optimizer's step() returns, and the first one (which compiles and"
    " creates the optimizer state) is not measured; run at least {need} optimizer steps"
)


def _step_tracker(modules: Iterable[nn.Module], optimizer: torch.optim.Optimizer) -> Any:
    """A ``MemTracker`` that counts what ``modules`` and ``optimizer`` hold now plus everything made from here on."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.utils._python_dispatch import TorchDispatchMode

    class _WindowTracker(MemTracker):
        """MemTracker's accounting without its module tracker (see the module docstring); the optimizer-region flag
        is set by the meter's own hooks."""

        def __enter__(self) -> Any:
            self._track_resize()
            self._peak_mem_snap = self.get_tracker_snapshot()
            self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}
            TorchDispatchMode.__enter__(self)
            return self

        def __exit__(self, *args: Any) -> None:
            self._deregister_param_and_optimizer_hooks()
            self._restore_resize()
            TorchDispatchMode.__exit__(self, *args)

    tracker = _WindowTracker()
    seen: set[int] = set()
    for m in modules:
        if id(m) not in seen:
            seen.add(id(m))
            tracker._track_module_params_and_buffers(m, install_grad_hooks=True)
    tracker._track_optimizer_states(_MemRefType.OPT, optimizer)
    return tracker


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
    """

    def __init__(
        self,
        modules: Iterable[nn.Module] | Callable[[], Iterable[nn.Module]] = (),
        *,
        steps: int = DEFAULT_MEASURED_STEPS,
    ) -> None:
        if steps < 1:
            raise ValueError(f"StepMemoryMeter(steps={steps}): measure at least one step")
        self._modules = modules
        self.steps = steps
        self.step = 0  # optimizer steps seen
        self.peaks: list[tuple[int, int, dict[str, int]]] = []  # (step number, peak bytes, groups)
        self.source = ""
        self._tracker: Any = None
        self._handles: list[Any] = []
        self._cuda_open = False
        self._inductor = False  # a window saw torch.compile's kernels run: nothing on CPU is measured then
        self._window_start_ns = 0

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
        self._close_window(optimizer)
        if len(self.peaks) < self.steps:
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
        self._tracker.__enter__()

    def _close_window(self, optimizer: torch.optim.Optimizer) -> None:
        if self._cuda_open:
            torch.cuda.synchronize()
            self.peaks.append((self.step, int(torch.cuda.max_memory_allocated()), {}))
            self._cuda_open = False
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        from torch.distributed._tools.mem_tracker import _MemRefType

        tracker._in_opt = False
        tracker._track_optimizer_states(_MemRefType.OPT, optimizer)
        tracker.__exit__(None, None, None)
        snaps = tracker.get_tracker_snapshot("peak")
        host = next((snap for dev, snap in snaps.items() if torch.device(dev).type == "cpu"), None)
        if host is None or self._inductor:
            return
        from thunderviz.thunder.executors import inductor_fusions_ran

        self._inductor = inductor_fusions_ran(self._window_start_ns)
        if not self._inductor:
            self.peaks.append((self.step, int(host["Total"]), _groups(host)))

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
            return StepMemory(None, self.source, note=_NO_STEP.format(need=self.steps + 1 if self.steps else 2))
        _, peak, groups = max(self.peaks, key=lambda p: p[1])
        return StepMemory(peak, self.source, dict(groups), tuple(s for s, _, _ in self.peaks))

    def __enter__(self) -> StepMemoryMeter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _on_cuda(optimizer: torch.optim.Optimizer) -> bool:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return bool(p.is_cuda)
    return False
