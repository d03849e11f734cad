"""Which notebook cell a rank's traceback speaks of: ``Cell In[13]`` as the notebook shows it, not the rank's own
count.

Each rank is an IPython shell with its own execution counter: it counts only the cells that ran on it (``Cell
In[6]``), while the notebook's prompt says ``[13]``. Every user cell increments a rank's counter by exactly one
(our own calls go by ``apply`` and count nothing), so the engine knows each rank's next number: it records which
notebook cell each rank number was, and rewrites the tracebacks of a failed cell (frames of earlier cells, a
function defined there, included). A number it cannot place is left as the rank wrote it.
"""

from __future__ import annotations

import re

__all__ = ["CellNumbers"]

_CELL = re.compile(r"\bCell In\[(\d+)\]")


class CellNumbers:
    """Per rank: the rank's own cell number -> the notebook's, and the number the next cell will get."""

    def __init__(self) -> None:
        self._map: dict[int, dict[int, int]] = {}
        self._next: dict[int, int] = {}

    def reset(self, ranks: list[int], *, fresh: bool) -> None:
        """New rank processes: a fresh shell counts from 1; engines we reset in place keep their counters (unknown
        until a cell tells)."""
        self._map = {r: {} for r in ranks}
        self._next = dict.fromkeys(ranks, 1) if fresh else {}

    def ran(self, rank: int, label: int | None, rank_count: int | None = None) -> None:
        """Rank ``rank`` ran the notebook's cell ``label`` as its ``rank_count`` (the reply's number; else the
        expected next one)."""
        count = rank_count if rank_count is not None else self._next.get(rank)
        if count is None:
            return
        if label is not None:
            self._map.setdefault(rank, {})[count] = label
        self._next[rank] = count + 1

    def renumber(self, rank: int, text: str) -> str:
        """``text`` (a traceback) with each ``Cell In[n]`` of this rank as the notebook numbered it."""
        known = self._map.get(rank, {})
        return _CELL.sub(lambda m: f"Cell In[{known.get(int(m.group(1)), int(m.group(1)))}]", text)
