"""What recording a timeline costs, and how fast the browser draws one: numbers side by side, never asserted.

Run: .venv/bin/python bench/profile_overhead.py [--rounds N] [--steps N] [--model small|gpt] [--cells N]

1. Step time with ``record_timeline`` (what ``--timeline`` runs on every rank) vs without, and vs torch.profiler
   alone (the same activities, nothing of ours), in the same 2 gloo rank processes (ThunderFSDPStrategy and
   ThunderDDPStrategy on the small GPT, 4 blocks, d=128): each round runs ``--steps`` plain steps, then
   ``--steps`` + 1 inside torch.profiler, then inside a recording (the first step of each, the recorder's warm-up,
   is not timed), the order alternating between rounds so machine noise hits all alike. Target: median ratio
   record_timeline / plain <= 1.15; record_timeline / torch.profiler is what our labels and wrappers add.
   The one-off cost at the end of a recording (profiler results -> timeline, reading the traces for names) is
   printed separately: it is paid once per cell, not per step.
2. A whole ``%%thunder_fsdp`` cell through the rank engine, ``train(steps + 1)``, with ``--timeline`` and without,
   alternating (``--cells`` of each): the per-cell cost (clock rendezvous, profiling, building the timeline from
   the bundles the report captures anyway).
3. A timeline of 2 ranks x 20 steps (FSDP, the same model) drawn by the widget's real ES module in Debian's
   headless Chromium (/usr/bin/chromium), fed the real synced state (no JupyterLab), from ``render()`` to the
   SVG in the page; median of fresh pages. Target: <= 1 s. Plus the kernel side (TimelineView state, its size).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, chromium_missing


def _setup(kind: str, world_size: int, model_kind: str):
    import torch
    from lightning.fabric import Fabric

    from bench._steps import batch_for, fresh_gpt, gpt_loss
    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import TinyGPT

    fabric = Fabric(
        accelerator="cpu",
        devices=world_size,
        strategy=ThunderFSDPStrategy() if kind == "fsdp" else ThunderDDPStrategy(),
    )
    fabric.launch()
    torch.manual_seed(0)
    net = fresh_gpt() if model_kind == "gpt" else TinyGPT(n_layer=2, d_model=64)
    model = fabric.setup(net)
    opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=1e-3))

    def step(i: int) -> None:
        x, y = batch_for(fabric.global_rank, i)
        fabric.backward(gpt_loss(model(x), y))
        opt.step()
        opt.zero_grad()

    return fabric, step


def overhead(rank: int, world_size: int, kind: str, rounds: int, steps: int, model_kind: str) -> dict:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from thunderviz.timeline.record import record_timeline

    fabric, step = _setup(kind, world_size, model_kind)
    for i in range(3):
        step(i)  # compile and warm up
    times: dict[str, list[float]] = {"plain": [], "torch.profiler": [], "record_timeline": []}
    finish: list[float] = []
    counter = iter(range(3, 10**9))
    collectives = 0

    def timed(name: str, n: int, skip_first: bool) -> None:
        for j in range(n):
            dist.barrier()
            t0 = time.perf_counter()
            step(next(counter))
            if not (skip_first and j == 0):
                times[name].append(time.perf_counter() - t0)

    def plain() -> None:
        timed("plain", steps, False)

    def profiler_alone() -> None:
        with profile(activities=[ProfilerActivity.CPU]):
            timed("torch.profiler", steps + 1, True)

    def recorded() -> None:
        nonlocal collectives
        rec = record_timeline(steps=steps, fabric=fabric)
        with rec:
            timed("record_timeline", steps + 1, True)
            t_exit = time.perf_counter()
        finish.append(time.perf_counter() - t_exit)
        collectives = len(rec.result.collectives)

    variants = [plain, profiler_alone, recorded]
    for r in range(rounds):
        for fn in variants if r % 2 == 0 else reversed(variants):
            fn()
    return {**times, "finish": finish, "collectives": collectives}


CELL_SETUP = """
from bench._steps import batch_for, fresh_gpt, gpt_loss
from thunderviz.demos.models import TinyGPT
model = fabric.setup(fresh_gpt() if {gpt!r} else TinyGPT(n_layer=2, d_model=64))
opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=1e-3))
def train(n):
    for i in range(n):
        x, y = batch_for(rank, i)
        fabric.backward(gpt_loss(model(x), y))
        opt.step()
        opt.zero_grad()
