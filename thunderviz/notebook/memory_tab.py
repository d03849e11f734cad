"""What the Memory tab and the memory panel show, computed from a ``Subject``: no IPython, no browser.

The panel (``memory_panel``): per rank, thunder's estimated peaks, what forward saves for backward and what the rank
measured, in titled columns (``MEMORY_COLUMNS``) that a later view can add to without the front end learning new
keys. The tab (``memory_view``): the plan's candidates and the measured ranks as stacked bars against the budget
(``render.memory_view``), what forward saves per module group and per source line, and thunder against eager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from thunderviz.notebook.subject import Subject
from thunderviz.render.memory_view import PEAK_NOTE, plan_bars, plan_predicted, plan_run_bars, run_bars
from thunderviz.trace.memory import compare
from thunderviz.trace.saved import TRACE_SAVED, TRACE_SAVED_NOTE, SavedComparison, saved_by_group, saved_by_line

__all__ = ["MEMORY_COLUMNS", "MemoryColumn", "MemoryPanel", "MemoryView", "memory_panel", "memory_rows", "memory_view"]


class MemoryColumn(TypedDict):
    """One column of the memory panel: the row key it reads, the title a person reads, its unit (``bytes`` are
    formatted as KiB/MiB, ``count`` as a number) and where the number comes from (``estimated`` by thunder from
    the trace, ``measured`` on the rank). A later view (say, predicted vs measured peaks) adds columns, or draws the
    same rows as bars, without the front end learning new keys."""

    key: str
    title: str
    unit: str
    source: str


class MemoryPanel(TypedDict):
    """Per rank (and, in a comparison, per run): every column known for any rank, in ``columns`` order; a value
    missing on a rank is ``None`` (shown as "-"), never a silently short row."""

    columns: list[MemoryColumn]
    rows: list[dict[str, Any]]
    note: str


class MemoryView(TypedDict):
    """The Memory tab's picture (``memory_view``): stacked bars (``render.memory_view.MemoryBar.to_dict()``: each
    plan candidate predicted, each rank measured) against the budget, what forward saves for backward per group and
    per source line, and thunder against eager (``eager``: ``None`` unless a comparison was given)."""

    bars: list[dict[str, Any]]
    budget: int | None
    comparison: list[str]
    saved_by_group: list[dict[str, Any]]
    saved_by_line: list[dict[str, Any]]
    eager: dict[str, Any] | None


#: The memory panel's columns, in the order shown; a column appears when any rank has its number.
MEMORY_COLUMNS: tuple[MemoryColumn, ...] = (
    MemoryColumn(key="measured_step_peak", title="step peak, measured", unit="bytes", source="measured"),
    MemoryColumn(key="predicted_step_peak", title="step peak, predicted", unit="bytes", source="predicted"),
    MemoryColumn(key="est_peak_forward", title="trace estimate, forward", unit="bytes", source="estimated"),
    MemoryColumn(key="est_peak_backward", title="trace estimate, backward", unit="bytes", source="estimated"),
    MemoryColumn(key="saved_for_backward", title=TRACE_SAVED, unit="bytes", source="estimated"),
    MemoryColumn(key="recomputed_ops", title="recomputed ops", unit="count", source="estimated"),
    MemoryColumn(key="kept_for_accumulation", title="kept for accumulation", unit="bytes", source="estimated"),
    MemoryColumn(key="rss_bytes", title="process RSS", unit="bytes", source="measured"),
    MemoryColumn(key="cuda_max_allocated_bytes", title="CUDA peak allocated", unit="bytes", source="measured"),
    MemoryColumn(key="cuda_allocated_bytes", title="CUDA allocated now", unit="bytes", source="measured"),
)
MEMORY_NOTE = (
    f"Step peak: {PEAK_NOTE} {TRACE_SAVED_NOTE} Trace estimate: thunder's get_alloc_memory of one trace's"
    " intermediates, not a step peak. Process RSS is not tensor memory."
)


def memory_rows(subject: Subject) -> list[dict[str, Any]]:
    """Per rank: thunder's estimated peak per trace and what forward saves for backward, plus whatever the rank
    engine measured (``MEMORY_COLUMNS`` keys)."""
    out = []
    for r in sorted(set(subject.bundles) | set(subject.memory)):
        b = subject.bundles.get(r)
        row: dict[str, Any] = {"rank": r}
        if b is not None:
            row.update({f"est_peak_{k}": v for k, v in b.memory.items()})
            if b.backward is not None:
                row["saved_for_backward"] = b.saved_for_backward["bytes"]
                if b.backward.recomputed_ops:
                    row["recomputed_ops"] = b.backward.recomputed_ops
            if b.accumulated_gradients["bytes"]:
                row["kept_for_accumulation"] = b.accumulated_gradients["bytes"]
        for k, v in subject.memory.get(r, {}).items():
            if isinstance(v, (int, float, str)) or v is None:
                row[k] = v
        measured = subject.step_memory.get(r)
        if measured is not None and measured.peak_bytes is not None:
            row["measured_step_peak"] = measured.peak_bytes
        if subject.prediction is not None:
            row["predicted_step_peak"] = subject.prediction.peak_bytes
        out.append(row)
    return out


def memory_panel(rows: Sequence[dict[str, Any]], *, lead: Sequence[MemoryColumn] = ()) -> MemoryPanel:
    """``memory_rows`` as the panel shows them: the known columns any row fills (plus ``lead`` columns first, e.g.
    a comparison's run), every row filled out with ``None`` where its rank has no number."""
    known = {c["key"] for c in MEMORY_COLUMNS}
    present = {k for r in rows for k, v in r.items() if v is not None}
    columns = [*lead, *(c for c in MEMORY_COLUMNS if c["key"] in present)]
    extra = sorted(present - known - {"rank"} - {c["key"] for c in lead})
    columns += [MemoryColumn(key=k, title=k.replace("_", " "), unit="", source="measured") for k in extra]
    full = [{"rank": r["rank"], **{c["key"]: r.get(c["key"]) for c in columns}} for r in rows]
    return MemoryPanel(columns=columns, rows=full, note=MEMORY_NOTE)


def memory_view(subject: Subject, plan: Any = None, saved_vs_eager: SavedComparison | None = None) -> MemoryView:
    """The Memory tab: the plan's candidates and the measured ranks as bars, saved tensors, thunder vs eager.

    ``plan`` is a ``thunderviz.plan(...)`` result (read by attribute); ``saved_vs_eager`` a
    ``thunder.memory.saved_compare.compare_saved(...)`` result.
    """
    if plan_predicted(plan, subject.prediction):
        bars = [b.to_dict() for b in plan_run_bars(plan, subject.step_memory, subject.prediction_name)]
    else:
        bars = [b.to_dict() for b in plan_bars(plan)] if plan is not None else []
        bars += [b.to_dict() for b in run_bars(subject.step_memory, subject.prediction, subject.prediction_name)]
    comparison = []
    if subject.prediction is not None:
        for rank, measured in sorted(subject.step_memory.items()):
            cmp = compare(subject.prediction, measured)
            if cmp is not None:
                comparison.append(f"rank {rank}: {cmp.summary()}")
    forward = subject.primary.forward
    eager = None
    if saved_vs_eager is not None:
        eager = {
            "summary": saved_vs_eager.summary(),
            "lines": [
                {
                    "line": c.line,
                    "code": c.code,
                    "thunder_bytes": c.thunder_bytes,
                    "eager_bytes": c.eager_bytes,
                    "extra": c.extra,
                    "thunder": list(c.thunder),
                    "eager": list(c.eager),
                }
                for c in saved_vs_eager.lines
            ],
        }
    return MemoryView(
        bars=bars,
        budget=getattr(plan, "memory_per_rank", None) if plan is not None else None,
        comparison=comparison,
        saved_by_group=[{"key": r.key, "tensors": r.tensors, "bytes": r.bytes} for r in saved_by_group(forward)],
        saved_by_line=[
            {"key": r.key, "code": r.code, "tensors": r.tensors, "bytes": r.bytes} for r in saved_by_line(forward)
        ],
        eager=eager,
    )
