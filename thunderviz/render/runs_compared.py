"""The demo page's "Runs compared" section: each run against the one before it on the same traced object, as the
compare view's header says it (``trace.diff.verdict``) and the groups that differ (``trace.diff.group_changes``).

Why static text, not the widget: the page is offline and script-free (it reads the same in any browser and in
nbconvert), and the issue-30 reader of the 37,000 px page had no way to see what ZERO3 changed against ZERO2 without
a kernel. Reads reports by attribute: render imports neither the rank engine nor the strategies.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from thunderviz.render.markup import escape, table
from thunderviz.trace.diff import group_changes, verdict

__all__ = ["runs_compared_html"]


def runs_compared_html(reports: Mapping[str, Any]) -> str:
    """One section per consecutive pair of runs that traced an object of the same name ("" when there is none);
    names from user cells are escaped."""
    names = [n for n, r in reports.items() if getattr(r, "bundles", None)]
    sections = []
    for a, b in itertools.pairwise(names):
        ba, bb = reports[a].bundles, reports[b].bundles
        shared = [obj for obj in ba if obj in bb]
        if not shared:
            continue
        obj = shared[0]
        rows = []
        for label in ("forward", "backward"):
            ta, tb = ba[obj].traces().get(label), bb[obj].traces().get(label)
            if ta is None or tb is None:
                continue
            rows += [[label, g.describe(a, b)] for g in group_changes(ta, tb).values() if g.status != "same"]
        differs = table(["trace", "what differs"], rows) if rows else "<p>No group differs.</p>"
        sections.append(
            f"<section class='compare'><h3>{escape(a)} against {escape(b)} ({escape(obj)})</h3>"
            f"<p>{escape(verdict(ba[obj], bb[obj], a, b))}</p>{differs}</section>"
        )
    if not sections:
        return ""
    return "<h2>Runs compared</h2>" + "".join(sections)
