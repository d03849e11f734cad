"""``TimelineView`` from Python and in a real Chromium (the widget's own ES module, fed its real synced state)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, MISSING_REASON, chromium_missing
from tests.helpers.timeline_runs import SLEEP_S, STEPS, recorded
from thunderviz.notebook.timeline_widget import TimelineView
from thunderviz.timeline import load

SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "browser"
pytestmark = pytest.mark.timeout(600)

# A minimal anywidget host: the model object the front end talks to, with listeners, and nothing else.
_HOST_JS = """
async ([esm, state, width]) => {
  const url = URL.createObjectURL(new Blob([esm], {type: 'text/javascript'}));
  const mod = (await import(url)).default;
  const listeners = {};
  window.__tl = { state, listeners, saved: [] };
  const model = { get: (k) => state[k], set: (k, v) => { state[k] = v; },
    save_changes: () => { window.__tl.saved.push(JSON.stringify(state.selected)); },
    on: (ev, fn) => { (listeners[ev] = listeners[ev] || []).push(fn); }, off: () => {} };
  const el = document.createElement('div'); el.style.width = `${width || 1200}px`;
  document.body.append(el);
  const t0 = performance.now();
  mod.render({model, el});
  const root = el.querySelector('.tl-root');
  if (width) root.id = `tl-${width}`;
  await new Promise((res) => {
    const f = () => Number(root.dataset.drawn || 0) >= 1 ? res() : requestAnimationFrame(f); f();
  });
  return performance.now() - t0;
}
"""

_VISIBLE_POINT = """
(sel) => {
  const r = document.querySelector(sel);
  const b = r.getBoundingClientRect();
  for (let x = b.left + 1; x < b.right; x += 1) {
    if (document.elementFromPoint(x, b.top + b.height / 2) === r) return [x, b.top + b.height / 2];
  }
  return null;
}
"""


@pytest.fixture(scope="module")
def view() -> TimelineView:
    return TimelineView(load(*[r.path for r in recorded("fsdp")], name="gpt-fsdp"))


def test_a_common_scale_for_runs_compared(view):
    """FSDP and DDP were drawn on different scales; ``span_ms`` puts both on the longer one's."""
    from thunderviz.notebook.timeline_widget import TimelineView, common_span_ms

    tl = view.timeline
    span = common_span_ms(tl) * 3
    wide = TimelineView(tl, span_ms=span)
    assert wide.data["span"] == pytest.approx(span * 1000, abs=0.1) and view.data["span"] is None

    def last_tick(html: str) -> float:
        return max(float(m) for m in re.findall(r">([0-9.]+) ms</text>", html))

    assert last_tick(wide.to_html()) >= 0.8 * span > 2 * last_tick(view.to_html())  # the static picture too
    with pytest.raises(ValueError, match="span_ms=0"):
        TimelineView(tl, span_ms=0)


def test_python_api_names_the_straggler_and_gives_every_ranks_arrival(view):
    assert repr(view).endswith("straggler: rank 1)")
    d = view.select_worst()
    assert d["last_rank"] == 1 and "rank 1 arrived" in d["message"]
    assert [a["rank"] for a in d["arrivals"]] == [0, 1] and d["arrivals"][1]["last"]
    assert d["arrivals"][0]["waited_ms"] > 0 and d["ledger"]["kind"] == "reduce_scatter"
    assert d["ledger"]["tensor"].startswith("root (17 grads, ")  # BLOCK buckets, the default: a short name
    with pytest.raises(ValueError, match="no such collective"):
        view.select(99, 1)


def test_a_graph_nodes_group_outlines_its_spans_on_every_rank(view):
    spans = view.show_group("blocks.0")
    assert set(spans) == {0, 1} and all(spans[r] for r in spans)
    assert view.highlight["group"] == "blocks.0"
    with pytest.raises(ValueError, match="groups:"):
        view.show_group("no.such.block")
    view.show_group(None)
    assert view.highlight == {}


def test_idle_time_is_drawn_and_neighbouring_blocks_get_distinct_colours(view):
    """Rank 1's sleep before every backward was drawn blank, not idle; blocks.0-3 shared one colour."""
    from itertools import combinations

    from thunderviz.render.timeline_svg import group_colour

    idle = view.data["ranks"][1]["idle"]
    assert max(b - a for a, b in idle) >= 0.9 * SLEEP_S * 1e6  # the sleep, as idle time of the rank that slept
    titles = re.findall(r'class="idle"><title>rank 1 idle ([0-9.]+) ms', view.to_html())
    assert len([t for t in titles if float(t) >= 0.9 * SLEEP_S * 1e3]) == STEPS  # the static picture too
    assert view.data["group_colours"] == [group_colour(g) for g in view.data["groups"]]
    hues = [float(re.match(r"hsl\(([0-9.]+),", group_colour(f"blocks.{i}")).group(1)) for i in range(4)]
    assert min(abs((a - b + 180) % 360 - 180) for a, b in combinations(hues, 2)) >= 30, hues


def test_static_picture_and_stable_text_ride_along(view):
    bundle = view._repr_mimebundle_()
    assert bundle["text/plain"] == repr(view)
    assert "<svg" in bundle["text/html"] and "Straggler: rank 1" in bundle["text/html"]
    assert "<script" not in bundle["text/html"]


