"""The trace widgets in a real JupyterLab, driven in a real Chromium: run all cells, then read the DOM.

One JupyterLab server (127.0.0.1, random port, a token), one page, one notebook (a copy of
``widgets_tour.ipynb``, because autosave writes outputs back), real traces from a real 2-rank FSDP run of the small
GPT (one collective per parameter: the 1,451-op backward), and of the tutorial's model under the default buckets
(the run reports a notebook user sees, and their comparisons). The
expected values (collective nodes, the parameter's all_gather, the diff summary, the comparison's titles) are
computed in this process from the same trace files with the widget classes, so the DOM is checked against the
model, not against numbers typed into the test. Every run saves a screenshot of each view to the artifacts folder,
``test-output/browser/`` (``THUNDERVIZ_BROWSER_ARTIFACTS`` names another; not committed), for anyone to look at.

Over a minute (about 170 s beside the other pytest worker), in the module fixture: the real 2-rank runs whose traces
and timeline the views draw (shared with other files through ``once_per_run``), a memory plan's rehearsals,
JupyterLab's start and a run of every cell in Chromium.

Needs Debian's ``chromium`` at /usr/bin/chromium (never a downloaded browser); skipped with that reason otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browser import MISSING_REASON, chromium_missing
from tests.helpers.bucketed_traces import bucketed_trace_files, run_report
from tests.helpers.gpt_traces import decisions_for, gpt_trace_files
from tests.helpers.jupyterlab import open_lab, run_all
from tests.helpers.memory_view import memory_view_file, memory_view_inputs
from tests.helpers.timeline_runs import recorded

HERE = Path(__file__).parent
REPO = HERE.parent.parent
SHOTS = Path(os.environ.get("THUNDERVIZ_BROWSER_ARTIFACTS") or REPO / "test-output" / "browser")
#: The smallest text a graph may draw, in CSS pixels (6-7 px at "fit" was unreadable).
MIN_TEXT_PX = 11.0
# The smallest font size times its scale on screen, over every text of the graphs under ``root``.
_MIN_TEXT_JS = """
(root) => {
  let m = Infinity;
  for (const t of root.querySelectorAll('.tv-graph svg text')) {
    const fs = parseFloat(t.getAttribute('font-size'));
    const ctm = t.getScreenCTM();
    if (fs > 0 && ctm) m = Math.min(m, fs * Math.hypot(ctm.a, ctm.b));
  }
  return m;
}
"""

# Each outlined node of a pane and its outline (``viewdata.pane_data``'s marks).
_DIFF_MARKS_JS = "els => els.map(e => [e.dataset.node, e.dataset.diff])"
# Per graph pane: its scale on screen (px per graph unit), and its nodes not wholly inside the pane's box.
_PANE_GEOMETRY_JS = """
(root) => [...root.querySelectorAll('.tv-graph')].map((box) => {
  const b = box.getBoundingClientRect();
  const svg = box.querySelector('svg');
  const ctm = svg.getScreenCTM();
  const nodes = [...svg.querySelectorAll('g.node')];
  const cut = nodes.filter((n) => {
    const r = n.getBoundingClientRect();
    return r.left < b.left - 0.5 || r.right > b.right + 0.5 || r.top < b.top - 0.5 || r.bottom > b.bottom + 0.5;
  }).map((n) => n.dataset.node || n.id);
  return { scale: Math.hypot(ctm.a, ctm.b), nodes: nodes.length, cut, box: [b.left, b.top, b.width, b.height] };
})
"""

# Observers installed before JupyterLab loads: long main-thread tasks, to report (not assert) whether expanding a
# block freezes the page; every rank chip ever drawn, to see the states a running cell went through (not the last).
_OBSERVERS = (
    "window.__longtasks = []; new PerformanceObserver((l) => { for (const e of "
    "l.getEntries()) window.__longtasks.push([e.startTime, e.duration]); })"
    ".observe({entryTypes: ['longtask']});",
    "window.__rankStates = []; new MutationObserver((ms) => { for (const m of ms) "
    "for (const n of m.addedNodes) if (n.classList && n.classList.contains('tv-rank')) "
    "window.__rankStates.push([n.dataset.rank, n.dataset.state]); })"
    ".observe(document, {childList: true, subtree: true});",
)

pytestmark = [
    pytest.mark.skipif(chromium_missing(), reason=MISSING_REASON),
    pytest.mark.timeout(900),  # the module fixture may build the shared trace runs (~4 min alone, more under load)
]


class Lab:
    """What the tests read: the page, console errors, timings and the expected values from the model."""

    def __init__(self, page: Any, errors: list[str], expected: dict[str, Any], timings: dict[str, float]) -> None:
        self.page = page
        self.errors = errors
        self.expected = expected
        self.timings = timings

    def shot(self, name: str, root: Any) -> Path:
        """Screenshot of one view for a person to look at: the whole element when it fits the window, else the
        window with the element's top at its top (a notebook output taller than the window scrolls inside the
        notebook, and an element shot of it comes out garbled)."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        box = root.bounding_box()
        if box is not None and box["height"] > self.page.viewport_size["height"] - 40:
            root.evaluate("e => e.scrollIntoView({block: 'start'})")
            self.page.screenshot(path=str(path))
        else:
            root.screenshot(path=str(path))
        return path


