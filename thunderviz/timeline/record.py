"""Record one rank's timeline with torch.profiler: the context manager that runs inside every rank.

Plain Python (torchrun, Slurm), on every rank::

    from thunderviz.timeline.record import record_timeline

    with record_timeline(steps=5, fabric=fabric) as rec:
        for batch in loader:
            loss = model(batch).sum(); fabric.backward(loss); optimizer.step(); optimizer.zero_grad()
    rec.save(f"timeline-rank{fabric.global_rank}.json")

and later, anywhere: ``thunderviz.timeline.load("timeline-rank0.json", "timeline-rank1.json")``.

What a step is: a step ends when an optimizer's ``step()`` returns (any ``torch.optim`` optimizer, Fabric's
wrapper included) or when you call ``rec.step()``. In a cell with neither, a step is one call of a jitted module
(``thunder.jit``, or what ``fabric.setup`` returned) and what follows it. ``steps=N`` records N steps after the
first one: thunder compiles on the first step, so it is recorded (to know where step 2 begins) and dropped when
later steps exist. Recording stops by itself after N+1 steps, so a long training loop costs profiling only at
its start. After one more step (it absorbs the ranks stopping their profilers at slightly different times: the
first rank to stop waits for the others at its next collective), the ``UNPROFILED_STEPS`` steps that follow are
timed with the profiler stopped, by our own clock at each step boundary (``RankTimeline.unprofiled_steps``):
torch.profiler records every op, about 2 us each, which made the tutorial model's 15-20 ms steps 1.3 to 2 times as
long (``bench/observed_steps.py``), so the drawn steps show where the time goes while the run's step time is read
from steps nothing but a clock observed.

How: torch.profiler records CPU ops (and CUDA activity when CUDA is available); our own ``record_function``
labels (``thunderviz.*``) mark steps, the jitted module's forward (global module hooks), ``fabric.backward``,
the optimizer (global optimizer hooks), and every collective: while recording, the ``torch.distributed``
collective functions are wrapped so each call is labelled with its number, kind, shape and dtype, and each
async work's ``wait()`` is labelled with the same number (``timeline.instrumentation``). Everything is undone on
exit, also on error. Before
and after recording, a few rendezvous (all_reduce of one number) bracket a common instant on every rank, which
``timeline.model.align_clocks`` turns into each rank's clock offset with a bound.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from thunderviz.gc_pause import no_gc_pauses
from thunderviz.process_rank import process_rank
from thunderviz.timeline.build import build_rank_timeline
from thunderviz.timeline.instrumentation import Instrumentation, describe_collective, instrumentations
from thunderviz.timeline.model import RankTimeline, save
from thunderviz.timeline.raw_events import MARK, ModuleInfo, RawEvent

__all__ = ["UNPROFILED_STEPS", "TimelineRecorder", "observed_steps", "record_timeline"]

#: Steps timed after the recorded ones and one settling step, with the profiler stopped (see the module docstring).
UNPROFILED_STEPS = 2


def observed_steps(steps: int) -> int:
    """How many steps a recording that keeps ``steps`` observes in all: the first (it compiles), the kept ones, the
    settling one and the unprofiled ones. A memory meter in the same cell measures only steps after these."""
    return 1 + steps + 1 + UNPROFILED_STEPS


def record_timeline(
    steps: int = 5,
    *,
    name: str = "",
    fabric: Any = None,
    modules: Iterable[Any] | None = None,
    clock_rounds: int = 6,
    cuda: bool | None = None,
    capture_ledgers: bool = True,
) -> TimelineRecorder:
    """A context manager that records this rank's timeline (see the module docstring).

    Args:
        steps: how many steps to keep after the first (>= 1).
        name: a label for reports.
        fabric: the ``Fabric`` whose ``backward`` to label (without it, backward is found from autograd events).
        modules: the jitted modules to watch; by default every ``ThunderModule`` that runs while recording.
        clock_rounds: rendezvous before and after recording, for the clock offsets (0: none).
        cuda: record CUDA activity; by default when CUDA is available.
        capture_ledgers: on exit, read each watched module's traces to name collectives and attribute compute.
    """
    return TimelineRecorder(
        steps,
        name=name,
        fabric=fabric,
        modules=modules,
        clock_rounds=clock_rounds,
        cuda=cuda,
        capture_ledgers=capture_ledgers,
    )


class TimelineRecorder:
    """Records this rank while the ``with`` block runs; ``result`` is the ``RankTimeline`` afterwards."""

    def __init__(
        self,
        steps: int = 5,
        *,
        name: str = "",
        fabric: Any = None,
        modules: Iterable[Any] | None = None,
        clock_rounds: int = 6,
        cuda: bool | None = None,
        capture_ledgers: bool = True,
        clock_at_end: bool = True,
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"record_timeline(steps={steps!r}): steps must be a whole number >= 1 (how many training steps to "
                "record after the first one); for example steps=5."
            )
        self.steps = steps
        self.name = name
        self._fabric = fabric
        self._explicit_modules = None if modules is None else list(modules)
        self._clock_rounds = max(0, int(clock_rounds))
        self._cuda = cuda
        self._capture_ledgers = capture_ledgers
        self._clock_at_end = clock_at_end
        self._stopped = False
        self._failed = False
        self.result: RankTimeline | None = None
        self.recording = False
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._collectives: dict[int, tuple[Any, ...]] = {}  # raw, turned into CollectiveMeta by build()
        self._modules: dict[int, Any] = {}  # module id number -> module
        self._module_numbers: dict[int, int] = {}  # id(module) -> number
        self._open: dict[str, Any] = {}
        self._step_number = 0
        self._closed_steps: list[int] = []
        # after the profiler stopped: the settling step still to pass, the last boundary's clock (ns) while
        # unprofiled steps are timed, and them
        self._settling = False
        self._timing_since: int | None = None
        self._unprofiled: dict[int, float] = {}
        self._boundaries = 0
        self._forward_calls = 0
        self._optimizer_seen = False
        self._installed: list[Instrumentation] = []  # what _teardown undoes, last first
        self._samples: list[tuple[float, float]] = []
        self._prof: Any = None
        self._marker_offsets: list[float] = []
        self._end_us = 0.0
        self._entered = False

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> Self:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self._entered:
            raise RuntimeError("record_timeline(...) was entered twice; make a new one for each recording")
        self._entered = True
        world = process_rank()
        self._rank, self._world, self._backend = world.rank, world.world_size, world.backend
        self._samples = self._rendezvous_rounds()
        activities = [ProfilerActivity.CPU]
        use_cuda = torch.cuda.is_available() if self._cuda is None else self._cuda
        if use_cuda:
            activities.append(ProfilerActivity.CUDA)
        self._device = f"cuda:{torch.cuda.current_device()}" if use_cuda else "cpu"
        try:
            self._install()
            self._prof = profile(activities=activities)
            self._prof.start()
            self.recording = True
            self._mark_clock()
            self._open_mark("step", f"{MARK}step#{self._step_number}")
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self.stop(failed=exc_type is not None)
        self.build()
        return False

    def stop(self, *, failed: bool = False) -> None:
        """End the recording now: the profiler stops and every wrapper and hook is undone (also when this raises).

        Cheap; ``build`` does the slow part (profiler events -> timeline). Split from ``__exit__`` for callers that
        cannot use a ``with`` block (a notebook cell on a rank: stop first, then gather traces, then build).
        ``failed``: the profiled code raised, so the other ranks may not reach the closing clock rendezvous.
        """
        if self._stopped:
            return
        self._stopped = True
        self._failed = failed
        self._settling, self._timing_since = False, None
        try:
            self._stop_recording()
        finally:
            self._teardown()
        if not failed and self._clock_at_end:
            self._samples += self._rendezvous_rounds()

    def build(self, bundles: Mapping[int, Any] | None = None) -> RankTimeline:
        """Turn the stopped recording into ``result`` (a ``RankTimeline``).

        ``bundles``: already captured trace bundles (``trace.model.TraceBundle``) by ``id`` of the jitted module or
        of its compile data, so the names and module groups come from them instead of a second capture.
        """
        if not self._stopped:
            raise RuntimeError("TimelineRecorder.build(): call stop() first (or use the recorder as a `with` block)")
        if self.result is None:
            with no_gc_pauses():
                self.result = self._build(failed=self._failed, bundles=bundles or {})
        return self.result

    def step(self) -> None:
        """Mark the end of a training step (for loops without a ``torch.optim`` optimizer)."""
        self._boundary()

    def save(self, path: str | os.PathLike[str]) -> Any:
        """Write this rank's recording (``timeline.load`` reads the files of all ranks together)."""
        if self.result is None:
            raise RuntimeError("rec.save(path): the recording is not finished; call save after the `with` block")
        return save(self.result, path)

    # ------------------------------------------------------------------ markers

    def _rf(self, label: str) -> Any:
        return _label(label)

    def _open_mark(self, key: str, label: str) -> None:
        rf = self._rf(label)
        rf.__enter__()
        self._open[key] = rf

    def _close_mark(self, key: str) -> None:
        rf = self._open.pop(key, None)
        if rf is not None:
            rf.__exit__(None, None, None)

    def _mark_clock(self) -> None:
        t0 = time.monotonic_ns()
        with self._rf(f"{MARK}clock"):
            pass
        t1 = time.monotonic_ns()
        self._clock_marks = [*getattr(self, "_clock_marks", []), (t0 + t1) / 2]

    def _boundary(self) -> None:
        if not self.recording:
            self._time_unprofiled()
            return
        with self._lock:
            self._close_mark("step")
            self._closed_steps.append(self._step_number)
            self._step_number += 1
            self._boundaries += 1
            if self._boundaries >= self.steps + 1:
                self._stop_recording()
                self._settling = not self._stopped  # ended by itself: time the steps after the next unprofiled
                return
            self._open_mark("step", f"{MARK}step#{self._step_number}")

    def _time_unprofiled(self) -> None:
        """A step boundary after the recording: the step that ended, by our clock (numbered as the cell ran it)."""
        now = time.perf_counter_ns()
        self._step_number += 1
        if self._settling:
            self._settling, self._timing_since = False, now
            return
        if self._timing_since is None:
            return
        self._unprofiled[self._step_number] = (now - self._timing_since) / 1000
        self._timing_since = now if len(self._unprofiled) < UNPROFILED_STEPS else None

    def _stop_recording(self) -> None:
        if not self.recording:
            return
        self.recording = False
        for key in ("optimizer", "backward", "forward", "step"):
            with contextlib.suppress(Exception):  # a marker left open by an exception must not hide it
                self._close_mark(key)
        self._mark_clock()
        self._end_us = time.monotonic_ns() / 1000
        self._prof.stop()

    # ------------------------------------------------------------------ hooks and wrappers

    def _install(self) -> None:
        """Put every instrumentation in place; each is listed before it installs, so ``_teardown`` undoes also
        what one did before it raised."""
        for instrumentation in instrumentations(self, self._explicit_modules, self._fabric):
            self._installed.append(instrumentation)
            instrumentation.install()

    def _teardown(self) -> None:
        while self._installed:
            self._installed.pop().uninstall()

    def _enter_forward(self, m: Any) -> bool:
        """Open ``forward#M`` for a call of watched module ``m`` (numbered on first sight); False when it is not
        recorded (not recording, or inside another watched call)."""
        if not self.recording or "forward" in self._open:
            return False
        n = self._module_numbers.get(id(m))
        if n is None:
            n = self._module_numbers[id(m)] = len(self._modules)
            self._modules[n] = m
        self._forward_calls += 1
        self._open_mark("forward", f"{MARK}forward#{n}")
        return True

    def _exit_forward(self) -> None:
        self._close_mark("forward")
        if self.recording and not self._optimizer_seen and self._forward_calls >= 8 * (self.steps + 1):
            self._stop_recording()  # no optimizer step after many calls: bound the recording

    def _enter_optimizer(self) -> None:
        if self.recording and "optimizer" not in self._open:
            self._open_mark("optimizer", f"{MARK}optimizer")

    def _exit_optimizer(self) -> None:
        self._optimizer_seen = True
        self._close_mark("optimizer")
        self._boundary()

    # ------------------------------------------------------------------ clock

    def _rendezvous_rounds(self) -> list[tuple[float, float]]:
        """``(before, after)`` in microseconds around all_reduces of one number; nothing without a process group."""
        import torch
        import torch.distributed as dist

        if self._clock_rounds == 0 or not (dist.is_available() and dist.is_initialized()) or self._world < 2:
            return []
        dev = torch.device("cuda", torch.cuda.current_device()) if self._backend == "nccl" else torch.device("cpu")
        x = torch.zeros(1, device=dev)
        out = []
        for _ in range(self._clock_rounds):
            a = time.monotonic_ns()
            dist.all_reduce(x)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            b = time.monotonic_ns()
            out.append((a / 1000, b / 1000))
        return out

    # ------------------------------------------------------------------ build

    def _build(self, *, failed: bool, bundles: Mapping[int, Any]) -> RankTimeline:
        events, offset_notes = self._raw_events()
        modules = (
            self._module_infos(bundles)
            if self._capture_ledgers and not failed
            else {n: ModuleInfo(_module_name(m, n)) for n, m in self._modules.items()}
        )
        result = build_rank_timeline(
            events,
            rank=self._rank,
            world_size=self._world,
            steps=self.steps,
            collectives={n: describe_collective(*raw) for n, raw in self._collectives.items()},
            modules=modules,
            closed_steps=list(self._closed_steps),
            end=self._end_us,
            clock_samples=self._samples,
            host=socket.gethostname(),
            pid=os.getpid(),
            device=self._device,
            backend=self._backend,
        )
        result.notes.extend(offset_notes)
        result.unprofiled_steps = dict(self._unprofiled)
        if failed:
            result.notes.append("the profiled code raised; the timeline holds what ran before the error")
        self._prof = None  # the profiler's buffers are large; the result holds what we need
        return result

    def _raw_events(self) -> tuple[list[RawEvent], list[str]]:
        """Profiler events in microseconds on this rank's monotonic clock (via our ``thunderviz.clock`` marks)."""
        notes: list[str] = []
        try:
            kevents = list(self._prof.profiler.kineto_results.events())
        except Exception as e:
            return [], [f"torch.profiler returned no events ({type(e).__name__}: {e})"]
        clocks = [e.start_ns() for e in kevents if e.name() == f"{MARK}clock"]
        marks = getattr(self, "_clock_marks", [])
        if clocks and len(clocks) == len(marks):
            shifts = [m - c for m, c in zip(marks, clocks, strict=False)]
            shift = sum(shifts) / len(shifts)
        elif clocks:
            shift = marks[0] - clocks[0]
        else:
            shift = 0.0
            notes.append("no clock marker in the profile; profiler times are used as they are")
        out = []
        from torch.autograd import DeviceType

        cpu = DeviceType.CPU
        for e in kevents:  # ~15k events per step of a small GPT: keep this loop tight
            start = (e.start_ns() + shift) / 1000
            out.append(
                RawEvent(
                    e.name(),
                    e.start_thread_id(),
                    start,
                    start + e.duration_ns() / 1000,
                    "cpu" if e.device_type() == cpu else "cuda",
                )
            )
        return out, notes

    def _module_infos(self, bundles: Mapping[int, Any]) -> dict[int, ModuleInfo]:
        out = {}
        for n, m in self._modules.items():
            info = ModuleInfo(_module_name(m, n))
            try:
                from thunderviz.thunder.capture.traces import capture
                from thunderviz.trace.attribution import top_group
                from thunderviz.trace.ledger import ledger_from_bundle

                bundle = _given_bundle(m, bundles)
                if bundle is None:
                    bundle = capture(m, info.name, stages=False)
                info.ledger = [e.to_dict() for e in ledger_from_bundle(bundle)]
                for label, snap in bundle.traces().items():
                    info.op_groups[label] = [None if op.is_bookkeeping else top_group(op.module) for op in snap.ops]
                    info.op_names[label] = ["" if op.is_bookkeeping else op.op for op in snap.ops]
            except Exception as e:
                info.problem = f"{type(e).__name__}: {e}"
            out[n] = info
        return out