@pytest.mark.skipif(chromium_missing(), reason=MISSING_REASON)
def test_in_chromium_lanes_per_rank_a_clicked_collective_shows_arrivals_and_the_slow_rank(view):
    from playwright.sync_api import sync_playwright

    label = view.select_worst()["label"]
    state = json.loads(json.dumps({k: v for k, v in view.get_state().items() if not k.startswith("_")}))
    worst = view.data["worst"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(offline=True, viewport={"width": 1300, "height": 900}).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.set_content("<html><body></body></html>")
            page.add_style_tag(content=view._css)
            page.evaluate(_HOST_JS, [view._esm, state])
            assert page.locator("g.tl-lane").count() == 2
            assert page.locator("g.tl-lane[data-rank='1'] rect.tl-coll").count() > 0
            assert page.locator(".tl-summary .tl-line").first.inner_text().startswith("Straggler: rank 1 arrived last")
            assert "3 of every 4 recorded steps" in page.locator(".tl-note").inner_text()  # the rule, stated
            assert page.locator("g.tl-lane[data-rank='1'] rect.tl-idle").count() >= 1  # the sleep, drawn idle
            # Every lane's rows are labelled, each step marked, and the legend shows the colours the
            # module bars really use.
            labels = page.locator("text.tl-row-label").evaluate_all("els => els.map(e => e.textContent)")
            assert labels == ["steps", "compute by module", "main thread", "collectives"] * 2
            assert page.locator("line.tl-step-marker").count() == len(view.timeline.steps)
            bars = set(
                page.locator("g.tl-lane rect[fill^='hsl']").evaluate_all(
                    "els => els.map(e => getComputedStyle(e).fill)"
                )
            )
            swatches = set(
                page.locator(".tl-legend-groups .tl-swatch").evaluate_all(
                    "els => els.map(e => getComputedStyle(e).backgroundColor)"
                )
            )
            assert bars and bars <= swatches, (bars, swatches)
            # Concurrent collectives overlap in the communication row: click a point where this one is on top
            # (on the rank that waited, its span is long; the late rank's may be hidden under the next one).
            points = [
                page.evaluate(_VISIBLE_POINT, f"g.tl-lane[data-rank='{r}'] rect.tl-coll[data-key='{worst}']")
                for r in (0, 1)
            ]
            point = next((p for p in points if p is not None), None)
            assert point is not None, f"collective {worst} is hidden under others on both ranks"
            page.mouse.click(point[0], point[1])
            assert page.locator(".tl-details-title").inner_text() == label
            rows = page.locator(".tl-arrivals tr[data-rank]")
            assert rows.count() == 2
            last = page.locator(".tl-arrivals tr.tl-last")
            assert last.get_attribute("data-rank") == "1" and "arrived last" in last.inner_text()
            assert "rank 1 arrived" in page.locator(".tl-message").inner_text()
            assert page.evaluate("window.__tl.saved.at(-1)") == json.dumps({"key": worst}, separators=(",", ":"))
            # zoom in with the wheel: the visible window shrinks
            before = page.locator(".tl-root").get_attribute("data-view")
            page.locator(".tl-plot").hover()
            page.mouse.wheel(0, -300)
            after = page.locator(".tl-root").get_attribute("data-view")
            b0, b1 = map(float, before.split(","))
            a0, a1 = map(float, after.split(","))
            assert a1 - a0 < b1 - b0
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "timeline-widget.png"), full_page=True)
            _step_labels_never_overlap(page)
            assert errors == []
        finally:
            browser.close()


# Each step label's box and each step marker's tooltip, in a timeline root.
_STEP_LABELS_JS = """
(root) => ({
  labels: [...root.querySelectorAll('text.tl-step-label')].map((t) => {
    const b = t.getBBox();
    return [Number(t.dataset.step), b.x, b.x + b.width, t.textContent];
  }),
  markers: [...root.querySelectorAll('line.tl-step-marker')].map((l) => [Number(l.dataset.step), l.textContent]),
})
"""


def _step_labels_never_overlap(page) -> None:
    """A recording of 12 short steps at the narrowest width the widget draws: "step 4" and "step 5" were drawn over
    each other at fit where steps were short beside long ones; a label now fits between its marker and the next
    ("step 10", else "10", else none, the marker's tooltip still naming it)."""
    quiet = [next(p for kind, p in r.quiet if kind == "fsdp") for r in recorded("fsdp")]
    view = TimelineView(load(*quiet, name="12 short steps"))
    state = json.loads(json.dumps({k: v for k, v in view.get_state().items() if not k.startswith("_")}))
    page.evaluate(_HOST_JS, [view._esm, state, 480])
    root = page.locator("#tl-480")
    root.locator("button.tl-btn", has_text="fit").click()
    drawn = root.evaluate(_STEP_LABELS_JS)
    labels = sorted(drawn["labels"], key=lambda b: b[1])
    assert labels and all(a[2] <= b[1] for a, b in itertools.pairwise(labels)), labels  # no two overlap
    assert len(drawn["markers"]) == len(view.timeline.steps) >= 10
    assert all(t == f"step {n}" for n, t in drawn["markers"]), drawn["markers"]
    assert all(text in (f"step {n}", str(n)) for n, _, _, text in labels), labels