def _expected(
    files: dict[str, list[str]], timeline_run: dict[str, list[str]], bucketed: dict[str, list[str]]
) -> dict[str, Any]:
    """The values the DOM must show, computed with the same widget classes from the same trace files."""
    from thunderviz.notebook.compare import compare
    from thunderviz.notebook.timeline_widget import TimelineView
    from thunderviz.notebook.widgets import TraceView
    from thunderviz.timeline import load

    view = TraceView(files["fsdp"], trace="backward")
    pane = view.panes[0]
    collective_nodes = sorted(k for k, m in pane["nodes"].items() if m["kind"] == "collectives")
    ledger_rows = len(view.panels["ledger"]["rows"])
    fwd = TraceView(files["fsdp"], trace="forward")
    fwd.search = "blocks.1.mlp_fc.weight"
    ag = [m for m in fwd.matches if m["op"] == "all_gather"]
    assert len(ag) == 1, fwd.matches  # the model itself must find it, or the browser check means nothing
    decisions = decisions_for(files["fsdp"][0])
    assert decisions, "the FSDP run logged no jit decision"
    timeline = TimelineView(load(*timeline_run["timelines"]))
    worst = timeline.select_worst()
    assert worst["last_rank"] == 1, worst  # rank 1 slept: the model must name it, or the browser check means nothing
    block_spans = timeline.show_group("blocks.0")
    runs = {name: run_report(name, bucketed[name]) for name in ("zero2", "zero3", "ddp")}
    zero = compare(runs["zero2"], runs["zero3"], trace="backward")
    fsdp_ddp = compare(runs["ddp"], runs["zero2"], trace="backward")
    tutorial_view = TraceView(runs["zero3"], trace="backward")
    plan, saved_vs_eager = memory_view_inputs()
    memory = TraceView(files["fsdp"], trace="forward", plan=plan, saved_vs_eager=saved_vs_eager).panels["memory_view"]
    assert memory["budget"] and any(not b["fits"] for b in memory["bars"]) and any(b["fits"] for b in memory["bars"])
    block = next(g["id"] for g in zero.panes[1]["groups"] if g["name"] == "blocks.0")
    return {
        "memory": memory,
        "compares": [
            {
                "title": c.title,
                "summary": c.summary,
                "verdict": c.verdict,
                "runs": c.runs,
                "panes": [p["title"] for p in c.panes],
            }
            for c in (zero, fsdp_ddp)
        ],
        "zero_compare": {
            "marks": [{nid: m["status"] for nid, m in p["marks"].items()} for p in zero.panes],
            "block": {"node": block, "ops_added": zero.changes["blocks.0"].ops_added},
        },
        "ddp_compare_marks": [{nid: m["status"] for nid, m in p["marks"].items()} for p in fsdp_ddp.panes],
        "tutorial_view": {
            "title": tutorial_view.title,
            "headlines": [d["headline"] for d in tutorial_view.panels["decisions"]],
            "memory_titles": [c["title"] for c in tutorial_view.panels["memory"]["columns"]],
            "trace_names": tutorial_view.trace_names,
        },
        "timeline_worst": {
            "key": timeline.data["worst"],
            "label": worst["label"],
            "message": worst["message"],
            "bytes": worst["ledger"]["bytes"],
        },
        "timeline_block_spans": sum(len(v) for v in block_spans.values()),
        "collective_nodes": collective_nodes,
        "groups": [g["name"] for g in pane["groups"]],
        "all_gather": ag[0],
        # the gather and the ops that use the gathered weight (viewdata.search_ops maps a bucket's results back)
        "match_nodes": sorted({m["node"] for m in fwd.matches}),
        "summary": fsdp_ddp.summary,
        "decisions": decisions,
        "ledger_rows": ledger_rows,
        "delta": fsdp_ddp.diff.collective_delta(),
        # the same change counted straight from the two files, without the diff
        "counted_delta": _count_change(bucketed["ddp"][0], bucketed["zero2"][0]),
    }


def _count_change(a: str, b: str) -> dict[str, int]:
    """How many more collectives of each kind the backward of trace file ``b`` has than ``a``'s (kinds that differ)."""
    from thunderviz.trace.file import load

    a_counts, b_counts = (Counter(op.collective for op in load(p)[0].backward.ops if op.collective) for p in (a, b))
    return {k: b_counts[k] - a_counts[k] for k in sorted(a_counts | b_counts) if b_counts[k] != a_counts[k]}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:

    t_start = time.monotonic()
    files = gpt_trace_files()
    timeline_run = {"timelines": [r.path for r in recorded()], "traces": [r.traces for r in recorded()]}
    bucketed = bucketed_trace_files("zero2", "zero3", "ddp", "fused")  # the tour draws these (not the litgpt run)
    t_traces = time.monotonic()
    expected = _expected(files, timeline_run, bucketed)
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(HERE / "widgets_tour.ipynb", root / "tour.ipynb")
    pypath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)  # the tour imports tests.*
    env = {
        "THUNDERVIZ_WIDGET_TRACES": json.dumps(files),
        "THUNDERVIZ_TIMELINE_RUN": json.dumps(timeline_run),
        "THUNDERVIZ_BUCKETED_RUNS": json.dumps(bucketed),
        "THUNDERVIZ_MEMORY_VIEW": str(memory_view_file(root)),
        "PYTHONPATH": pypath,
    }
    timings: dict[str, float] = {"traces_s": t_traces - t_start}
    try:
        with open_lab(root / "tour.ipynb", env, viewport=(1500, 1400), init_scripts=_OBSERVERS) as opened:
            timings.update(opened.timings)
            page = opened.page
            t0 = time.monotonic()
            run_all(opened)
            page.locator(".tv-root[data-mode=trace][data-drawn]").first.wait_for(timeout=120_000)
            page.locator(".tv-rank[data-state=done]").nth(1).wait_for(timeout=60_000)
            page.locator(".tv-root[data-mode=trace][data-drawn]").nth(1).wait_for(timeout=120_000)
            page.locator(".tl-root[data-drawn]").first.wait_for(timeout=120_000)
            page.locator(".tv-root[data-mode=trace][data-drawn]").nth(3).wait_for(timeout=120_000)
            page.locator(".tv-root[data-mode=compare][data-drawn]").nth(1).wait_for(timeout=120_000)
            # the memory view, then the fused run, then the "which strategy?" table, the tour's last cell
            page.locator(".tv-root[data-mode=trace][data-drawn]").nth(4).wait_for(timeout=120_000)
            page.locator(".tv-root[data-mode=trace][data-drawn]").nth(5).wait_for(timeout=120_000)
            page.locator(".thunderviz-strategies").first.wait_for(timeout=120_000)
            timings["run_all_s"] = time.monotonic() - t0
            yield Lab(page, opened.errors, expected, timings)
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "00-notebook-at-the-end.png"))
            print(f"\nbrowser screenshots: {SHOTS}")
    finally:
        timings["total_s"] = time.monotonic() - t_start
        print("\nbrowser timings (s):", json.dumps({k: round(v, 2) for k, v in timings.items()}))


