"""``thunderviz demo --scenarios``: the plain-Python story on real ranks, through the command line."""

from __future__ import annotations

import pytest

from thunderviz.cli import main


@pytest.mark.timeout(600)
def test_scenarios_print_decisions_collectives_and_write_the_report(tmp_path, capsys):
    only = "fsdp-raw-module,ddp-user-jitted-function"
    assert main(["demo", "--scenarios", "--only", only, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[fsdp-raw-module] case 1: jit once, then shard - ZERO2, 2 block buckets + root\n" in out
    assert "[ddp-user-jitted-function] case 2: replicate in place for your jitted function - 25 MB gradient" in out
    # The strategies' default communication: FSDP packs the 2-block GPT's 29 parameters into BLOCK buckets (root +
    # 2 blocks), DDP all-reduces its 29 gradients in one bucket (they fit in the first, 1 MB, bucket).
    assert "rank 0 collectives: 3 all_gather, 3 reduce_scatter, 6 wait" in out
    assert "rank 0 collectives: 1 all_reduce, 1 wait" in out
    assert out.count("ranks agree") == 2
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "fsdp-raw-module (TinyGPT)" in page and "ddp-user-jitted-function (TinyGPT)" in page
    assert (tmp_path / "traces.json").stat().st_size > 0


def test_unknown_scenario_is_a_usage_error(capsys):
    assert main(["demo", "--scenarios", "--only", "nope"]) == 2
    assert "unknown scenario(s) nope; choose from fsdp-raw-module," in capsys.readouterr().err
