"""The rank side of ``--timeline``: start a recording before the cell, finish it after, hand back the result.

A cell is arbitrary user code, so it cannot be wrapped in a ``with`` block; the rank engine calls
``start_cell_recording`` just before the cell runs (on every rank: it takes part in a rendezvous for the clock)
and ``finish_cell_recording`` right after (also when the cell raised: every wrapper is undone either way). The
recorder lives in the rank's namespace under ``_thunderviz_timeline`` between the two calls. Nothing here imports
IPython.
"""

from __future__ import annotations

from typing import Any

from thunderviz.core.profiling import TimelineRecorder

__all__ = ["NS_KEY", "finish_cell_recording", "start_cell_recording"]

NS_KEY = "_thunderviz_timeline"


def start_cell_recording(ns: dict[str, Any], steps: int, *, name: str = "") -> None:
    """Begin recording this rank for the next cell (``steps`` as in ``record_timeline``)."""
    old = ns.pop(NS_KEY, None)
    if old is not None and old.recording:  # a previous cell never finished (interrupted): undo its wrappers
        old.__exit__(RuntimeError, RuntimeError("interrupted"), None)
    rec = TimelineRecorder(steps, name=name, fabric=ns.get("fabric"))
    rec.__enter__()
    ns[NS_KEY] = rec


def finish_cell_recording(ns: dict[str, Any], *, failed: bool) -> dict[str, Any]:
    """Stop the recording; ``{"timeline": RankTimeline}`` or ``{"problems": [...]}`` for the cell's report."""
    rec = ns.pop(NS_KEY, None)
    if rec is None:
        return {"problems": ["--timeline: no recording was running on this rank"]}
    exc = RuntimeError("the cell raised") if failed else None
    try:
        rec.__exit__(type(exc) if exc else None, exc, None)
    except Exception as e:
        return {"problems": [f"--timeline: finishing the recording failed ({type(e).__name__}: {e})"]}
    return {"timeline": rec.result}