def _trace_root(lab: Lab) -> Any:
    return lab.page.locator(".tv-root[data-mode=trace]").first


def test_graph_drawn_with_expected_collective_nodes(lab: Lab) -> None:
    root = _trace_root(lab)
    root.scroll_into_view_if_needed()
    drawn = root.locator("svg g.node.tv-kind-collectives")
    ids = sorted(drawn.evaluate_all("els => els.map(e => e.dataset.node)"))
    assert ids == lab.expected["collective_nodes"]
    groups = root.locator("svg g.node.tv-kind-group").evaluate_all("els => els.map(e => e.textContent)")
    for name in lab.expected["groups"]:
        assert any(name in g for g in groups), (name, groups)
    # Cell end -> graph visible, from the kernel's clock (printed by the cell) and the page's (same machine).
    out = lab.page.locator(".jp-OutputArea-output", has_text="cell_end_epoch_ms=").first.text_content()
    cell_end = float(re.search(r"cell_end_epoch_ms=([0-9.]+)", out).group(1))
    drawn_at = float(root.get_attribute("data-t-first-drawn"))
    lab.timings["cell_end_to_graph_ms"] = drawn_at - cell_end
    lab.timings["first_layout_ms"] = float(root.get_attribute("data-layout-ms"))
    print(
        f"\ncell end -> backward graph visible: {drawn_at - cell_end:.0f} ms "
        f"(layout {root.get_attribute('data-layout-ms')} ms)"
    )
    lab.shot("01-trace-view-backward", root)


def test_click_collective_shows_details(lab: Lab) -> None:
    root = _trace_root(lab)
    node = root.locator("svg g.node.tv-kind-collectives").first
    node.click()
    details = root.locator(".tv-details[data-kind=collectives]")
    details.wait_for(timeout=10_000)
    text = details.text_content()
    assert "reduce_scatter" in text and "grad of " in text, text[:500]
    # The chosen op's full trace line and its ledger row (bytes, group, wait distance).
    row = details.locator(".tv-ledger-row tr", has_text="bytes (this rank)").locator("td").nth(1).inner_text()
    assert "group size" in details.locator(".tv-ledger-row").text_content()
    assert re.fullmatch(r"\d+ B|\d+\.\d (KiB|MiB|GiB)", row), row  # no raw byte count beside it
    assert root.locator("svg g.tv-selected").count() == 1
    lab.shot("02-collective-details", root)


def test_search_finds_parameter_all_gather(lab: Lab) -> None:
    root = _trace_root(lab)
    root.locator("select.tv-trace").select_option("forward")
    root.locator(".tv-pane-title", has_text="forward").wait_for(timeout=20_000)
    root.locator("input.tv-search").fill("blocks.1.mlp_fc.weight")
    exp = lab.expected["all_gather"]
    item = root.locator(".tv-match-item", has_text="all_gather blocks.1.mlp_fc.weight")
    item.wait_for(timeout=20_000)
    # The list and the marks come from the same update, but a redraw may still be landing: poll briefly.
    marked: list[str] = []
    for _ in range(50):
        marked = root.locator("svg g.node.tv-match").evaluate_all("els => els.map(e => e.dataset.node)")
        if sorted(marked) == lab.expected["match_nodes"]:
            break
        time.sleep(0.1)
    assert sorted(marked) == lab.expected["match_nodes"], (marked, root.locator(".tv-pane-title").text_content())
    assert exp["node"] in marked
    item.click()
    hit = root.locator(f".tv-details tr.tv-hit[data-index='{exp['index']}']")
    hit.wait_for(timeout=10_000)
    assert "blocks.1.mlp_fc.weight" in hit.text_content()
    lab.shot("03-search-all-gather", root)


def test_expand_block_stays_responsive(lab: Lab) -> None:
    root = _trace_root(lab)
    root.locator("input.tv-search").fill("")
    root.locator("select.tv-trace").select_option("backward")
    root.locator(".tv-pane-title", has_text="backward").wait_for(timeout=20_000)
    before = int(root.get_attribute("data-drawn"))
    lab.page.evaluate("window.__longtasks = []")
    group = root.locator("svg g.node.tv-kind-group", has_text="blocks.0").first
    t0 = time.monotonic()
    group.dblclick()
    root.locator("svg g.node.tv-kind-op").nth(50).wait_for(timeout=30_000)
    lab.timings["expand_block_ms"] = (time.monotonic() - t0) * 1000
    assert int(root.get_attribute("data-drawn")) > before
    assert root.locator("svg g.cluster").count() == 1
    longest = lab.page.evaluate("Math.max(0, ...window.__longtasks.map(t => t[1]))")
    lab.timings["expand_longest_task_ms"] = longest
    drawn = lab.timings["expand_block_ms"]
    print(f"\nexpand blocks.0: {drawn:.0f} ms to drawn, longest main-thread task {longest:.0f} ms")
    lab.shot("04-expanded-block", root)


