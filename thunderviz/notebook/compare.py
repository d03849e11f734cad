"""``thunderviz.compare(a, b)``: two runs' traces side by side, the structural diff marked, its summary on top.

Kept apart from the widget classes so the public entry point reads as one function: it normalises whatever the
user has (two saved runs, two lists of per-rank bundles, two reports, ZERO2 vs ZERO3, FSDP vs DDP) and builds a
``CompareView``.
"""

from __future__ import annotations

from typing import Any

from thunderviz.notebook.subject import subject_of
from thunderviz.notebook.widgets import CompareView

__all__ = ["compare"]


def compare(
    a: Any, b: Any, *, trace: str | None = None, name: str | tuple[str | None, str | None] | None = None
) -> CompareView:
    """Show ``a`` and ``b`` side by side; ``a`` is the baseline (left), ``b`` the one compared with it (right).

    Args:
        a: the baseline: a ``TraceBundle``, a list of per-rank bundles, a saved trace file's path (or a list of
            them), a ``TraceSnapshot``, a ``render.html.Report`` or the rank engine's ``RunReport``.
        b: the run compared with it, any of the same.
        trace: ``"forward"``, ``"backward"`` or a stage label both have; default: the first they share
            (``"forward"``).
        name: which jitted object to take when an input holds several: one name for both, or ``(name_a, name_b)``.

    Returns:
        A ``CompareView`` widget; ``.diff`` is the ``trace.diff.TraceDiff``, ``.summary`` the line shown on top.
    """
    na, nb = name if isinstance(name, tuple) else (name, name)
    return CompareView(subject_of(a, na), subject_of(b, nb), trace=trace)
