"""The offline HTML report, the run report and the shared HTML pieces: content, self-containment, escaping, CLI."""

from __future__ import annotations

import re

import pytest

from tests.helpers import trace_fixtures as tf
from tests.helpers.trace_fixtures import EVIL, hostile_bundle
from tests.helpers.trace_scenarios import two_rank_run
from thunderviz.cell.protocol import StrategySpec
from thunderviz.cli import main
from thunderviz.parallel.decisions import Action, Case, Decision
from thunderviz.render.graph import dot_available
from thunderviz.render.html import Report, render_html
from thunderviz.render.markup import DECISION_COLUMNS, decisions_table, escape, page, table
from thunderviz.render.run_report import reports_page, run_report_html
from thunderviz.render.style import REPORT_CSS, ROOT, ROOT_CLASSES
from thunderviz.reports.run_report import RunReport
from thunderviz.trace.file import save
from thunderviz.trace.ledger import ledger_from_bundle

needs_dot = pytest.mark.skipif(not dot_available(), reason="Graphviz `dot` binary not installed")


@pytest.mark.parametrize("svg", [pytest.param(True, marks=needs_dot), False])
def test_markup_in_user_code_is_escaped_in_html(tmp_path, svg):
    b = hostile_bundle(tmp_path)
    decisions = [Decision(EVIL, Case.RAW_MODULE, Action.JIT_AND_DISTRIBUTE, "</td><script>x()</script>")]
    page = render_html([b], decisions=decisions, svg=svg)
    assert "<script>alert" not in page and "<script>x()" not in page
    assert page.count("<script") == 1  # ours, at the end
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;/td&gt;&lt;script&gt;x()&lt;/script&gt;" in page
    assert "# &lt;script&gt;alert(1)&lt;/script&gt; &quot;quoted&quot;" in page  # the recorded source line


@pytest.mark.parametrize("svg", [pytest.param(True, marks=needs_dot), False])
def test_html_is_self_contained(svg):
    page = render_html([tf.gpt().bundle, tf.function().bundle], svg=svg)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    assert ("<svg" in page) is svg
    assert "tiny-gpt" in page and "_mlp_loss" in page and "blocks.1" in page
    assert "Differences between jitted objects" in page  # two objects: a diff section


def test_report_repr_html_is_a_fragment():
    r = Report([tf.gpt().bundle], svg=False)
    frag = r._repr_html_()
    assert "<html" not in frag and "Overview" in frag and "tiny-gpt" in frag


def test_cli_render_writes_a_report_and_reports_bad_input(tmp_path, capsys):
    path = save(tf.gpt().bundle, tmp_path / "rank0.json")
    out = tmp_path / "sub" / "report.html"
    assert main(["render", str(path), "--out", str(out), "--no-svg"]) == 0
    assert "tiny-gpt" in out.read_text() and "wrote" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["render", str(bad), "--out", str(tmp_path / "x.html")]) == 1
    err = capsys.readouterr().err
    assert "thunderviz render:" in err and "bad.json" in err and "thunderviz.trace.file.save" in err
    with pytest.raises(SystemExit):
        main(["render"])  # argparse: TRACES is required


def test_cli_renders_all_ranks_files_into_one_report(tmp_path):
    ranks = two_rank_run()
    out = tmp_path / "report.html"
    assert main(["render", *[r.path for r in ranks], "--out", str(out), "--no-svg"]) == 0
    text = out.read_text()
    n = len(ranks[0].param_names)
    assert text.count("Ranks 0, 1 issue the same") == 2  # fsdp and ddp
    assert "same structure as rank 0" in text
    # Objects are diffed in the order they came: FSDP (saved first) to DDP.
    assert f"<b>\u2212{n} all_gather, \u2212{n} wait; other ops" in text  # no empty "+0" term
    assert f"+{n} all_reduce, \u2212{n} reduce_scatter; other ops" in text


def test_report_flags_ranks_that_would_hang():
    # Present rank 1's DDP capture under the FSDP name: as if rank 1 had taken the other code path.
    from dataclasses import replace

    ranks = two_rank_run()
    wrong = replace(ranks[1].ddp, name="gpt-fsdp")
    text = render_html([ranks[0].fsdp, wrong], svg=False)
    assert "Ranks 0 and 1 disagree at collective 1 (kind differs)" in text


# ---------------------------------------------------------------------------------------------- the run report


def _run_report(decisions: list[Decision], *, with_traces: bool = True, problems: tuple[str, ...] = ()) -> RunReport:
    """What the rank engine builds from what each rank's ``bootstrap.collect`` returned, with real bundles."""
    ranks = two_rank_run()
    collected = {
        r.rank: {
            "decisions": decisions,
            "bundles": {"gpt": r.fsdp} if with_traces else {},
            "ledgers": {"gpt": ledger_from_bundle(r.fsdp)} if with_traces else {},
            "memory": {"rss_bytes": 3 * 2**20},
            "problems": list(problems),
        }
        for r in ranks
    }
    return RunReport.from_ranks(
        collected,
        outputs={0: "", 1: ""},
        world_size=2,
        backend="gloo",
        strategy=StrategySpec("thunder_fsdp"),
        seconds=1.5,
    )


