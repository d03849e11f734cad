"""The Memory view's static HTML: one bar per candidate with a segment per category, the budget line, and the
run report's predicted-vs-measured table with process RSS last."""

from __future__ import annotations

import re

import pytest

from tests.helpers.plans import synthetic_plan
from thunderviz.render.memory_view import MemoryBar, plan_bars, plan_html, plan_run_bars, run_bars, run_memory_html
from thunderviz.render.strategy_table import strategy_table_html
from thunderviz.reports.strategy_table import StrategyGroup, StrategyRow, StrategyTable
from thunderviz.trace.memory import ACCOUNT, COLORS, LEGEND, StepMemory


def test_plan_bars_and_budget_line() -> None:
    plan = synthetic_plan({"ddp": 4000, "fsdp-zero2-block": 3000, "fsdp-zero3-layer": 2000}, budget=3500)
    bars = plan_bars(plan)
    assert [b.label for b in bars] == ["ddp x2", "fsdp-zero2-block x2", "fsdp-zero3-layer x2"]
    assert [b.fits for b in bars] == [False, True, True] and [b.total for b in bars] == [4000, 3000, 2000]
    assert bars[0].segments == (("parameters", 1000), ("saved for backward", 3000))
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
            parts={"parameters": 2500, "gradients": 0, "saved for backward": 7500, "temporaries": 100},
        ),
        1: StepMemory(None, "memtracker", note="no step was measured"),
    }
    html = run_memory_html(measured, {0: {"rss_bytes": 3 * 2**20}, 1: {"rss_bytes": 2**20}}, predicted, "x2")
    headers = re.findall(r"<th>([^<]*)</th>", html)
    assert headers[0:4] == ["rank", "step peak, measured", "measured with", "step peak, predicted"]
    assert headers[-1] == "process RSS (not tensor memory)"
    assert "within 10%" in html and "no step was measured" in html and "3.0 MiB" in html
    # one definition of "step peak", folded (it is a definition, not news), and what each side can tell apart
    note = re.search(r"<details class='note'><summary>What .step peak. means</summary><p>([^<]*)</p></details>", html)
    assert note and html.count("most tensor bytes alive at once") == 1 and "only" in note[1], html
    assert len(note[1]) < 420 and "cannot tell them apart" in note[1]
    assert "<td>memtracker, steps 2-3</td>" in html  # which steps the peak was measured on
    bars = run_bars(measured, predicted, "x2")
    assert [b.kind for b in bars] == ["predicted", "measured"]  # rank 1 measured nothing: no bar
    assert [c for c, _ in bars[0].segments] == ["parameters", "saved for backward"]  # the same account both sides
    assert [c for c, _ in bars[1].segments] == ["parameters", "saved for backward", "temporaries"]


def test_why_nothing_was_measured_is_said_once_when_every_rank_says_the_same() -> None:
    why = "no step was measured: a step ends when an optimizer's step() returns"
    measured = {r: StepMemory(None, "memtracker", note=why) for r in range(4)}
    html = run_memory_html(measured)
    escaped = why.replace("'", "&#x27;")
    assert html.count(escaped) == 1 and html.count("see below") == 4
    assert f"<p class='note'>Every rank: {escaped}</p>" in html


def _drawn(svg: str) -> list[tuple[str, str]]:
    """(category, fill) of every segment an SVG draws."""
    return re.findall(r"class='tv-memseg' data-category='([^']*)'[^>]*fill='([^']*)'", svg)


