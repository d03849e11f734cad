"""A failed cell's full output, folded: every rank's traceback in a collapsed ``<details>`` above the short error.

Why: the error a failed cell raises is the short form (``cell.tracebacks``: identical tracebacks once, the user's
frames first, library frames folded), which is what a reader needs first; the full text of every rank is still what
a bug report needs, so the notebook keeps it one click away. Outside a notebook (IPython in a terminal) the same
display prints one line saying how to get it.
"""

from __future__ import annotations

import html

from thunderviz.cell.failures import CellError

__all__ = ["FullTracebacks"]


class FullTracebacks:
    """Displays a ``CellError``'s full per-rank tracebacks, collapsed."""

    def __init__(self, error: CellError) -> None:
        self.text = error.full_traceback()
        self.ranks = sorted(r for r, f in error.failures.items() if f.traceback)

    def _summary(self) -> str:
        who = ", ".join(map(str, self.ranks))
        return f"Full traceback{'s' if len(self.ranks) != 1 else ''} of rank{'s' if len(self.ranks) != 1 else ''} {who}"

    def __repr__(self) -> str:
        if not self.text:
            return "(no rank sent a traceback)"
        return f"{self._summary()} ({len(self.text.splitlines())} lines): %thunder_ranks traceback"

    def _repr_html_(self) -> str | None:
        if not self.text:
            return None
        return (
            f"<details class='thunderviz-full-traceback'><summary>{html.escape(self._summary())} "
            f"({len(self.text.splitlines())} lines; the short form is below)</summary>"
            f"<pre>{html.escape(self.text)}</pre></details>"
        )