# ---------------------------------------------------------------------------------------------- instrumentations


def _given_bundle(module: Any, bundles: Mapping[int, Any]) -> Any:
    """The bundle captured for ``module`` (keyed by its id or its compile data's id), or None."""
    if not bundles:
        return None
    if id(module) in bundles:
        return bundles[id(module)]
    from thunderviz.thunder.compile_state import compile_key

    return bundles.get(compile_key(module))


def _module_name(m: Any, n: int) -> str:
    inner = getattr(m, "_model", None)
    return type(inner if inner is not None else m).__name__ + ("" if n == 0 else f"#{n}")


def _label(name: str) -> Any:
    """A ``record_function``-style context manager for our labels, on torch.profiler's fast path.

    ``torch.autograd.profiler.record_function`` costs ~30 us a label (a dispatched op, with pytree walks on exit,
    and two extra ``profiler::_record_function_*`` events in the trace); ``_RecordFunctionFast``, the path
    torch's own compiled code labels itself with, records the same named event for ~1 us. A recording places
    hundreds of labels per step (every collective and its wait), so this is most of what we add to a step.
    """
    fast = getattr(_profiler_c(), "_RecordFunctionFast", None)
    if fast is not None:
        return fast(name)
    from torch.autograd.profiler import record_function

    return record_function(name)


def _profiler_c() -> Any:
    import torch

    return torch._C._profiler
