"""The rank side of ``--timeline``: start a recording before the cell, finish it after, hand back the result.

A cell is arbitrary user code, so it cannot be wrapped in a ``with`` block; the rank engine calls
``start_cell_recording`` just before the cell runs (on every rank: it takes part in a rendezvous for the clock)
and ``finish_cell_recording`` right after (also when the cell raised: every wrapper is undone either way). The
caller keeps the recorder between the two calls in its own rank-side state (``inside_rank.STATE`` after the
ranks split), never in the user's namespace. Nothing here imports IPython.
"""

from __future__ import annotations

from typing import Any

from thunderviz.core.profiling import TimelineRecorder

__all__ = ["finish_cell_recording", "start_cell_recording"]


def start_cell_recording(
    steps: int, *, fabric: Any = None, name: str = "", previous: TimelineRecorder | None = None
) -> TimelineRecorder:
    """Begin recording this rank for the next cell (``steps`` as in ``record_timeline``).

    ``previous`` is the recorder of an earlier cell that never finished (an interrupted cell): its wrappers are
    undone first, so two recordings never stack.
    """
    if previous is not None and previous.recording:
        previous.__exit__(RuntimeError, RuntimeError("interrupted"), None)
    rec = TimelineRecorder(steps, name=name, fabric=fabric)
    rec.__enter__()
    return rec


def finish_cell_recording(rec: TimelineRecorder | None, *, failed: bool) -> dict[str, Any]:
    """Stop the recording; ``{"timeline": RankTimeline}`` or ``{"timeline_problems": [...]}`` for the report."""
    if rec is None:
        return {"timeline_problems": ["--timeline: no recording was running on this rank"]}
    exc = RuntimeError("the cell raised") if failed else None
    try:
        rec.__exit__(type(exc) if exc else None, exc, None)
    except Exception as e:  # the rest of the report must still come back
        return {"timeline_problems": [f"--timeline: finishing the recording failed ({type(e).__name__}: {e})"]}
    return {"timeline": rec.result}
