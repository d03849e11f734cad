"""The static timeline picture: well-formed, escaped, one lane per rank, the trace graph's colours."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import pytest

from tests.helpers.timeline_runs import recorded
from thunderviz.render import graph_nodes as graph
from thunderviz.render.timeline_svg import (
    COLOURS,
    ROW_LABELS,
    common_span_us,
    split_blocked,
    timeline_html,
    timeline_svg,
)
from thunderviz.timeline.model import (
    CollectiveEvent,
    RankTimeline,
    Region,
    Segment,
    Timeline,
)

HOSTILE = '<script>alert("x")</script>&'


def _hostile_timeline() -> Timeline:
    ranks = []
    for r in range(2):
        c = CollectiveEvent(
            step=2,
            index=1,
            kind="all_gather",
            tensor=HOSTILE,
            issue_start=10.0 + r,
            issue_end=12.0 + r,
            start=13.0 + 40 * r,
            end=60.0,
            wait_start=55.0,
            wait_end=60.0,
            group=HOSTILE,
        )
        ranks.append(
            RankTimeline(
                rank=r,
                world_size=2,
                steps=[Region("step", 0.0, 100.0, 2)],
                regions=[Region("forward", 5.0, 90.0, 2, HOSTILE)],
                collectives=[c],
                segments=[Segment(HOSTILE, 20.0, 50.0, 2, "forward")],
                aligned=True,
            )
        )
    return Timeline.from_ranks(ranks, name=HOSTILE)


def test_names_from_user_code_are_escaped_and_the_svg_parses():
    tl = _hostile_timeline()
    svg = timeline_svg(tl)
    root = ET.fromstring(svg)  # well-formed XML, so nbconvert and GitHub can show it
    assert root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}g")) == 2
    page = timeline_html(tl)
    assert "<script>" not in svg and "<script>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in page


def test_rows_are_labelled_steps_marked_and_blocked_time_past_the_work_drawn_apart():
    """Unlabelled rows, no step markers, and a 'blocked' bar running past its collective's end."""
    steps = [Region("step", 0.0, 100.0, 2), Region("step", 100.0, 200.0, 3)]
    c = CollectiveEvent(
        step=2,
        index=1,
        kind="all_reduce",
        tensor="t",
        issue_start=10.0,
        issue_end=11.0,
        start=12.0,
        end=40.0,
        wait_start=20.0,
        wait_end=74.0,
    )
    assert split_blocked(c) == [(10.0, 11.0, False), (20.0, 40.0, False), (40.0, 74.0, True)]
    ranks = [RankTimeline(rank=r, world_size=2, steps=steps, collectives=[c], aligned=True) for r in (0, 1)]
    tl = Timeline.from_ranks(ranks)
    svg = timeline_svg(tl)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(f"{ns}text")]
    for label in ROW_LABELS:
        assert texts.count(label) == 2, (label, texts)  # every lane's rows say what they are
    assert texts.count("step 2") == 1 and texts.count("step 3") == 1
    assert len([ln for ln in root.iter(f"{ns}line") if ln.get("class") == "step-marker"]) == 2
    after = [r for r in root.iter(f"{ns}rect") if r.get("fill") == "url(#tv-after-work)"]
    assert len(after) == 2 and "after all_reduce #1 t (step 2) finished its work" in after[0].find(f"{ns}title").text
    assert root.get("width") == "1200" and all(float(t.get("font-size", "12")) >= 11 for t in root.iter(f"{ns}text"))
    # three hues a person tells apart, and a legend naming every colour the picture uses
    assert len({COLOURS["forward"], COLOURS["backward"], COLOURS["optimizer"]}) == 3
    page = timeline_html(tl)
    assert "still blocked after its work ended" in page and "where each step begins" in page
    # one scale for two runs: the shorter one drawn up to the longer one's end
    short = Timeline.from_ranks([RankTimeline(rank=0, world_size=1, steps=steps[:1], aligned=True)])
    assert common_span_us(tl, short) == 200.0
    assert "100 ms" not in timeline_svg(short) and ">0.2 ms<" in timeline_svg(short, t1=common_span_us(tl, short))


def test_collectives_use_the_trace_graphs_colours():
    assert COLOURS["collective"] in graph._COLLECTIVE_STYLE and COLOURS["collective_border"] in graph._COLLECTIVE_STYLE
    assert COLOURS["wait"] in graph._WAIT_STYLE and COLOURS["group"] in graph._GROUP_STYLE
    assert f'fill="{COLOURS["collective"]}"' in timeline_svg(_hostile_timeline())


@pytest.mark.timeout(600)
def test_a_real_run_draws_one_lane_per_rank_and_names_the_straggler():
    from thunderviz.timeline import load

    tl = load(*[r.path for r in recorded("fsdp")])
    svg = timeline_svg(tl)
    root = ET.fromstring(svg)
    lanes = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "rank"]
    assert [g.get("data-rank") for g in lanes] == ["0", "1"]
    assert len(svg) < 400_000  # merged busy intervals, not one rectangle per op
    assert "Straggler: rank 1 arrived last" in timeline_html(tl)


@pytest.mark.timeout(600)
def test_saved_rank_files_open_later_in_the_offline_page(tmp_path, capsys):
    """A torchrun job's per-rank files, rendered like trace files: ``thunderviz render --timeline FILES``."""
    from thunderviz.cli import main
    from thunderviz.render.html import render_html
    from thunderviz.timeline import load

    files = [r.path for r in recorded("fsdp")]
    page = render_html([], title="t", timeline=load(*files))
    assert "<h2>Timeline</h2>" in page and "Straggler: rank 1 arrived last" in page and "No traces." not in page
    with pytest.raises(TypeError, match=r"render_html\(timeline=...\): expected a thunderviz Timeline"):
        render_html([], timeline=files)
    out = tmp_path / "report.html"
    assert main(["render", "--timeline", *files, "--out", str(out), "--no-svg"]) == 0
    assert "Straggler: rank 1 arrived last" in out.read_text(encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["render", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "give trace files, --timeline files (one per rank), or both" in capsys.readouterr().err


def test_step_labels_of_short_steps_beside_long_ones_never_overlap():
    """The tutorial's DDP steps (622, 392, 33, 28 ms) printed "step 4" and "step 5" over each other: a label now fits
    between its marker and the next ("step 4", else "4", else the marker's tooltip alone)."""
    ends = [0.0, 622_000.0, 1_014_000.0, 1_047_000.0, 1_075_000.0]
    steps = [Region("step", a, b, n) for n, (a, b) in enumerate(itertools.pairwise(ends), start=2)]
    tl = Timeline.from_ranks([RankTimeline(rank=0, world_size=1, steps=steps, aligned=True)])
    root = ET.fromstring(timeline_svg(tl))
    ns = "{http://www.w3.org/2000/svg}"
    labels = [(float(t.get("x")), t.text) for t in root.iter(f"{ns}text") if t.get("y") == "29"]
    assert [text for _, text in labels] == ["step 2", "step 3", "4", "5"], labels
    markers = [ln.find(f"{ns}title").text for ln in root.iter(f"{ns}line") if ln.get("class") == "step-marker"]
    assert markers == ["step 2", "step 3", "step 4", "step 5"]  # each still named, on its marker