def test_panels_show_decisions_ledger_and_memory(lab: Lab) -> None:
    root = _trace_root(lab)
    root.locator("button.tv-tab[data-tab=decisions]").click()
    text = root.locator(".tv-panel").text_content()
    for d in lab.expected["decisions"]:
        assert str(d.action) in text and d.reason[:40] in text, (d, text[:400])
    root.locator("button.tv-tab[data-tab=ledger]").click()
    ledger = root.locator(".tv-panel .tv-ledger")
    assert "Ranks 0, 1 issue the same" in ledger.locator(".tv-ok").text_content()
    assert ledger.locator("tbody tr").count() == lab.expected["ledger_rows"]
    root.locator("button.tv-tab[data-tab=memory]").click()
    assert root.locator(".tv-panel .tv-memory-ranks tbody tr").count() == 2  # one row per rank
    lab.shot("05-panels-memory", root)
    root.locator("button.tv-tab[data-tab=ledger]").click()
    lab.shot("06-panels-ledger", root)


def test_memory_view_bars_budget_and_saved_tensors(lab: Lab) -> None:
    """The Memory tab of a view given a plan and thunder-vs-eager: one stacked bar per candidate (a segment per
    category), the budget line where the plan put it, the saved-for-backward tables and the lines where thunder saves
    more, all as the model computed them."""
    exp = lab.expected["memory"]
    root = lab.page.locator(".tv-root[data-mode=trace]").nth(4)  # the memory view
    root.scroll_into_view_if_needed()
    root.locator("button.tv-tab[data-tab=memory]").click()
    view = root.locator(".tv-panel .tv-memory")
    view.wait_for(timeout=20_000)
    bars = view.locator("svg.tv-memory-bars g.tv-membar")
    assert bars.evaluate_all("els => els.map(e => e.dataset.label)") == [b["label"] for b in exp["bars"]]
    for i, bar in enumerate(exp["bars"]):
        segs = (
            bars.nth(i)
            .locator("rect.tv-memseg")
            .evaluate_all("els => els.map(e => [e.dataset.category, Number(e.dataset.bytes)])")
        )
        assert segs == [[s["category"], s["bytes"]] for s in bar["segments"]], bar["label"]
        assert bars.nth(i).get_attribute("data-total") == str(bar["total"])
    # The budget line sits between the bar that does not fit and the one that does.
    line = view.locator("line.tv-budget")
    assert line.get_attribute("data-bytes") == str(exp["budget"])
    x_budget = float(line.get_attribute("x1"))
    for i, bar in enumerate(exp["bars"]):
        box = bars.nth(i).locator("rect.tv-memseg").last
        right = float(box.get_attribute("x")) + float(box.get_attribute("width"))
        assert (right <= x_budget + 0.5) == bar["fits"], (bar["label"], right, x_budget)
    tables = view.locator("table.tv-table")
    assert tables.nth(0).locator("tbody tr").count() == len(exp["saved_by_group"])
    assert tables.nth(1).locator("tbody tr").count() == len(exp["saved_by_line"])
    assert view.locator(".tv-eager-summary").text_content() == exp["eager"]["summary"]
    more = [c["line"] for c in exp["eager"]["lines"] if c["extra"] > 0]
    assert more, "thunder saves more than eager somewhere on this GPT (THUNDER_NOTES: 1.8x), or the check means nothing"
    shown = view.locator("tr.tv-eager-row.tv-more td:first-child").evaluate_all("els => els.map(e => e.textContent)")
    assert shown == more
    lab.shot("07-memory-view", root)


def test_compare_summary_and_diff_marks(lab: Lab) -> None:
    """DDP against ZERO2 (the tutorial's model, default buckets): the summary, every outline on both sides, and
    one zoom for both panes."""
    root = lab.page.locator(".tv-root[data-mode=compare]").nth(1)
    root.scroll_into_view_if_needed()
    summary = root.locator(".tv-summary").text_content()
    assert summary == lab.expected["summary"]
    # DDP's one gradient bucket all-reduced, against ZERO2's five reduce-scattered (root + 4 blocks), each waited on
    assert lab.expected["delta"] == lab.expected["counted_delta"] == {"all_reduce": -1, "reduce_scatter": 5, "wait": 4}
    assert "+5 reduce_scatter" in summary and "+4 wait" in summary and "\u22121 all_reduce" in summary
    panes = root.locator(".tv-graph")
    assert panes.count() == 2
    # every outline as the model computed it (viewdata.pane_data), on both sides
    for i, marks in enumerate(lab.expected["ddp_compare_marks"]):
        drawn = panes.nth(i).locator("g[data-diff]").evaluate_all(_DIFF_MARKS_JS)
        assert dict(drawn) == marks and marks, (i, drawn, marks)
    assert panes.nth(1).locator("g.tv-diff-add, g.tv-diff-chg").count() > 0
    assert panes.nth(0).locator("g.tv-diff-rem, g.tv-diff-chg").count() > 0
    # Synced zoom: zooming once changes both panes' view by the same factor.
    vb = lambda: [p.locator("svg").get_attribute("viewBox") for p in panes.all()]  # noqa: E731
    before = vb()
    root.locator("button[title='zoom in']").click()
    after = vb()
    ratios = [float(b.split()[2]) / float(a.split()[2]) for a, b in zip(before, after, strict=True)]
    assert ratios[0] == pytest.approx(1 / 1.4, rel=1e-3) and ratios[1] == pytest.approx(1 / 1.4, rel=1e-3), ratios
    lab.shot("07-compare-ddp-vs-fsdp", root)


def test_markup_from_user_code_stays_text(lab: Lab) -> None:
    from tests.helpers.trace_fixtures import EVIL

    root = lab.page.locator(".tv-root[data-mode=trace]").nth(1)
    root.scroll_into_view_if_needed()
    assert EVIL in root.locator(".tv-title").text_content()
    op = root.locator("svg g.node.tv-kind-op", has_text="where").first  # relu, from the line that carries the markup
    op.click()
    source = root.locator(".tv-source pre").first
    source.wait_for(timeout=10_000)
    assert EVIL in source.text_content()  # shown as the literal characters ...
    assert root.locator("script, iframe, foreignObject").count() == 0  # ... and never became elements
    assert not [e for e in lab.errors if e.startswith("dialog")]
    lab.shot("08-markup-stays-text", root)


