"""Capture: read thunder's trace objects into the trace model (``thunderviz.trace.model``).

``capture`` takes whatever a user holds after ``fabric.setup`` or ``thunder.jit`` and returns a ``TraceBundle``;
the jobs it strings together each have their own module:

- ``find_target``: which jitted object holds the traces (a ThunderModule, Fabric's wrapper around one, or for a
  module set up with ``jit=False`` the jitted function that traced it);
- ``snapshot``: one thunder trace -> ``TraceSnapshot`` (``snapshot_trace``, re-exported here);
- ``param_names``: trace argument names -> qualified parameter names;
- ``world``: the rank and world size the bundle is labelled with.

Thunder and torch are imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any

from thunderviz.errors import TraceCaptureError
from thunderviz.process_rank import process_rank
from thunderviz.thunder.capture.find_target import find_target
from thunderviz.thunder.capture.param_names import param_names as _param_names
from thunderviz.thunder.capture.snapshot import recomputed_ops, snapshot_trace, stage_label, tensor_ref
from thunderviz.trace.attribution import assign_modules
from thunderviz.trace.model import TraceBundle, TraceSnapshot

__all__ = ["capture", "snapshot_trace"]


def capture(obj: Any, name: str | None = None, *, rank: int | None = None, stages: bool = True) -> TraceBundle:
    """Read the traces of a jitted module or function that has already run once.

    Args:
        obj: what ``thunder.jit`` or ``fabric.setup`` returned: a ``ThunderModule`` (also after
            ``thunder.distributed.fsdp/ddp``), a jitted function, or Fabric's wrapper around either a
            ThunderModule (cases 1 and 3) or a plain module whose jitted function ran (case 2, see
            ``thunderviz.thunder.capture.find_target``).
        name: label for reports; defaults to the module class or function name.
        rank: defaults to ``torch.distributed.get_rank()`` when a process group exists, else 0.
        stages: also snapshot every named stage of ``thunder.last_traces`` (larger files).

    Raises:
        TraceCaptureError: nothing jitted can be found behind ``obj``, several candidates can, or it has not run.
    """
    import thunder
    import torch

    found = find_target(obj)
    target = found.jitted
    cs = thunder.compile_stats(target)
    if cs is None or cs.last_traces is None:
        raise TraceCaptureError(
            f"capture(obj): {found.what} has not run yet, so thunder has no traces. Call it once (out = model(batch); "
            "and out.sum().backward() for the backward trace), then capture it."
        )
    fwd_traces = list(thunder.last_traces(target))
    from thunderviz.thunder import compile_state  # imports torch: only once a capture is asked for

    # The backward of the entry that ran last (thunder.last_backward_traces can belong to another cache entry).
    bwd_traces = compile_state.backward_traces_of_last_run(target)
    names = _param_names(target, fwd_traces[-1])
    seen: dict[int, Any] = {}  # one record per bound symbol object, shared by every trace of this capture
    forward = snapshot_trace(fwd_traces[-1], label="forward", param_names=names, seen=seen)
    backward = snapshot_trace(bwd_traces[-1], label="backward", seen=seen) if bwd_traces else None
    _add_communication(forward, fwd_traces[-1], backward, bwd_traces[-1] if bwd_traces else None)
    stage_snaps: list[TraceSnapshot] = []
    if stages:
        for i, t in enumerate(fwd_traces):
            stage_snaps.append(snapshot_trace(t, label=stage_label(t, i), param_names=names, memory=False, seen=seen))
    assign_modules(forward, backward)
    for s in stage_snaps:
        assign_modules(s, None)
    where = process_rank()
    own_rank, world_size = where.rank, where.world_size
    return TraceBundle(
        name=name or found.default_name,
        rank=own_rank if rank is None else rank,
        world_size=world_size,
        forward=forward,
        backward=backward,
        stages=stage_snaps,
        versions={"thunder": str(getattr(thunder, "__version__", "?")), "torch": str(torch.__version__)},
    )


def _add_communication(forward: TraceSnapshot, fwd: Any, backward: TraceSnapshot | None, bwd: Any) -> None:
    """What forward saves for backward, what backward recomputes, and the buckets thunderviz's communication pass
    laid out in each trace (and, under no_backward_sync, the gradient buckets it accumulated instead)."""
    from thunderviz.thunder import compile_state
    from thunderviz.trace.buckets import Bucket

    if bwd is not None:
        forward.saved_for_backward = [tensor_ref(p) for p in compile_state.saved_tensors(fwd)]
    forward.buckets = [Bucket.from_dict(b.to_dict()) for b in compile_state.trace_buckets(fwd)]
    if backward is not None:
        backward.buckets = [Bucket.from_dict(b.to_dict()) for b in compile_state.trace_buckets(bwd)]
        backward.accumulated = [Bucket.from_dict(b.to_dict()) for b in compile_state.trace_accumulated(bwd)]
        for i in recomputed_ops(fwd, bwd):
            backward.ops[i].recomputed = True
