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
    # offline: nothing is fetched from the network
    assert not re.search(r"""(src|href)=["']?https?://""", page)