def test_every_bar_of_every_view_is_drawn_in_one_account_with_one_colour_each() -> None:
    """The Memory tab mixed two schemes (a prediction in MemTracker's groups next to the plan's
    categories, near-identical reds for "optimizer state" and "optimizer"), the DDP bar had no parameters and no
    bar had gradients. A plan's bars, a run's predicted and measured bars and compare_runs' table draw the same
    categories, in the same order, each in its own colour; anything else is refused."""
    rgb = {c: tuple(int(COLORS[c][i : i + 2], 16) for i in (1, 3, 5)) for c in (*ACCOUNT, "total")}
    close = [
        (a, b)
        for a in rgb
        for b in rgb
        if a < b and sum((x - y) ** 2 for x, y in zip(rgb[a], rgb[b], strict=True)) < 60**2
    ]
    assert close == [], close  # no two categories share, or nearly share, a colour
    plan = synthetic_plan({"ddp": 4000, "fsdp-zero3-layer": 2000})
    parts = {"parameters": 1000, "gradients": 1000, "optimizer state": 2000, "saved for backward": 500}
    measured = {0: StepMemory(4500, "memtracker", {"parameters": 1000}, (2, 3), parts=parts | {"temporaries": 0})}
    table = StrategyTable(
        (
            StrategyGroup(
                None,
                (
                    StrategyRow("ddp", "measured", "DDP", 2, 4500, measured[0].account),
                    StrategyRow("ddp (plan)", "planned", "ddp", 2, 4000, plan.candidates[0].memory.account),
                ),
            ),
        )
    )
    views = {
        "plan": plan_html(plan),
        "run": run_memory_html(measured, None, plan.candidates[0].memory, "ddp x2"),
        "compare_runs": strategy_table_html(table),
    }
    for name, svg in views.items():
        drawn = _drawn(svg)
        assert drawn and all(c in ACCOUNT and fill == COLORS[c] for c, fill in drawn), (name, drawn)
        legend = re.findall(
            r"<rect x='[0-9.]+' y='[0-9.]+' width='10' height='10' fill='[^']*'/><text[^>]*>([^<]*)<", svg
        )
        shown = [LEGEND.get(c, c) for c in ACCOUNT if c in {c for c, _ in drawn}]
        assert legend == shown, (name, legend)  # the account's order
    run = [c for c, _ in _drawn(views["run"])]
    assert run == [
        "parameters",
        "saved for backward",
        "parameters",
        "gradients",
        "optimizer state",
        "saved for backward",
    ]
    measured_row = [c for c, _ in _drawn(views["compare_runs"])][:4]
    assert measured_row == ["parameters", "gradients", "optimizer state", "saved for backward"]
    with pytest.raises(ValueError, match="not categories of the memory account"):
        MemoryBar("x", "measured", (("optimizer", 10),))  # MemTracker's group name: the second scheme
    with pytest.raises(ValueError, match="not categories of the memory account"):
        MemoryBar("x", "predicted", (("gathered parameters", 10),))  # a prediction's finer category


def _value_labels(svg: str) -> list[tuple[float, str]]:
    """(x, text) of every bar total an SVG writes (the labels that read as sizes)."""
    return [
        (float(x), text)
        for x, text in re.findall(r"<text x='([0-9.]+)' y='[0-9.]+'>([^<]*)</text>", svg)
        if re.fullmatch(r"[0-9.]+ (B|KiB|MiB|GiB)", text)
    ]


def test_the_budget_line_never_runs_through_a_bar_total() -> None:
    """A bar ending a little short of the budget had its total written across the dashed line."""
    plan = synthetic_plan({"ddp": 1_288_490, "fsdp-zero2-block": 1_050_000}, budget=1_100_000)
    svg = plan_html(plan)
    line = float(re.search(r"class='tv-budget' x1='([0-9.]+)'", svg).group(1))
    labels = _value_labels(svg)
    assert [t for _, t in labels] == ["1.2 MiB", "1.0 MiB"]
    for x, text in labels:
        assert not x - 2 < line < x + 6.4 * len(text) + 2, (text, x, line)
    assert labels[1][0] > line  # moved right of the line, not dropped


def test_a_run_with_its_plan_draws_every_candidate_against_the_budget_and_the_ranks_under_their_own() -> None:
    """The report of a --plan run drew only its own prediction; why DDP was not run (over the budget)
    never showed. Now the plan's candidates, each against the budget line, with the measured ranks under the
    candidate the run ran as."""
    plan = synthetic_plan({"ddp": 12_000, "fsdp-zero2-block": 10_000, "fsdp-zero3-layer": 8_000}, budget=11_000)
    parts = {"parameters": 2500, "gradients": 2500, "saved for backward": 4000, "temporaries": 900}
    measured = {
        r: StepMemory(9_900 + 2_000 * r, "memtracker", {}, (2, 3), parts=parts | {"temporaries": 900 + 2_000 * r})
        for r in (0, 1)
    }
    bars = plan_run_bars(plan, measured, "fsdp-zero2-block x2")
    assert [(b.label, b.kind, b.fits) for b in bars] == [
        ("ddp x2", "predicted", False),
        ("fsdp-zero2-block x2", "predicted", True),
        ("\u2514 rank 0, measured", "measured", True),
        ("\u2514 rank 1, measured", "measured", False),  # 11.9 KB measured: over the budget too
        ("fsdp-zero3-layer x2", "predicted", True),
    ]
    html = run_memory_html(measured, None, plan.candidates[1].memory, "fsdp-zero2-block x2", plan)
    assert html.count("class='tv-budget'") == 1 and "budget 10.7 KiB" in html
    assert "(ddp x2 over it)" in html and "recommended <b>fsdp-zero2-block x2</b>" in html
    assert html.count("\u2717") == 2 and html.count("\u2713") == 3
    # no candidate of that name (another world size): the ranks go last
    assert [b.kind for b in plan_run_bars(plan, measured, "ddp x4")][-2:] == ["measured", "measured"]