train(3)
"""


def cell_cost(cells: int, steps: int, model_kind: str) -> dict[str, list[float]]:
    """Wall time of the same training cell through the rank engine, with --timeline and without, alternating."""
    from thunderviz.cell.protocol import StrategySpec
    from thunderviz.pool.engine import RankEngine

    spec = StrategySpec("thunder_fsdp", {})
    out: dict[str, list[float]] = {"without": [], "with --timeline": []}
    engine = RankEngine.start(2, backend="gloo", on_output=lambda *a: None)
    try:
        engine.run(f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})", strategy=spec)
        engine.run(CELL_SETUP.format(gpt=model_kind == "gpt"), strategy=spec)
        for flag in (False, True):  # once each before timing: the rank-side config message, first profiler start
            engine.run(f"train({steps + 1})", strategy=spec, timeline=flag, steps=steps)
        for i in range(cells):
            for flag in (False, True) if i % 2 == 0 else (True, False):
                t0 = time.perf_counter()
                report = engine.run(f"train({steps + 1})", strategy=spec, timeline=flag, steps=steps)
                out["with --timeline" if flag else "without"].append(time.perf_counter() - t0)
                if flag:
                    assert report.timeline.steps, report.problems
    finally:
        engine.stop()
    return out


def record20(rank: int, world_size: int, out_dir: str, model_kind: str) -> str:
    from thunderviz.timeline.record import record_timeline

    fabric, step = _setup("fsdp", world_size, model_kind)
    with record_timeline(steps=20, fabric=fabric, name="gpt-fsdp 20 steps") as rec:
        for i in range(21):
            step(i)
    path = str(Path(out_dir) / f"rank{rank}.json")
    rec.save(path)
    return path


_PAGE_JS = """
async ([esm, state]) => {
  const url = URL.createObjectURL(new Blob([esm], {type: 'text/javascript'}));
  const mod = (await import(url)).default;
  const model = { get: (k) => state[k], set: (k, v) => { state[k] = v; }, save_changes: () => {},
    on: () => {}, off: () => {} };
  const el = document.createElement('div'); el.style.width = '1200px';
  document.body.append(el);
  const t0 = performance.now();
  mod.render({model, el});
  const root = el.querySelector('.tl-root');
  await new Promise((res) => {
    const f = () => Number(root.dataset.drawn || 0) >= 1 ? res() : requestAnimationFrame(f); f();
  });
  await new Promise((res) => requestAnimationFrame(() => res()));  // the frame that paints it
  return {ms: performance.now() - t0, rects: el.querySelectorAll('rect').length};
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--pages", type=int, default=5)
    ap.add_argument("--model", choices=("gpt", "small"), default="gpt")
    ap.add_argument("--cells", type=int, default=3, help="cells of each kind through the rank engine (0: skip)")
    ap.add_argument("--skip-browser", action="store_true")
    args = ap.parse_args()
    from thunderviz.pool.spawn import run_ranks

    print(f"load: {os.getloadavg()}")
    for kind in ("fsdp", "ddp"):
        res = run_ranks(overhead, kind, args.rounds, args.steps, args.model, nproc=2, timeout=3600)[0]
        med = {k: statistics.median(res[k]) for k in ("plain", "torch.profiler", "record_timeline")}
        print(
            f"{kind}: step time plain {med['plain'] * 1e3:.1f} ms, torch.profiler alone "
            f"{med['torch.profiler'] * 1e3:.1f} ms, record_timeline {med['record_timeline'] * 1e3:.1f} ms "
            f"(medians of {len(res['plain'])} steps each)"
        )
        print(
            f"      ratios: record_timeline / plain {med['record_timeline'] / med['plain']:.3f} (target <= 1.15), "
            f"torch.profiler / plain {med['torch.profiler'] / med['plain']:.3f}, "
            f"record_timeline / torch.profiler {med['record_timeline'] / med['torch.profiler']:.3f} (ours)"
        )
        print(
            f"      end of a {args.steps}-step recording (profile -> timeline, names by a capture of its own): "
            f"median {statistics.median(res['finish']) * 1e3:.0f} ms once per recording; "
            f"{res['collectives']} collectives recorded on rank 0"
        )
    if args.cells:
        cells = cell_cost(args.cells, args.steps, args.model)
        a, b = statistics.median(cells["without"]), statistics.median(cells["with --timeline"])
        print(
            f"%%thunder_fsdp cell of {args.steps + 1} steps through the rank engine (report with traces either "
            f"way): without {a:.2f} s, with --timeline {b:.2f} s (medians of {args.cells}); "
            f"--timeline costs {b - a:+.2f} s per cell"
        )
    print(f"load: {os.getloadavg()}")

    if args.skip_browser:
        return
    out_dir = tempfile.mkdtemp(prefix="thunderviz-bench-timeline-")
    paths = run_ranks(record20, out_dir, args.model, nproc=2, timeout=3600)
    from thunderviz.notebook.timeline_widget import TimelineView
    from thunderviz.timeline import load

    tl = load(*paths)
    t0 = time.perf_counter()
    view = TimelineView(tl)
    build_ms = (time.perf_counter() - t0) * 1e3
    state = json.loads(json.dumps({k: v for k, v in view.get_state().items() if not k.startswith("_")}))
    n_coll = sum(len(t.collectives) for t in tl.ranks.values())
    n_ops = sum(len(t.ops) for t in tl.ranks.values())
    print(
        f"timeline: {len(tl.ranks)} ranks x {len(tl.steps)} steps, {n_coll} collectives, {n_ops} top-level ops; "
        f"TimelineView state {build_ms:.0f} ms in the kernel, {len(json.dumps(state)) / 1024:.0f} KiB synced"
    )
    if chromium_missing():
        print(f"browser part skipped: no {CHROMIUM}")
        return
    from playwright.sync_api import sync_playwright

    times, rects = [], 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for _ in range(args.pages):
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda e, errs=errors: errs.append(str(e)))
                page.set_content("<html><body></body></html>")
                page.add_style_tag(content=view._css)
                r = page.evaluate(_PAGE_JS, [view._esm, state])
                if errors:
                    raise RuntimeError(f"page errors: {errors}")
                times.append(r["ms"])
                rects = r["rects"]
                page.close()
        finally:
            browser.close()
    print(
        f"Chromium: render() -> timeline drawn, median {statistics.median(times):.0f} ms over {len(times)} fresh pages "
        f"(min {min(times):.0f}, max {max(times):.0f}; {rects} rectangles); target <= 1000 ms"
    )
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    main()