def test_run_report_html_shows_decisions_memory_traces_and_problems():
    decision = Decision(EVIL, Case.RAW_MODULE, Action.JIT_AND_DISTRIBUTE, "</td><b>why</b>")
    report = _run_report([decision], problems=("<img src=x onerror=alert(1)>",))
    frag = run_report_html(report, standalone=False)
    # one root element with the scoped stylesheet once, then the title (nothing leaks into the notebook)
    assert frag.startswith(
        f"<div class='{ROOT_CLASSES}'><style>{REPORT_CSS}</style><h3>thunder_fsdp (FSDP ZERO2 BLOCK)"
    )
    assert frag.count("<style>") == 1 and frag.endswith("</div>")
    assert "Memory per rank" in frag and "3.0 MiB" in frag
    assert "Ranks 0, 1 issue the same" in frag and "<h2>Decisions</h2>" in frag  # the trace report carries them
    assert EVIL not in frag and escape(EVIL) in frag and "&lt;/td&gt;&lt;b&gt;why" in frag
    assert "<img" not in frag and "Not shown" in frag and "rank 0: &lt;img" in frag
    assert "<script" not in frag  # static: nbconvert and GitHub show it as it is
    assert report.to_html(standalone=False) == frag and report._repr_html_() == frag
    full = report.to_html()
    assert full.startswith("<!DOCTYPE html>") and "<title>thunderviz report</title>" in full
    # a page holds the same root element; its stylesheet sits once in the head (with the page's body margins)
    assert frag.replace(f"<style>{REPORT_CSS}</style>", "") in full and full.count(REPORT_CSS) == 1


def test_every_rule_of_the_stylesheet_is_scoped_to_our_root():
    """A report in a notebook restyled every stream output (pre), heading and the page (body)."""
    rules = [r for r in REPORT_CSS.splitlines() if r]
    for rule in rules:
        selectors = rule.split("{", 1)[0].split(",")
        assert all(sel.strip().startswith(ROOT) for sel in selectors), rule
    # nothing global: no rule starts with a bare element (inside our root, `... h2{` is scoped and fine)
    assert not re.search(r"(^|[},])\s*(body|html|pre|h2|table|td)\s*\{", REPORT_CSS, re.M)
    assert "div." + ROOT_CLASSES.replace(" ", ".") == ROOT  # two classes and an element: beats JupyterLab's (0,2,1)


def test_run_report_without_traces_says_so():
    frag = run_report_html(_run_report([], with_traces=False), standalone=False)
    assert "No decisions were recorded" in frag and "No thunder-compiled object ran in this cell" in frag


def test_a_page_of_several_named_reports():
    a, b = _run_report([]), _run_report([], with_traces=False)
    text = reports_page({"zero2": a, "<i>cell</i>": b}, title="thunderviz demo", heading="the tutorial")
    assert "<title>thunderviz demo</title>" in text and "<h1>the tutorial</h1>" in text
    assert text.index("<h2>zero2</h2>") < text.index("<h2>&lt;i&gt;cell&lt;/i&gt;</h2>")
    # each report's body inside one root element, the stylesheet once in the head
    body_b = run_report_html(b, standalone=False).removeprefix(
        f"<div class='{ROOT_CLASSES}'><style>{REPORT_CSS}</style>"
    )
    assert body_b.removesuffix("</div>") + "</section>" in text
    assert text.count(f"class='{ROOT_CLASSES}'") == 1 and text.count(REPORT_CSS) == 1


# ---------------------------------------------------------------------------------------------- shared pieces


def test_markup_pieces_escape_everything():
    assert escape("<a href='x'>&\"") == "&lt;a href=&#x27;x&#x27;&gt;&amp;&quot;"
    assert table(["<h>"], [[None], ["<c>"]]) == (
        "<table><thead><tr><th>&lt;h&gt;</th></tr></thead><tbody><tr><td></td></tr><tr><td>&lt;c&gt;</td></tr>"
        "</tbody></table>"
    )
    rows = decisions_table([Decision("m", Case.USER_JITTED, Action.DISTRIBUTE_IN_PLACE, "<r>", clear_cache=True)])
    assert list(re.findall(r"<th>(\w+)</th>", rows)) == list(DECISION_COLUMNS)
    assert (
        "<td>m</td><td><details class='tv-decision'><summary>case 3: distribute your jitted module in place"
        "</summary><p>case 3: module already jitted by the user \u00b7 distribute in place: &lt;r&gt;</p></details>"
        "</td>" in rows
    )
    assert "True" not in rows  # clear_cache is not a column
    text = page("<t>", "<p>body</p>", style="p{}", script="1;")
    assert text.startswith("<!DOCTYPE html>") and "<title>&lt;t&gt;</title>" in text and "<h1>&lt;t&gt;</h1>" in text
    assert "<style>p{}</style>" in text and text.rstrip().endswith("<script>1;</script></body></html>")
