"""The exported HTML in a real browser with the network off: it renders, asks for nothing, and clicks work."""

from __future__ import annotations

import pytest

from tests.helpers import trace_fixtures as tf
from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, MISSING_REASON, chromium_missing
from thunderviz.render.graph import dot_available
from thunderviz.render.html import render_html

pytestmark = pytest.mark.skipif(
    chromium_missing() or not dot_available(), reason=f"{MISSING_REASON}; and the Graphviz `dot` binary"
)


def test_offline_report_renders_and_a_click_opens_the_blocks_ops(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    path = tmp_path / "report.html"
    path.write_text(render_html([tf.gpt().bundle], svg=True))
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
        )
        try:
            page = browser.new_context(offline=True).new_page()
            errors: list[str] = []
            urls: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: urls.append(r.url))
            page.goto(path.as_uri())
            assert page.locator("svg").count() == 2  # forward and backward
            # each static graph is as tall as its content, also one taller than the window (a 4-block ZERO3
            # backward): nothing hides behind an inner scrollbar
            page.add_style_tag(content=".graph svg { height: 1500px !important; }")
            clipped = page.eval_on_selector_all(
                ".graph", "els => els.filter(e => e.scrollHeight > e.clientHeight + 1).map(e => e.scrollHeight)"
            )
            assert clipped == []
            block = page.locator("g.node", has_text="blocks.1").first
            node_id = block.get_attribute("id")
            details = page.locator(f"#details-{node_id}")
            assert details.evaluate("d => d.open") is False
            block.click()
            assert details.evaluate("d => d.open") is True
            assert details.locator("tr").count() > 50  # the block's ops, one row each
            assert errors == [] and [u for u in urls if not u.startswith("file:")] == []
        finally:
            browser.close()
