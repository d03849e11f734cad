"""Both ends of ``--timeline`` in the ranks layer: recording a cell on each rank, and merging the ranks' recordings.

Rank side (called by ``cell_hooks``, never by the user): a cell is arbitrary code, so it cannot be
wrapped in a ``with`` block. ``start_cell_recording`` runs in the ``pre_run_cell`` hook (on every rank: it takes
part in a clock rendezvous), ``stop_cell_recording`` first thing in the ``post_run_cell`` hook (also when the cell
raised: the profiler stops and every wrapper is undone either way), and ``finish_cell_recording`` after the report's
traces were captured, so the timeline takes its names from those bundles instead of capturing them a second time.
The recorder lives in ``rank.state.STATE`` between the hooks, never in the user's namespace.

Kernel side: ``merge_rank_timelines`` turns what each rank sent (``ReportData``'s ``timeline`` and
``timeline_problems``) into one ``Timeline`` and plain-language problems (a rank that died, a cell without a step).

Nothing here imports IPython; torch loads only inside the rank-side calls.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from thunderviz.cell.protocol import ReportData, TimelinePart
from thunderviz.timeline.model import RankTimeline, Timeline

__all__ = [
    "NO_STEP_PROBLEM",
    "finish_cell_recording",
    "merge_rank_timelines",
    "profiler_active",
    "start_cell_recording",
    "stop_cell_recording",
]

#: What the report says when the cell ran no training step while recording.
NO_STEP_PROBLEM = (
    "--timeline: the cell ran no training step while recording: no optimizer step(), no call of a jitted module "
    "(a step ends when an optimizer's step() returns; a cell without an optimizer counts calls of the module "
    "fabric.setup returned). Run the training loop in the cell, or use record_timeline(...) with rec.step()."
)


def profiler_active() -> bool:
    """Whether a torch.profiler (ours or anybody's) is recording in this process."""
    import torch

    return bool(torch.autograd._profiler_enabled())


def start_cell_recording(steps: int, *, fabric: Any = None, previous: Any = None) -> tuple[Any, list[str]]:
    """Begin recording this rank for the cell about to run: ``(recorder or None, problems)``.

    The closing clock rendezvous is skipped (``clock_at_end=False``): a rank whose cell raised would not reach it
    while its peers waited there for the process-group timeout; the opening rounds alone bound the offsets (a
    clock drifts far less than the bound during one cell). ``previous`` is a recorder that was never stopped (a
    cell whose post-cell hook did not run): it is stopped first, so two recordings never stack.
    """
    from thunderviz.timeline.record import TimelineRecorder

    problems: list[str] = []
    if previous is not None:
        with contextlib.suppress(Exception):
            previous.stop(failed=True)
    busy = profiler_active()
    # Every rank must take part in the recorder's clock rendezvous or none may: a rank that skipped it would pair
    # its cell's first collective with its peers' rendezvous. So the ranks agree first.
    if not _all_ranks_agree(not busy):
        if busy:
            return None, [
                "--timeline: another torch.profiler is already recording on this rank, and two cannot run at "
                "once; stop it (prof.stop(), or leave its `with` block) or run the cell without --timeline"
            ]
        return None, ["--timeline: not recorded, because another rank could not start its recording (see its problem)"]
    rec = TimelineRecorder(steps, fabric=fabric, clock_at_end=False)
    try:
        rec.__enter__()
    except Exception as e:  # the cell still runs, without a timeline
        problems.append(f"--timeline: starting the recording failed ({type(e).__name__}: {e})")
        return None, problems
    return rec, problems


def _all_ranks_agree(ok: bool) -> bool:
    """True when ``ok`` holds on every rank of the default process group (one all_reduce; no group: ``ok``)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold off SIGINT while the profiler stops and the wrappers are undone.

    Why: after a peer fails, the kernel sends this rank SIGINT to release it from a collective; arriving in the
    middle of stopping, it would leave torch.profiler recording and ``torch.distributed`` wrapped in a rank that
    lives on. The cell has ended by then, so there is nothing left for the signal to interrupt; it is dropped.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.signal(signal.SIGINT, lambda *_: None)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_cell_recording(rec: Any, *, failed: bool) -> list[str]:
    """Stop the profiler and undo every wrapper (cheap: the events are interpreted later); problems in words."""
    if rec is None:
        return []
    try:
        with _sigint_deferred():
            rec.stop(failed=failed)
    except Exception as e:
        return [f"--timeline: stopping the recording failed ({type(e).__name__}: {e})"]
    if profiler_active():
        return ["--timeline: torch.profiler was still recording after the cell; it was not started by thunderviz"]
    return []


def finish_cell_recording(
    rec: Any, *, failed: bool, bundles: Mapping[int, Any] | None = None, problems: list[str] | None = None
) -> TimelinePart:
    """The stopped recording as this rank's part of the report (no ``timeline`` when nothing was recorded).

    ``bundles``: the trace bundles the report captured, by id of the jitted object or its compile data.
    """
    out = TimelinePart(timeline_problems=list(problems or []))
    if rec is None:
        if not out["timeline_problems"]:
            out["timeline_problems"].append("--timeline: no recording was running on this rank")
        return out
    try:
        with _sigint_deferred() if failed else contextlib.nullcontext():
            out["timeline"] = rec.build(bundles)
    except Exception as e:  # the rest of the report must still come back
        out["timeline_problems"].append(f"--timeline: building the timeline failed ({type(e).__name__}: {e})")
    return out


def merge_rank_timelines(
    collected: Mapping[int, ReportData],
    *,
    world_size: int,
    name: str = "",
    failed: Mapping[int, str] | None = None,
) -> tuple[Timeline | None, list[str]]:
    """One ``Timeline`` from what each rank sent, and the problems to show: ``(None, problems)`` when no rank
    returned a recording.

    ``failed``: ranks that sent nothing because they did not finish the cell, with why (``"died"``), so the
    problems say what happened to them rather than only that their timeline is missing.
    """
    problems: list[str] = []
    recs: list[RankTimeline] = []
    failed = dict(failed or {})
    for rank in range(world_size):
        data = collected.get(rank)
        if data is None:
            if rank in failed:
                problems.append(f"rank {rank} {failed[rank]} while the timeline was recorded; it sent no timeline")
            continue  # Timeline.from_ranks names the missing ranks in the timeline's own problems
        problems.extend(f"rank {rank}: {p}" for p in data.get("timeline_problems", ()))
        t = data.get("timeline")
        if isinstance(t, RankTimeline):
            recs.append(t)
    if not recs:
        return None, problems or ["--timeline: no rank returned a timeline (they died or did not finish the cell)"]
    if not any(t.steps for t in recs):
        problems.append(NO_STEP_PROBLEM)
    return Timeline.from_ranks(recs, name=name), problems
