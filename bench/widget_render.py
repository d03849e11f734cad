"""How fast the trace widget shows the small GPT's 1,451-op FSDP backward trace, in the kernel and in Chromium.

Run: .venv/bin/python bench/widget_render.py [--traces DIR] [--rounds N]

Kernel side (Python): building the ``TraceView`` state, expanding a block, a search, the comparison, and the
static HTML (``dot`` binary) that rides along with each display. Browser side: the widget's real ES module in
Debian's headless Chromium (/usr/bin/chromium), fed the real synced state through a minimal model object (no
JupyterLab), timed from ``render()`` to the SVG in the page, for the first widget on a page (Graphviz WASM
compiled in a worker) and for later ones, plus an expansion. The JupyterLab number "cell end -> graph visible" is
printed by tests/browser/test_jupyterlab.py. Numbers are reported, not asserted.

``--traces DIR`` reuses files from ``python -m tests.helpers.gpt_traces DIR`` (otherwise it runs the 2 ranks,
about two minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, chromium_missing

_PAGE_JS = """
async ([esm, state, expandTo]) => {
  const url = URL.createObjectURL(new Blob([esm], {type: 'text/javascript'}));
  const mod = (await import(url)).default;
  const listeners = {};
  const model = {
    get: (k) => state[k],
    set: (k, v) => { state[k] = v; },
    save_changes: () => {},
    on: (ev, fn) => { (listeners[ev] = listeners[ev] || []).push(fn); },
    off: () => {},
  };
  const el = document.createElement('div');
  document.body.append(el);
  const t0 = performance.now();
  mod.render({model, el});
  const root = el.querySelector('.tv-root');
  const waitDrawn = (n) => new Promise((res) => {
    const f = () => Number(root.dataset.drawn || 0) >= n ? res() : requestAnimationFrame(f);
    f();
  });
  await waitDrawn(1);
  const first = performance.now() - t0;
  let expand = null;
  if (expandTo) {
    const t1 = performance.now();
    state.panes = expandTo;
    for (const fn of listeners['change:panes'] || []) fn();
    await waitDrawn(2);
    expand = performance.now() - t1;
  }
  return {first, expand, nodes: root.querySelectorAll('svg g.node').length};
}
"""


def _time(fn: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", help="folder with fsdp-rank*.json and ddp-rank*.json")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    from tests.helpers.gpt_traces import write_gpt_traces

    if args.traces:
        files = {k: [str(Path(args.traces) / f"{k}-rank{r}.json") for r in range(2)] for k in ("fsdp", "ddp")}
    else:
        files = write_gpt_traces(tempfile.mkdtemp(prefix="thunderviz-bench-"))

    from thunderviz.notebook.compare import compare
    from thunderviz.notebook.widgets import TraceView
    from thunderviz.render.graph import dot_available
    from thunderviz.trace.file import load

    fsdp = [b for f in files["fsdp"] for b in load(f)]
    ddp = [b for f in files["ddp"] for b in load(f)]
    n_ops = len(fsdp[0].backward.ops)
    print(f"small GPT FSDP backward: {n_ops} ops on rank 0, 2 ranks; median of {args.rounds} rounds")
    rows: list[tuple[str, float]] = []
    ms, view = _time(lambda: TraceView(fsdp, trace="backward"), args.rounds)
    rows.append(("TraceView(..., trace='backward') state", ms))
    block = next(g["name"] for g in view.panes[0]["groups"] if g["name"].startswith("blocks."))

    def expand() -> Any:
        view.expanded = [block]
        panes = view.panes
        view.expanded = []
        return panes

    ms, expanded_panes = _time(expand, args.rounds)
    rows.append((f"expand {block} + collapse (kernel)", ms))
    ms, _ = _time(lambda: setattr(view, "search", "blocks.1.mlp_fc.weight") or setattr(view, "search", ""), args.rounds)
    rows.append(("search + clear", ms))
    ms, _ = _time(lambda: compare(ddp, fsdp, trace="backward"), args.rounds)
    rows.append(("compare(ddp, fsdp, trace='backward')", ms))
    if dot_available():
        ms, _ = _time(view.to_html, args.rounds)
        rows.append(("static HTML with SVG (dot binary)", ms))
    state = {k: v for k, v in view.get_state().items() if not k.startswith("_") or k == "_graphviz_js"}
    state_kb = len(json.dumps({k: v for k, v in state.items() if k != "_graphviz_js"})) / 1024
    for name, ms in rows:
        print(f"  {name:<45} {ms:8.1f} ms")
    module_kb = len(state["_graphviz_js"]) / 1024
    print(f"  synced state without the Graphviz module: {state_kb:.0f} KiB; module: {module_kb:.0f} KiB")

    if chromium_missing():
        print(f"browser part skipped: no {CHROMIUM} (apt-get install -y chromium)")
        return
    from playwright.sync_api import sync_playwright

    esm = view._esm
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as udd:
        ctx = pw.chromium.launch_persistent_context(
            udd,
            executable_path=CHROMIUM,
            headless=True,
            viewport={"width": 1400, "height": 1000},
            args=CHROMIUM_ARGS,
        )
        firsts, laters, expands = [], [], []
        for _ in range(args.rounds):
            page = ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            page.set_content("<html><body></body></html>")
            page.add_style_tag(content=view._css)
            a = page.evaluate(_PAGE_JS, [esm, dict(state), None])
            b = page.evaluate(_PAGE_JS, [esm, dict(state), expanded_panes])
            if errors:
                raise RuntimeError(f"page errors: {errors}")
            firsts.append(a["first"])
            laters.append(b["first"])
            expands.append(b["expand"])
            page.close()
        ctx.close()
    print(f"Chromium {CHROMIUM}, widget ES module with the real state, median of {args.rounds} fresh pages:")
    print(
        f"  first widget on a page: render() -> collapsed backward SVG   {statistics.median(firsts):8.1f} ms "
        f"(min {min(firsts):.0f}, max {max(firsts):.0f})"
    )
    print(f"  next widget (Graphviz already loaded)                       {statistics.median(laters):8.1f} ms")
    print(f"  expand {block} (new state -> SVG, layout in a worker)        {statistics.median(expands):8.1f} ms")
    print(f"  ({a['nodes']} nodes collapsed)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    main()
