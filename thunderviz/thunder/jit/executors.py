"""What the executor rule (``parallel.decisions.decide_executors``) needs from the installed thunder and torch, and the
one change that makes thunder's fusion executors safe around our collectives.

Why a change to thunder's executors at all: thunder 0.2.6's ``torchcompile`` executor claims every op the torch
executor has, the distributed prims included (``torch_compile_ex._implmap`` is all of the torch executor's). Then

- case 1 and 3: each fusion region is run through ``transform_for_execution`` again, where thunder's own DDP
  gradient bucketing walks producers of region inputs that have none (``IndexError: tuple index out of range`` in
  ``apply_bucketing_to_grad_allreduce``);
- case 2: a region holding an ``all_reduce`` / ``all_gather`` reaches Dynamo, which refuses ``async_op=True``
  (Lightning-AI/lightning-thunder#298 upstream).

A collective inside a torch.compile region can never run, so taking the distributed prims out of every fusion
executor's claims turns only failures into working traces; the communication pass (``thunder.comm.comm_pass``) then
finds
the collectives where it always did, outside the fusion regions, and buckets them as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Any

from thunderviz.parallel.decisions import Case, Decision, ExecutorFacts, decide_executors
from thunderviz.parallel.strategy_options import StrategyOptions

__all__ = [
    "ASSUMED_TRITON",
    "decided_executors",
    "executor_facts",
    "inductor_fusions_ran",
    "keep_collectives_out_of_fusions",
    "rehearsing_fusions",
    "resolve_executors",
    "target_executor_facts",
    "uncompiled_fusions",
]

_patch_lock = threading.Lock()


def keep_collectives_out_of_fusions() -> int:
    """Remove the distributed prims from every registered fusion executor's claims; return how many were removed.

    Idempotent, and it touches only fusion executors (``torchcompile`` claims them; nvFuser and the operator
    executors never do): what runs each collective stays the torch executor, exactly as without a fusion executor.
    """
    import thunder.distributed.prims as dist_prims
    from thunder.extend import FusionExecutor, get_all_executors

    removed = 0
    with _patch_lock:
        for ex in get_all_executors():
            if not isinstance(ex, FusionExecutor):
                continue
            claimed = [op for op in ex._implmap if isinstance(op, dist_prims.PrimIDs)]
            for op in claimed:
                del ex._implmap[op]
            removed += len(claimed)
    return removed


def _inductor_problem(device: str) -> str:
    """Why torch.compile's inductor cannot build kernels on ``device`` here ("" when it can)."""
    if device == "cuda":
        from torch.utils._triton import has_triton

        return "" if has_triton() else "triton is not installed (torch.compile's CUDA kernels need it)"
    import torch._inductor.config as inductor_config

    names = [n for n in (os.environ.get("CXX"), *inductor_config.cpp.cxx) if n]
    if any(shutil.which(n) for n in names):
        return ""
    return (
        f"no C++ compiler was found ({' / '.join(dict.fromkeys(names)) or 'g++'}; torch.compile's CPU kernels are C++)."
        " Install one (`apt-get install g++`) or set CXX"
    )


def executor_facts(device: str, user_jitted: Any = None, user_call: str = "") -> ExecutorFacts:
    """Read the facts for ``decide_executors``: registered executors, thunder's defaults, and whether inductor can
    compile on ``device``; with ``user_jitted`` (case 3), the executors of the user's own thunder.jit call
    (``user_call``: the call that made it, when it was not thunder.jit)."""
    import thunder
    from thunder.extend import get_all_executors

    installed = tuple(ex.name for ex in get_all_executors())
    defaults = tuple(ex.name for ex in thunder.get_default_executors())
    problem = _inductor_problem(device)
    mine: tuple[str, ...] = ()
    if user_jitted is not None:
        cd = thunder.compile_data(user_jitted)
        # thunder puts an ad hoc executor of its own first (for symbols registered at trace time): not a choice
        # (and thunder.compile's recipes one for their lookasides); neither is a choice of fusion or kernels
        mine = tuple(
            str(ex.name)
            for ex in getattr(cd, "executors_list", ()) or ()
            if not str(ex.name).startswith(("__ad_hoc_executor", "__temp"))
        )
    return ExecutorFacts(
        device=device,
        installed=installed,
        defaults=defaults,
        inductor_ok=not problem,
        inductor_problem=problem,
        user_jitted=mine,
        user_call=user_call,
    )


def resolve_executors(names: tuple[str, ...], given: tuple[Any, ...] | None) -> list[Any]:
    """The list for ``thunder.jit(executors=...)``: each chosen name, as the executor object the user passed when
    they passed one (an executor of their own that is registered under no name), else the name."""
    objects = {getattr(e, "name", None): e for e in (given or ()) if not isinstance(e, str)}
    return [objects.get(n, n) for n in names]


#: Why a plan for CUDA ranks made on a machine without CUDA assumes torch.compile can fuse there.
ASSUMED_TRITON = (
    "this machine has no CUDA, so what the CUDA ranks will decide is assumed: triton present (a CUDA torch wheel"
    " brings it), so torch.compile's inductor fuses there"
)


