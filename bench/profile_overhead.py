"""What recording a timeline costs, and how fast the browser draws one: numbers side by side, never asserted.

Run: .venv/bin/python bench/profile_overhead.py [--rounds N] [--steps N] [--model small|gpt]

1. Step time with ``record_timeline`` (what ``--timeline`` runs on every rank) vs without, in the same 2 gloo
   rank processes (ThunderFSDPStrategy and ThunderDDPStrategy on the small GPT, 4 blocks, d=128): each round
   runs ``--steps`` plain steps, then the same number inside a recording (its first step, recorded as the
   warm-up, is not timed), alternating so machine noise hits both alike. Target: median ratio <= 1.15.
   The one-off cost at the end of a recording (profiler results -> timeline, reading the traces for names) is
   printed separately: it is paid once per cell, not per step.
2. A timeline of 2 ranks x 20 steps (FSDP, the same model) drawn by the widget's real ES module in Debian's
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

CHROMIUM = "/usr/bin/chromium"


def _setup(kind: str, world_size: int, model_kind: str):
    import torch
    from lightning.fabric import Fabric

    from bench._steps import batch_for, fresh_gpt, gpt_loss
    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.models import TinyGPT

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
    from thunderviz.core.profiling import record_timeline

    fabric, step = _setup(kind, world_size, model_kind)
    for i in range(3):
        step(i)  # compile and warm up
    plain: list[float] = []
    profiled: list[float] = []
    finish: list[float] = []
    n = 3
    for _ in range(rounds):
        for _ in range(steps):
            t0 = time.perf_counter()
            step(n)
            plain.append(time.perf_counter() - t0)
            n += 1
        rec = record_timeline(steps=steps, fabric=fabric)
        with rec:
            for j in range(steps + 1):
                t0 = time.perf_counter()
                step(n)
                if j > 0:  # the recorder's own warm-up step is recorded but not part of the timeline
                    profiled.append(time.perf_counter() - t0)
                n += 1
            t_exit = time.perf_counter()
        finish.append(time.perf_counter() - t_exit)
    return {"plain": plain, "profiled": profiled, "finish": finish, "collectives": len(rec.result.collectives)}


def record20(rank: int, world_size: int, out_dir: str, model_kind: str) -> str:
    from thunderviz.core.profiling import record_timeline

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
    args = ap.parse_args()
    from thunderviz.launch import run_ranks

    print(f"load: {os.getloadavg()}")
    for kind in ("fsdp", "ddp"):
        res = run_ranks(overhead, kind, args.rounds, args.steps, args.model, nproc=2, timeout=3600)[0]
        p, q = statistics.median(res["plain"]), statistics.median(res["profiled"])
        print(
            f"{kind}: step time without recording {p * 1e3:8.1f} ms, with record_timeline {q * 1e3:8.1f} ms "
            f"(medians of {len(res['plain'])} / {len(res['profiled'])} steps); ratio {q / p:.3f} (target <= 1.15)"
        )
        print(
            f"      end of a {args.steps}-step recording (profile -> timeline, names): "
            f"median {statistics.median(res['finish']) * 1e3:.0f} ms once per cell; "
            f"{res['collectives']} collectives recorded on rank 0"
        )

    out_dir = tempfile.mkdtemp(prefix="thunderviz-bench-timeline-")
    paths = run_ranks(record20, out_dir, args.model, nproc=2, timeout=3600)
    from thunderviz.core.timeline import load
    from thunderviz.notebook.timeline_widget import TimelineView

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
    if not Path(CHROMIUM).exists():
        print(f"browser part skipped: no {CHROMIUM}")
        return
    from playwright.sync_api import sync_playwright

    times, rects = [], 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
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
