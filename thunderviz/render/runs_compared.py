"""The demo page's "Runs compared" section: pairs of runs that did the same work under different strategies, each as
the compare view's header says it (``trace.diff.verdict``) and the groups that differ (``trace.diff.group_changes``).

Which pairs: runs are paired as the "which strategy?" table groups them, by workload (``trace.workload``: the same
model, batch, optimizer and ranks), and within a workload every pair of distinct strategies once (the first run of
each strategy), in the order the runs came. Neighbouring cells had been paired before: ZERO3 against DDP, DDP
against the same DDP ("No group differs"), an SGD run against an AdamW one, while the tutorial's own DDP against
ZERO2 was missing.

Why static text, not the widget: the page is offline and script-free (it reads the same in any browser and in
nbconvert). Reads reports by attribute: render imports neither the rank engine nor the strategies.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from thunderviz.render.markup import escape, table
from thunderviz.trace.diff import group_changes, verdict

__all__ = ["RUNS_COMPARED_ID", "compared_pairs", "runs_compared_html"]

#: The anchor of the section on a page (the demo page's contents link it).
RUNS_COMPARED_ID = "runs-compared"


def compared_pairs(reports: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The names of the runs to compare, in pairs (see the module docstring): same workload, different strategy."""
    firsts: dict[Any, dict[str, str]] = {}  # workload -> strategy -> first run's name
    for name, r in reports.items():
        workload = getattr(r, "workload", None)
        if workload is None or not getattr(r, "bundles", None) or r.strategy is None:
            continue
        firsts.setdefault(workload, {}).setdefault(r.strategy.describe(), name)
    return [pair for by_strategy in firsts.values() for pair in itertools.combinations(by_strategy.values(), 2)]


def runs_compared_html(reports: Mapping[str, Any]) -> str:
    """One section per pair of ``compared_pairs`` that traced an object of the same name ("" when there is none);
    names from user cells are escaped."""
    sections = []
    for a, b in compared_pairs(reports):
        ra, rb = reports[a], reports[b]
        shared = [obj for obj in ra.bundles if obj in rb.bundles]
        if not shared:
            continue
        obj = shared[0]
        rows = []
        for label in ("forward", "backward"):
            ta, tb = ra.bundles[obj].traces().get(label), rb.bundles[obj].traces().get(label)
            if ta is None or tb is None:
                continue
            rows += [[label, g.describe(a, b)] for g in group_changes(ta, tb).values() if g.status != "same"]
        differs = table(["trace", "what differs"], rows) if rows else "<p>No group differs.</p>"
        peaks = ra.step_peak(), rb.step_peak()
        memory = None
        if peaks[0] is not None and peaks[1] is not None:
            memory = ("step peak (measured)", peaks[0][1].peak_bytes, peaks[1][1].peak_bytes)
        said = verdict(ra.bundles[obj], rb.bundles[obj], a, b, memory)
        sections.append(
            f"<section class='compare'><h3>{escape(a)} against {escape(b)} ({escape(obj)})</h3>"
            f"<p>{escape(said)}</p>{differs}</section>"
        )
    if not sections:
        return ""
    intro = (
        "<p class='note'>Each pair of runs with the same model, batch, optimizer and ranks under different"
        " strategies.</p>"
    )
    return f"<h2 id='{RUNS_COMPARED_ID}'>Runs compared</h2>{intro}" + "".join(sections)