# ---------------------------------------------------------------------------------------------- the timeline widget

# Concurrent collectives overlap in the communication row: a point where this rectangle is the one on top.
_VISIBLE_POINT = """
(el) => {
  const b = el.getBoundingClientRect();
  for (let x = b.left + 1; x < b.right; x += 1) {
    if (document.elementFromPoint(x, b.top + b.height / 2) === el) return [x, b.top + b.height / 2];
  }
  return null;
}
"""


def _timeline_root(lab: Lab) -> Any:
    root = lab.page.locator(".tl-root").first
    root.scroll_into_view_if_needed()
    return root


def test_timeline_has_a_lane_per_rank_and_names_the_slowed_rank(lab: Lab) -> None:
    root = _timeline_root(lab)
    assert root.locator("g.tl-lane").evaluate_all("els => els.map(e => e.dataset.rank)") == ["0", "1"]
    for rank in ("0", "1"):
        assert root.locator(f"g.tl-lane[data-rank='{rank}'] rect.tl-coll").count() > 0
    assert root.locator(".tl-summary .tl-line").first.inner_text().startswith("Straggler: rank 1 arrived last")
    labels = root.locator("text.tl-row-label").evaluate_all("els => els.map(e => e.textContent)")
    assert labels == ["steps", "compute by module", "main thread", "collectives"] * 2
    assert root.locator("line.tl-step-marker").count() >= 1
    lab.shot("09-timeline", root)


def test_timeline_click_on_a_collective_shows_every_ranks_arrival(lab: Lab) -> None:
    root = _timeline_root(lab)
    worst = lab.expected["timeline_worst"]
    point = None
    for rank in ("0", "1"):  # the rank that waited has a long span; the late rank's may lie under the next one
        rect = root.locator(f"g.tl-lane[data-rank='{rank}'] rect.tl-coll[data-key='{worst['key']}']").first
        point = point or rect.evaluate(_VISIBLE_POINT)
    assert point is not None, f"collective {worst['key']} is hidden under others on both ranks"
    lab.page.mouse.click(point[0], point[1])
    root.locator(".tl-details-title").wait_for(timeout=10_000)
    assert root.locator(".tl-details-title").inner_text() == worst["label"]
    assert root.locator(".tl-arrivals tr[data-rank]").count() == 2
    last = root.locator(".tl-arrivals tr.tl-last")
    assert last.get_attribute("data-rank") == "1" and "arrived last" in last.inner_text()
    assert root.locator(".tl-message").inner_text() == worst["message"]
    # the ledger row's size as every view prints one (it read 221952)
    heads = root.locator(".tl-ledger th").evaluate_all("els => els.map(e => e.textContent)")
    cells = root.locator(".tl-ledger td").evaluate_all("els => els.map(e => e.textContent)")
    shown = dict(zip(heads, cells, strict=True))["bytes"]
    assert shown == worst["bytes"] and re.fullmatch(r"\d+ B|\d+\.\d (KiB|MiB|GiB)", shown), shown
    lab.shot("10-timeline-arrivals", root)


def test_the_timeline_breakdown_reads_in_words_and_milliseconds(lab: Lab) -> None:
    """The static picture's per-rank breakdown: headings in words with their unit (it read ``step_time (ms)``) and
    each time as every duration is printed, one decimal, two below 1 ms (it read 242.079 and 0.008)."""
    from thunderviz.render.timeline_svg import BREAKDOWN_COLUMNS

    table = lab.page.locator(".thunderviz-timeline-static table.thunderviz-breakdown").first
    table.scroll_into_view_if_needed()
    heads = table.locator("th").evaluate_all("els => els.map(e => e.textContent)")
    assert [h.removesuffix(" (ms)") for h in heads] == list(BREAKDOWN_COLUMNS.values()), heads
    assert not any("_" in h for h in heads) and sum(h.endswith(" (ms)") for h in heads) == len(heads) - 2
    rows = table.locator("tbody tr").evaluate_all("els => els.map(e => [...e.cells].map(c => c.textContent))")
    assert [r[0] for r in rows] == ["0", "1"]
    times = [c for r in rows for c in r[2:]]
    assert times and all(re.fullmatch(r"-?[1-9]\d*\.\d|-?0\.\d\d", t) for t in times), times
    lab.shot("11b-timeline-breakdown", table)


def test_a_graph_node_outlines_its_spans_on_the_timeline(lab: Lab) -> None:
    graph = lab.page.locator(".tv-root[data-mode=trace]").nth(2)  # the graph of the timeline's own run
    graph.scroll_into_view_if_needed()
    graph.locator("svg g.node.tv-kind-group", has_text="blocks.0").first.click()
    root = _timeline_root(lab)
    n = lab.expected["timeline_block_spans"]
    root.locator(".tl-group", has_text=f"blocks.0: {n} span(s) outlined").wait_for(timeout=20_000)
    for rank in ("0", "1"):
        assert root.locator(f"g.tl-lane[data-rank='{rank}'] rect.tl-hl").count() > 0
    lab.shot("11-timeline-graph-node-spans", root)


# ------------------------------------------------------------------------------------------------------- at a glance


def _tutorial_view(lab: Lab) -> Any:
    root = lab.page.locator(".tv-root[data-mode=trace]").nth(3)  # the tutorial's model, ZERO3, backward
    root.scroll_into_view_if_needed()
    return root


def _min_text(root: Any) -> float:
    return float(root.evaluate(_MIN_TEXT_JS))


