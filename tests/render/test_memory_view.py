"""The Memory view's static HTML: one bar per candidate with a segment per category, the budget line, and the
run report's predicted-vs-measured table with process RSS last."""

from __future__ import annotations

import re

from tests.helpers.plans import synthetic_plan
from thunderviz.render.memory_view import plan_bars, plan_html, run_bars, run_memory_html
from thunderviz.trace.memory import StepMemory


def test_plan_bars_and_budget_line() -> None:
    plan = synthetic_plan({"ddp": 4000, "fsdp-zero2-block": 3000, "fsdp-zero3-layer": 2000}, budget=3500)
    bars = plan_bars(plan)
    assert [b.label for b in bars] == ["ddp x2", "fsdp-zero2-block x2", "fsdp-zero3-layer x2"]
    assert [b.fits for b in bars] == [False, True, True] and [b.total for b in bars] == [4000, 3000, 2000]
    assert bars[0].segments == (("parameters", 1000), ("saved activations", 3000))
    html = plan_html(plan)
    assert html.count("class='tv-memseg'") == 6 and "class='tv-budget'" in html
    assert "recommended: <b>fsdp-zero2-block x2</b>" in html  # least communication among those that fit
    # the budget line sits at 3500/4000 of the plot, right of the fitting bars' ends
    x = float(re.search(r"class='tv-budget' x1='([0-9.]+)'", html).group(1))
    assert abs(x - (190 + 3500 / 4000 * (640 - 190 - 76))) < 0.2


def test_bar_totals_and_the_budget_label_stay_inside_the_picture() -> None:
    """The longest bar's total and a budget near the right edge were cut off ("849", "budget 1")."""
    plan = synthetic_plan({"ddp": 1_288_490, "fsdp-zero2-block": 869_478}, budget=1_250_000)
    svg = plan_html(plan)
    width = float(re.search(r"<svg[^>]* width='(\d+)'", svg).group(1))
    for x, anchor, text in re.findall(
        r"<text x='([0-9.]+)' y='[0-9.]+'(?: fill='[^']*')?( text-anchor='end')?>([^<]*)<", svg
    ):
        right = float(x) if anchor else float(x) + 6.4 * len(text)
        assert right <= width, (text, x)
    assert "budget 1.2 MiB" in svg and "1.2 MiB" in svg and "849.1 KiB" in svg


def test_run_memory_section_puts_measured_first_and_rss_last() -> None:
    plan = synthetic_plan({"fsdp-zero2-block": 10_000})
    predicted = plan.candidates[0].memory
    measured = {
        0: StepMemory(
            10_100,
            "memtracker",
            {"parameters": 2500, "gradients": 0, "optimizer": 0, "activations and temporaries": 7600},
            (2, 3),
        ),
        1: StepMemory(None, "memtracker", note="no step was measured"),
    }
    html = run_memory_html(measured, {0: {"rss_bytes": 3 * 2**20}, 1: {"rss_bytes": 2**20}}, predicted, "x2")
    headers = re.findall(r"<th>([^<]*)</th>", html)
    assert headers[0:3] == ["rank", "measured step peak", "measured with"] and headers[-1] == "process RSS"
    assert "within 10%" in html and "no step was measured" in html and "3.0 MiB" in html
    bars = run_bars(measured, predicted, "x2")
    assert [b.kind for b in bars] == ["predicted", "measured"]  # rank 1 measured nothing: no bar
    assert [c for c, _ in bars[1].segments] == ["parameters", "activations and temporaries"]


def test_why_nothing_was_measured_is_said_once_when_every_rank_says_the_same() -> None:
    why = "no step was measured: a step ends when an optimizer's step() returns"
    measured = {r: StepMemory(None, "memtracker", note=why) for r in range(4)}
    html = run_memory_html(measured)
    escaped = why.replace("'", "&#x27;")
    assert html.count(escaped) == 1 and html.count("see below") == 4
    assert f"<p class='note'>Every rank: {escaped}</p>" in html
