"""Traces captured on two real gloo ranks, saved per rank as a cluster job would, opened and rendered later."""

from __future__ import annotations

import re

import pytest

from tests.distributed.trace_scenarios import two_rank_run
from thunderviz.cli import main
from thunderviz.core.traces import load
from thunderviz.render.graph import graph_view
from thunderviz.render.html import render_html


@pytest.fixture(scope="module")
def ranks():
    return two_rank_run()


def test_each_rank_saved_its_own_file_and_it_loads_back_equal(ranks):
    for r in ranks:
        fsdp, ddp = load(r.path)
        assert (fsdp.rank, fsdp.world_size, fsdp.name, ddp.name) == (r.rank, 2, "gpt-fsdp", "gpt-ddp")
        assert fsdp == r.fsdp and ddp == r.ddp  # the file and the pickle from the rank agree
        assert fsdp.memory["forward"] > 0 and fsdp.memory["backward"] > 0


def test_fsdp_graph_sets_collectives_apart_in_each_block(ranks):
    view = graph_view(ranks[0].fsdp.forward)
    coll_nodes = [k for k, m in view.nodes.items() if m["kind"] == "collectives"]
    assert {view.nodes[k]["group"] for k in coll_nodes} == {g.name for g in view.groups if g.collectives}
    assert sum(len(view.nodes[k]["ops"]) for k in coll_nodes) == 2 * len(ranks[0].param_names)
    assert re.search(r'g\d+c \[id="g\d+c", label="\d+\u00d7 all_gather\\n\d+\u00d7 wait', view.dot)
    assert "shape=hexagon" in view.dot


def test_cli_renders_all_ranks_files_into_one_report(ranks, tmp_path):
    out = tmp_path / "report.html"
    assert main(["render", *[r.path for r in ranks], "--out", str(out), "--no-svg"]) == 0
    page = out.read_text()
    n = len(ranks[0].param_names)
    assert page.count("Ranks 0, 1 issue the same") == 2  # fsdp and ddp
    assert "same structure as rank 0" in page
    # Objects are diffed in the order they came: FSDP (saved first) to DDP.
    assert f"+0, \u2212{n} all_gather, \u2212{n} wait; other ops" in page
    assert f"+{n} all_reduce, \u2212{n} reduce_scatter; other ops" in page


def test_report_flags_ranks_that_would_hang(ranks):
    # Present rank 1's DDP capture under the FSDP name: as if rank 1 had taken the other code path.
    from dataclasses import replace

    wrong = replace(ranks[1].ddp, name="gpt-fsdp")
    page = render_html([ranks[0].fsdp, wrong], svg=False)
    assert "Ranks 0 and 1 disagree at collective 1 (kind differs)" in page