def test_report_styles_stay_in_their_box_and_its_tables_are_left_aligned(lab: Lab) -> None:
    """A report in the notebook must not restyle markdown, stream output or the page (it set pre's max-height and
    background, h2's underline and body's max-width); and JupyterLab must not right-align or centre its tables."""
    page = lab.page
    report = page.locator("div.thunderviz-report.tv-report", has_text="zero3: thunder_fsdp (FSDP ZERO3 BLOCK)").first
    report.scroll_into_view_if_needed()
    probe = """() => {
      const props = ['background-color', 'max-height', 'border-bottom-width', 'border-bottom-style', 'font-size',
                     'font-family', 'margin-top', 'padding-top', 'text-align', 'color', 'overflow-x', 'max-width'];
      const pick = (el) => {
        const cs = getComputedStyle(el);
        return Object.fromEntries(props.map(k => [k, cs.getPropertyValue(k)]));
      };
      const md = [...document.querySelectorAll('.jp-RenderedMarkdown')]
        .find(e => e.textContent.includes('Styles stay in their box'));
      const out = [...document.querySelectorAll('.jp-OutputArea-output pre')]
        .find(e => e.textContent.includes('a stream output line'));
      return {
        h2: pick(md.querySelector('h2')), p: pick(md.querySelector('p')),
        h1: pick(document.querySelector('.jp-RenderedMarkdown h1')), stream: pick(out), body: pick(document.body),
        sheets: document.querySelectorAll('div.thunderviz-report style').length,
      };
    }"""
    toggle = "(on) => document.querySelectorAll('div.thunderviz-report style').forEach(s => { s.disabled = !on; })"
    with_ours = page.evaluate(probe)
    page.evaluate(toggle, False)
    try:
        without = page.evaluate(probe)
    finally:
        page.evaluate(toggle, True)
    assert with_ours["sheets"] >= 1  # the report did bring its stylesheet
    for part in ("h1", "h2", "p", "stream", "body"):
        assert with_ours[part] == without[part], (part, with_ours[part], without[part])
    cells = report.locator("td:not(.num), th").evaluate_all(
        "els => els.slice(0, 40).map(e => getComputedStyle(e).textAlign)"
    )
    assert cells and set(cells) <= {"left", "start"}, cells  # numbers (td.num) are right-aligned on purpose
    offsets = report.locator("table").evaluate_all(
        "els => els.map(t => t.getBoundingClientRect().left - t.parentElement.getBoundingClientRect().left)"
    )
    assert offsets and max(offsets) < 2, offsets  # not centred
    lab.shot("12-run-report", report)


def test_graph_text_stays_readable_at_the_default_and_at_fit(lab: Lab) -> None:
    """Text >= 11 px in the trace views and in both panes of each comparison, as drawn and after "fit"."""
    roots = [
        ("trace view, 1,451-op FSDP backward", _trace_root(lab)),
        ("trace view, tutorial model", _tutorial_view(lab)),
        ("compare ZERO2 vs ZERO3", lab.page.locator(".tv-root[data-mode=compare]").nth(0)),
        ("compare DDP vs FSDP", lab.page.locator(".tv-root[data-mode=compare]").nth(1)),
    ]
    seen = {}
    for name, root in roots:
        root.scroll_into_view_if_needed()
        root.locator("button[title='zoom in']").click()
        root.locator("button.tv-btn", has_text="fit").click()
        at_fit = _min_text(root)
        for _ in range(6):  # zooming out stops where text would get smaller than that
            root.locator("button[title='zoom out']").click()
        zoomed_out = _min_text(root)
        seen[name] = (at_fit, zoomed_out)
        assert at_fit >= MIN_TEXT_PX - 0.05 and zoomed_out >= MIN_TEXT_PX - 0.05, (name, at_fit, zoomed_out)
        assert float(root.get_attribute("data-min-text-px")) >= MIN_TEXT_PX - 0.05
        root.locator("button.tv-btn", has_text="fit").click()
    print("\nsmallest text (px) at fit / zoomed out:", {k: (round(a, 1), round(b, 1)) for k, (a, b) in seen.items()})


def test_comparisons_name_the_runs_and_their_configuration_with_a_legend(lab: Lab) -> None:
    for i, exp in enumerate(lab.expected["compares"]):
        root = lab.page.locator(".tv-root[data-mode=compare]").nth(i)
        root.scroll_into_view_if_needed()
        assert root.locator(".tv-title").inner_text() == exp["title"]
        assert root.locator(".tv-summary").inner_text() == exp["summary"]
        titles = root.locator(".tv-pane-title").evaluate_all("els => els.map(e => e.textContent)")
        assert [t.split(" \u2014 ")[0] for t in titles] == exp["panes"]
        assert root.locator(".tv-verdict").inner_text() == exp["verdict"]
        legend = root.locator(".tv-legend").inner_text()
        a, b = exp["runs"]
        assert f"added: only in {b}" in legend and f"removed: only in {a}" in legend and "changed: in both" in legend
        assert "\u22120" not in exp["summary"] and "~0" not in exp["summary"]
        # The panes sit side by side only where both fit their half readably (at a notebook's width: one above the
        # other), so every word names a run, never a side: the legend, and each search hit (it said "left: ...")
        assert root.get_attribute("data-arrangement") in ("side-by-side", "stacked")
        root.locator("input.tv-search").fill("wait")
        root.locator(".tv-match-item").first.wait_for(timeout=20_000)
        hits = root.locator(".tv-match-item").evaluate_all("els => els.map(e => e.textContent)")
        assert {h.split(": ", 1)[0] for h in hits} == {a, b}, hits
        assert not re.search(r"\b(left|right)\b", legend + " ".join(hits)), (legend, hits)
        root.locator("input.tv-search").fill("")
        lab.shot(f"{14 + i:02d}-compare-{'zero2-vs-zero3' if i == 0 else 'ddp-vs-fsdp'}", root)
    first = lab.expected["compares"][0]
    assert first["title"] == "zero2: FSDP ZERO2 BLOCK vs zero3: FSDP ZERO3 BLOCK"
    assert "saved tensors (trace)" in first["summary"]
    assert first["verdict"].startswith("zero3 sends ") and "bytes per step" in first["verdict"]