def target_executor_facts(device: str) -> tuple[ExecutorFacts, str]:
    """The executor facts of the ranks' machine, and what was assumed about it ("" when nothing was).

    Why not this machine's: a plan made on a laptop for CUDA ranks must trace what those ranks will run, and without a
    CUDA device torch reports no triton (``has_triton`` needs a device), which would plan thunder without a fusion
    executor: about twice the saved activations the ranks will have (the executor rule's measurement).
    """
    facts = executor_facts(device)
    if device != "cuda" or facts.inductor_ok:
        return facts, ""
    import torch

    if torch.cuda.is_available():  # a CUDA machine without triton: the ranks' own facts
        return facts, ""
    return dataclasses.replace(facts, inductor_ok=True, inductor_problem=""), ASSUMED_TRITON


def decided_executors(options: StrategyOptions, device: str) -> tuple[list[Any], Decision, str]:
    """What a strategy with ``options`` passes to its own ``thunder.jit`` on ``device`` (case 1): the same rule, for
    a rehearsal that must trace what the ranks will run; with the decision and what was assumed about the ranks'
    machine (``target_executor_facts``)."""
    facts, assumed = target_executor_facts(device)
    how = decide_executors(facts, options, Case.RAW_MODULE, "")
    return resolve_executors(how.executors, options.executors), how, assumed


def inductor_fusions_ran(since_ns: int) -> bool:
    """True when a jitted object called since ``since_ns`` (``time.perf_counter_ns()``, thunder's clock) ran an
    execution trace with torch.compile fusion regions (thunder's ``torchcompile`` executors): the memory meter's
    ``MemTracker`` cannot see inside their kernels.

    Found through the garbage collector, as ``hooks.clear_all_trace_caches`` finds stale caches: the meter is handed
    modules, and a function the user jitted (case 2) is not among them.
    """
    import gc

    from thunder.common import CompileStats
    from thunder.executors.torch_compile import TorchCompileExecutor

    for stats in (o for o in gc.get_objects() if type(o) is CompileStats):
        if (getattr(stats, "last_trace_host_start", None) or -1) < since_ns:
            continue
        traces = stats.last_traces or ()
        if traces and any(
            isinstance(getattr(b.sym, "executor", None), TorchCompileExecutor) for b in traces[-1].bound_symbols
        ):
            return True
    return False


class _TorchWithoutCompile:
    """The ``torch`` module as thunder's torchcompile executor sees it during a rehearsal: ``compile`` returns a
    function that runs the region's ops one by one, inside the tracker's ``fused_region`` when one is counting;
    everything else is torch's."""

    def __init__(self, tracker: Callable[[], Any] | None) -> None:
        self._tracker = tracker

    def __getattr__(self, name: str) -> Any:
        import torch

        if name == "compile":
            return self._compile
        return getattr(torch, name)

    def _compile(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        def region(*inputs: Any) -> Any:
            tracker = self._tracker() if self._tracker is not None else None
            if tracker is None or not tracker.active:
                return fn(*inputs)
            return tracker.fused_region(fn, inputs)

        return region


def rehearsing_fusions(torch_compile_module: Any) -> bool:
    """Whether thunder's torchcompile executor (the module ``thunder.executors.torch_compile``) runs regions
    uncompiled now (inside ``uncompiled_fusions``)."""
    return isinstance(getattr(torch_compile_module, "torch", None), _TorchWithoutCompile)


@contextlib.contextmanager
def uncompiled_fusions(tracker: Callable[[], Any] | None = None) -> Iterator[None]:
    """Within this block, thunder's torchcompile executors build their fusion regions but run each region's ops one
    by one (the torch executor's trace of the region) instead of compiling it; ``tracker`` returns the
    ``StorageTracker`` counting (if any), which keeps the region's pointwise intermediates virtual, as inductor does.

    Why: a rehearsal runs on meta tensors under a dispatch mode that counts every storage, where inductor can neither
    compile nor be seen into; the regions' boundaries — what each region returns, what forward saves for backward,
    what rematerialization recomputes — are thunder's and stay exactly as they would be. Inside a region the
    tracker approximates inductor: pointwise chains allocate nothing until a matmul reads them or the region returns
    them (``StorageTracker`` module doc).
    """
    import thunder.executors.torch_compile as tc
    from thunder.executors.passes import del_last_used

    original_torch, original_transform = tc.torch, tc.transform_for_execution

    def region_trace(trace: Any, executors_list: Any) -> Any:
        # each intermediate is freed after its last use, as in any thunder execution trace (a region's own trace has
        # no deletions: torch.compile plans its buffers itself)
        return del_last_used(original_transform(trace, executors_list=executors_list))

    tc.torch = _TorchWithoutCompile(tracker)  # type: ignore[assignment]
    tc.transform_for_execution = region_trace
    try:
        yield
    finally:
        tc.torch, tc.transform_for_execution = original_torch, original_transform
