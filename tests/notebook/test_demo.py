"""The headless demo executes the tutorial in a real kernel and writes one offline HTML report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from thunderviz.notebook.demo import run_demo


@pytest.mark.timeout(600)
def test_demo_runs_the_tutorial_and_writes_one_offline_report(tmp_path: Path) -> None:
    path = run_demo(tmp_path)
    assert path.parent == tmp_path.resolve() and path.suffix == ".html"
    assert sorted(p.name for p in tmp_path.glob("*.html")) == [path.name]
    page = path.read_text(encoding="utf-8")
    # every report the tutorial named, in one page
    for name in ("zero2", "zero3", "user_jit", "user_fn", "ddp", "after"):
        assert f"<h2>{name}</h2>" in page
    assert page.count("<section>") == 6  # named reports only (not IPython's _, __ output history)
    assert "jitted_loss" in page and "TinyGPT" in page
    # the terminal story `thunderviz demo` prints: each cell's decisions and rank 0's collectives
    summary = path.with_suffix(".txt").read_text(encoding="utf-8")
    assert "[zero2] thunder_fsdp on 2 ranks (gloo)" in summary
    assert "case 1: raw module -> jit, then distribute" in summary
    assert "case 3: module already jitted by the user -> distribute in place" in summary
    assert "case 2: module used inside a jitted function -> distribute for a jitted function" in summary
    assert re.search(r"\d+ all_gather, \d+ reduce_scatter, \d+ wait; ranks agree", summary)
    assert re.search(r"\d+ all_reduce, \d+ wait; ranks agree", summary)
    assert re.findall(r"^\[(\w+)\]", summary, re.M) == ["zero2", "zero3", "user_jit", "user_fn", "ddp", "after"]
    # offline: nothing is fetched from the network
    assert not re.search(r"""(src|href)=["']?https?://""", page)