def test_compare_zero2_zero3_one_scale_whole_at_fit_and_says_what_changed(lab: Lab) -> None:
    """Both panes on one scale; at "fit" every node whole inside its pane; outlines only on what was
    added or changed (ZERO2's and ZERO3's blocks are changed, not "only in the right run"), and clicking a changed
    block lists the ops added to it."""
    exp = lab.expected["zero_compare"]
    root = lab.page.locator(".tv-root[data-mode=compare]").nth(0)
    root.scroll_into_view_if_needed()
    root.locator("button[title='zoom in']").click()
    root.locator("button.tv-btn", has_text="fit").click()
    panes = root.evaluate(_PANE_GEOMETRY_JS)
    print(f"\nZERO2 vs ZERO3 at fit ({root.get_attribute('data-arrangement')}):", panes)
    assert len(panes) == 2 and all(p["nodes"] > 5 for p in panes)
    assert panes[1]["scale"] == pytest.approx(panes[0]["scale"], rel=1e-3), panes  # one scale
    assert [p["cut"] for p in panes] == [[], []], panes  # no node cut at a pane's edge
    assert _min_text(root) >= MIN_TEXT_PX - 0.05  # and still readable
    graphs = root.locator(".tv-graph")
    for i, marks in enumerate(exp["marks"]):
        drawn = graphs.nth(i).locator("g[data-diff]").evaluate_all(_DIFF_MARKS_JS)
        assert dict(drawn) == marks, (i, drawn, marks)
    blocks = (
        graphs.nth(1)
        .locator("g.node.tv-kind-group", has_text="blocks.")
        .evaluate_all("els => els.map(e => e.dataset.diff)")
    )
    assert blocks == ["changed"] * 4, blocks
    assert graphs.nth(0).locator("g.tv-diff-add").count() == 0
    added = graphs.nth(1).locator("g.tv-diff-add").evaluate_all("els => els.map(e => e.textContent)")
    assert added and all("all_gather" in t for t in added), added
    lab.shot("21-compare-zero2-vs-zero3-at-fit", root)
    root.locator(f".tv-graph[data-pane='1'] g.node[data-node='{exp['block']['node']}']").click()
    box = root.locator(".tv-details .tv-change[data-status=changed]")
    box.wait_for(timeout=10_000)
    assert box.locator(".tv-change-head").inner_text() == "blocks.0: in both runs, changed from zero2 to zero3"
    rows = box.locator("tr.tv-change-op").evaluate_all("els => els.map(e => [...e.cells].map(c => c.textContent))")
    assert {r[1]: int(r[2]) for r in rows} == exp["block"]["ops_added"] and {r[0] for r in rows} == {"added in zero3"}
    lab.shot("22-compare-changed-block-details", root.locator(".tv-details"))


def test_tutorial_trace_view_reads_at_a_glance(lab: Lab) -> None:
    """Headline decisions with the reasoning a click away, titled memory columns in KiB/MiB, a 'no matches' line,
    friendly trace names, and a block that opens readably."""
    root = _tutorial_view(lab)
    exp = lab.expected["tutorial_view"]
    assert root.locator(".tv-title").inner_text() == exp["title"]
    lab.shot("13-tutorial-trace-view", root)
    root.locator("button.tv-tab[data-tab=decisions]").click()
    summaries = root.locator("details.tv-decision summary .tv-headline").evaluate_all(
        "els => els.map(e => e.textContent)"
    )
    # how it jits (the executors), then where it shards
    assert summaries == exp["headlines"] and summaries[0].startswith("executors: ")
    assert summaries[1].startswith("case 1: jit once, then shard - ZERO3")
    reason = root.locator("details.tv-decision .tv-reason").nth(1)
    assert not reason.is_visible()
    root.locator("details.tv-decision summary").nth(1).click()
    assert reason.is_visible() and "communication: BLOCK bucketing" in reason.inner_text()
    lab.shot("16-decisions-headline-and-reasoning", root)
    root.locator("button.tv-tab[data-tab=memory]").click()
    heads = root.locator(".tv-memory-ranks th").evaluate_all("els => els.map(e => e.textContent)")
    assert heads[0] == "rank" and [h.replace(" (measured)", "") for h in heads[1:]] == exp["memory_titles"]
    cells = root.locator(".tv-memory-ranks tbody td").evaluate_all("els => els.map(e => e.textContent)")
    assert len(cells) == 2 * len(heads)  # every rank filled
    assert all(re.fullmatch(r"\d+|\d+(\.\d)? (B|KiB|MiB|GiB)", c) for c in cells), cells  # no raw byte counts
    lab.shot("17-memory-tab", root)
    names = root.locator("select.tv-trace option").evaluate_all("els => els.map(o => [o.value, o.textContent])")
    assert dict(names) == exp["trace_names"] and exp["trace_names"]["backward"] == "backward (the trace that runs)"
    root.locator("input.tv-search").fill("no_such_tensor_anywhere")
    miss = root.locator(".tv-no-match")
    miss.wait_for(timeout=20_000)
    assert "no matches for \u201cno_such_tensor_anywhere\u201d in the backward trace" in miss.inner_text()
    lab.shot("18-search-no-matches", root)
    root.locator("input.tv-search").fill("")
    before = int(root.get_attribute("data-drawn"))
    root.locator("svg g.node.tv-kind-group", has_text="blocks.2").first.dblclick()
    root.locator("svg g.cluster").first.wait_for(timeout=30_000)
    for _ in range(100):
        if int(root.get_attribute("data-drawn")) > before:
            break
        time.sleep(0.1)
    assert _min_text(root) >= MIN_TEXT_PX - 0.05
    pane = root.locator(".tv-graph").first.bounding_box()
    cluster = root.locator("svg g.cluster").first.bounding_box()
    # the opened block is shown from its top, across the pane (not its first few ops blown up)
    assert cluster["y"] <= pane["y"] + pane["height"] * 0.2 and cluster["width"] <= pane["width"] * 1.05, (
        pane,
        cluster,
    )
    lab.shot("19-expanded-block-readable", root)
    before = int(root.get_attribute("data-drawn"))
    root.locator("button.tv-btn", has_text="collapse all").click()
    for _ in range(100):
        if int(root.get_attribute("data-drawn")) > before:
            break
        time.sleep(0.1)
    # collapsing fits the smaller graph (it stayed at the open block's zoom: one node filled the pane)
    svg = root.locator("svg.tv-svg").first
    collapsed = svg.get_attribute("viewBox")
    root.locator("button.tv-btn", has_text="fit").click()
    assert svg.get_attribute("viewBox") == collapsed


