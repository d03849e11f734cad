"""Time to a readable picture of the FSDP backward trace of a 4-block GPT: thunderviz vs make_trace_dot.

Both sides start from the same live thunder trace in the same rank process, in one run:

* thunderviz: ``capture`` (snapshot forward + backward, module attribution) -> collapsed DOT -> ``dot -Tsvg``;
* baseline: ``thunder.examine.make_trace_dot(trace)`` -> ``dot -Tsvg`` on its source, stopped at ``--cap``
  seconds (it can take far longer; the result is then reported as "> cap").

It also times ``load()`` of the saved trace file (every field checked) beside plain ``json.loads`` of the same bytes.

Run: ``.venv/bin/python bench/render.py [--cap 300] [--out DIR] [--trace backward|forward]``. Needs the Graphviz
``dot`` binary. Writes PNGs of the collapsed view and of one expanded block to ``--out`` to look at.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train_step_and_bench(rank: int, world_size: int, cap: float, out_dir: str, which: str) -> dict[str, Any] | None:
    import thunder
    import torch
    import torch.distributed as dist

    from thunderviz.demos.models import TinyGPT, make_batch

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    jm = thunder.distributed.fsdp(thunder.jit(TinyGPT(n_layer=4, d_model=128)), device=torch.device("cpu"))
    x, y = make_batch()
    torch.nn.functional.cross_entropy(jm(x).flatten(0, 1), y.flatten()).backward()
    dist.barrier()
    if rank != 0:
        return None
    from thunder.examine import make_trace_dot

    from thunderviz.render.graph import graph_view, render_dot
    from thunderviz.thunder.capture.traces import capture
    from thunderviz.trace.file import load, save

    traces = thunder.last_backward_traces(jm) if which == "backward" else thunder.last_traces(jm)
    trace = traces[-1]
    res: dict[str, Any] = {"n_ops": len(trace.bound_symbols), "trace": which}

    # --- thunderviz: from the live trace to a laid-out SVG of the default (collapsed) view.
    t0 = time.perf_counter()
    bundle = capture(jm, "TinyGPT-fsdp", stages=False)
    t1 = time.perf_counter()
    snap = bundle.backward if which == "backward" else bundle.forward
    view = graph_view(snap, title=f"TinyGPT 4x128 FSDP rank 0, {which}")
    t2 = time.perf_counter()
    svg = render_dot(view.dot, "svg")
    t3 = time.perf_counter()
    res.update(
        ours_capture=t1 - t0,
        ours_dot=t2 - t1,
        ours_layout=t3 - t2,
        ours_total=t3 - t0,
        ours_nodes=len(view.nodes),
        ours_svg_bytes=len(svg),
    )
    t = time.perf_counter()
    capture(jm, "TinyGPT-fsdp", stages=False)
    res["ours_capture_again"] = time.perf_counter() - t  # without first-call imports

    # --- the file: load() checks every field; beside it, plain json.loads of the same bytes (best of 5 each).
    import json

    path = save(capture(jm, "TinyGPT-fsdp", stages=True), os.path.join(out_dir, "traces-rank0.json"))
    res["file_bytes"] = path.stat().st_size
    res["file_load"] = min(_seconds(lambda: load(path)) for _ in range(5))
    res["file_json"] = min(_seconds(lambda: json.loads(path.read_bytes())) for _ in range(5))
    with open(os.path.join(out_dir, f"{which}_collapsed.png"), "wb") as f:
        f.write(render_dot(view.dot, "png"))
    with open(os.path.join(out_dir, f"{which}_collapsed.svg"), "wb") as f:
        f.write(svg)
    block = next(g.name for g in view.groups if g.name.startswith("blocks."))
    t4 = time.perf_counter()
    expanded = graph_view(snap, expand={block}, title=f"{which}, {block} expanded")
    png = render_dot(expanded.dot, "png")
    res.update(expand_block=block, expand_s=time.perf_counter() - t4, expand_nodes=len(expanded.nodes))
    with open(os.path.join(out_dir, f"{which}_{block}_expanded.png"), "wb") as f:
        f.write(png)

    # --- baseline: thunder's own picture of the same trace.
    t5 = time.perf_counter()
    digraph = make_trace_dot(trace)
    source = digraph.source
    t6 = time.perf_counter()
    res.update(base_make_dot=t6 - t5, base_dot_lines=source.count("\n"))
    try:
        proc = subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True, timeout=cap)
        res.update(base_layout=time.perf_counter() - t6, base_capped=False, base_rc=proc.returncode)
    except subprocess.TimeoutExpired:
        res.update(base_layout=cap, base_capped=True, base_rc=None)
    res["base_total"] = res["base_make_dot"] + res["base_layout"]
    return res


def _seconds(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cap", type=float, default=300.0, help="seconds to let `dot` lay out make_trace_dot's graph")
    p.add_argument("--out", default="/tmp/thunderviz-bench", help="where to write the PNG/SVG pictures")
    p.add_argument("--trace", choices=("backward", "forward"), default="backward")
    args = p.parse_args(argv)
    if shutil.which("dot") is None:
        print("bench/render.py needs the Graphviz `dot` binary (apt-get install graphviz).", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    from thunderviz.pool.spawn import run_ranks

    r = run_ranks(_train_step_and_bench, args.cap, args.out, args.trace, nproc=2, timeout=args.cap + 600)[0]
    capped = r["base_capped"]
    base = (
        f"> {r['base_total']:.1f} s (dot stopped at the {args.cap:.0f} s cap)" if capped else f"{r['base_total']:.2f} s"
    )
    ratio = r["base_total"] / r["ours_total"]
    print(f"FSDP {r['trace']} trace of TinyGPT(n_layer=4, d_model=128), rank 0: {r['n_ops']} bound symbols")
    print(
        f"  thunderviz collapsed view : {r['ours_total']:.3f} s  (capture {r['ours_capture']:.3f} + DOT "
        f"{r['ours_dot']:.3f} + dot -Tsvg {r['ours_layout']:.3f}); {r['ours_nodes']} nodes"
    )
    print(
        f"    of which the view itself (DOT + layout): {r['ours_dot'] + r['ours_layout']:.3f} s; a second capture "
        f"takes {r['ours_capture_again']:.3f} s"
    )
    print(
        f"  make_trace_dot + dot -Tsvg: {base}  (make_trace_dot {r['base_make_dot']:.3f} s, "
        f"{r['base_dot_lines']} DOT lines)"
    )
    print(f"  ratio baseline / thunderviz: {'> ' if capped else ''}{ratio:.0f}x")
    print(f"  expanding {r['expand_block']}: {r['expand_s']:.3f} s to DOT + PNG ({r['expand_nodes']} nodes)")
    print(
        f"  trace file with every stage ({r['file_bytes'] / 2**20:.1f} MiB): load() with every field checked "
        f"{r['file_load'] * 1000:.0f} ms vs json.loads {r['file_json'] * 1000:.0f} ms "
        f"({r['file_load'] / r['file_json']:.1f}x)"
    )
    print(f"  pictures in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