def test_fusion_regions_sit_where_their_modules_are_and_open_in_place(lab: Lab) -> None:
    """The forward of a torchcompile run: the region running the last block's MLP, ln_f and lm_head is one node named
    for what it spans (it read "lm_head · 1 op · 1 TorchCompile5", with no ln_f anywhere); search finds ln_f in it;
    a double-click opens it to its ops, framed by module."""
    root = lab.page.locator(".tv-root[data-mode=trace]").nth(5)  # the tour's last cell
    root.scroll_into_view_if_needed()
    groups = root.locator("svg g.node.tv-kind-group").evaluate_all("els => els.map(e => e.textContent)")
    span = next((g for g in groups if "blocks.1 -> lm_head" in g), None)
    assert span is not None and "spans blocks.1, ln_f, lm_head" in span and "1 op" not in span, groups
    root.locator("input.tv-search").fill("ln_f")
    root.locator(".tv-match-item").first.wait_for(timeout=20_000)
    hits = root.locator(".tv-match-item").evaluate_all("els => els.map(e => e.textContent)")
    assert any("blocks.1 -> lm_head" in h for h in hits), hits
    root.locator("input.tv-search").fill("")
    before = int(root.get_attribute("data-drawn"))
    root.locator("svg g.node.tv-kind-group", has_text="blocks.1 -> lm_head").first.dblclick()
    region = root.locator("svg g.cluster.tv-kind-region")
    region.first.wait_for(timeout=30_000)
    assert int(root.get_attribute("data-drawn")) > before
    frames = root.locator("svg g.cluster").evaluate_all(
        "els => els.map(e => [...e.querySelectorAll('text')].filter(t => t.closest('g.node, g.cluster') === e)"
        ".map(t => t.textContent).join(' '))"
    )
    assert {"blocks.1", "ln_f", "lm_head"} <= set(frames), frames  # a frame per module inside the region
    assert root.locator("svg g.node.tv-kind-op").count() > 50  # the region's ops, each a node
    lab.shot("23-fusion-region-opened", root)
    root.locator("button.tv-btn", has_text="collapse all").click()


def test_status_chips_tick_while_a_rank_is_starting(lab: Lab) -> None:
    chip = lab.page.locator(".tv-ranks", has_text="still starting").locator(".tv-rank").first
    chip.scroll_into_view_if_needed()
    first = chip.text_content()
    time.sleep(1.2)
    later = chip.text_content()
    assert first.startswith("rank 0: starting \u00b7 ") and later != first, (first, later)
    seconds = [float(re.search(r"([0-9.]+) s$", t).group(1)) for t in (first, later)]
    assert seconds[1] - seconds[0] >= 0.8, seconds
    lab.shot("20-status-ticking", lab.page.locator(".tv-ranks", has_text="still starting").first)


def test_rank_status_and_no_console_errors(lab: Lab) -> None:
    chips = lab.page.locator(".tv-rank").evaluate_all("els => els.map(e => e.dataset.state)")
    assert chips[-2:] == ["done", "done"]
    # The chips changed while the cell was still running: each rank was seen running before done.
    seen = [tuple(x) for x in lab.page.evaluate("window.__rankStates")]
    for r in ("0", "1"):
        states = [st for rank, st in seen if rank == r]
        assert "running" in states and states.index("running") < states.index("done"), seen
    assert lab.errors == [], "\n".join(lab.errors)
    print("\nbrowser timings:", json.dumps({k: round(v, 2) for k, v in lab.timings.items()}))


#: The tour's cell that shows the same view as each of the docs' pictures (``docs/screenshots.py`` SHOTS).
_SHOT_CELLS = {
    "trace-view": 'TraceView(zero3, trace="backward")',
    "compare-zero2-zero3": 'compare(zero2, zero3, trace="backward")',
    "timeline": "timeline_view = TimelineView(",
    "memory-plan": "memory_view = TraceView(",
    "which-strategy": "compare_runs(zero2, zero3, ddp)",
}


def test_the_docs_screenshot_script_still_pictures_every_view(lab: Lab, tmp_path: Path) -> None:
    """``docs/screenshots.py`` takes the docs' pictures with ``shoot`` over the tutorial; the same ``shoot`` over the
    tour's outputs of the same views must still give a picture of each (its size and more than a handful of colours,
    not pixel equality), so a change to a view that breaks a picture fails here, not when the docs are next shot.
    Runs last: it presses "fit" and opens tabs."""
    sys.path.insert(0, str(REPO / "docs"))
    import screenshots

    tour = json.loads((HERE / "widgets_tour.ipynb").read_text())
    assert set(_SHOT_CELLS) == {shot.name for shot in screenshots.SHOTS}, "a docs picture has no tour cell here"
    for shot in screenshots.SHOTS:
        path = screenshots.shoot(lab, shot, screenshots.cell_index(tour, _SHOT_CELLS[shot.name]), tmp_path)
        width, height, distinct = screenshots.png_facts(path.read_bytes())
        assert width >= 300 and height >= 150 and distinct > 16, (shot.name, width, height, distinct)
