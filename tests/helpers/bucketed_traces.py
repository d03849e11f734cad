"""Real traces under the strategies' default buckets, once per pytest session: the tutorial's model (TinyGPT, 4
blocks, d=32) under FSDP ZERO2 and ZERO3 and DDP, and with thunder's ``torchcompile`` fusion executor under ZERO2
(``fused``: fusion regions spanning modules; 2 blocks, since its other executors make it compile afresh: measured
side by side, 0.80x the first 4-block ZERO2 set-up, where 4 blocks took 1.47x), and a litgpt ``GPT`` under FSDP
ZERO3, on 2 gloo ranks. The fused run builds
thunder's real regions but runs their ops one by one (``executors.uncompiled_fusions``, as the memory plan's
rehearsal does): inductor's C++ compile of each region (tens of seconds on a cold cache) changes nothing traced.

The graph-order test, the comparison's naming and summary, and the browser tour's readability checks need what a
person sees by default: BLOCK buckets (a root bucket and one per block), not the one-collective-per-parameter
layout of ``gpt_traces``. One ``run_ranks`` call makes all of them (about a minute on 2 CPU cores); every run saves
one file per rank and its decision log, as a torchrun job would.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from tests.helpers.run_once import once_per_run
from tests.helpers.trace_folder import trace_files
from thunderviz.parallel.decisions import Decision

__all__ = ["RUNS", "TUTORIAL_MODEL", "bucketed_trace_files", "decisions_of", "run_report", "write_bucketed_traces"]

#: The tutorial's model (``thunderviz/demos/tutorial.ipynb``).
TUTORIAL_MODEL = {"n_layer": 4, "d_model": 32, "n_head": 2, "block_size": 16, "vocab_size": 64}
#: run name -> (model, strategy keywords, strategy class name)
RUNS = {
    "zero2": ("tiny", {}, "fsdp"),
    "zero3": ("tiny", {"sharding_strategy": "ZERO3"}, "fsdp"),
    "ddp": ("tiny", {}, "ddp"),
    "fused": ("tiny-2", {"executors": ["sdpa", "torchcompile", "torch"]}, "fsdp"),
    "litgpt": ("litgpt", {"sharding_strategy": "ZERO3"}, "fsdp"),
}


def _model(which: str) -> Any:
    import torch

    torch.manual_seed(0)
    if which.startswith("tiny"):
        from thunderviz.demos.models import TinyGPT

        return TinyGPT(**{**TUTORIAL_MODEL, "n_layer": 2 if which == "tiny-2" else TUTORIAL_MODEL["n_layer"]})
    from litgpt import GPT, Config

    from tests.strategies.litgpt_scenarios import CONFIG

    return GPT(Config(**{**CONFIG, "n_layer": 4}))


def capture_on_rank(rank: int, world_size: int, out_dir: str) -> dict[str, str]:
    import torch
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import make_batch
    from thunderviz.thunder.capture.traces import capture
    from thunderviz.thunder.jit.executors import uncompiled_fusions
    from thunderviz.trace.file import save

    paths = {}
    for run, (which, kwargs, kind) in RUNS.items():
        strategy = ThunderFSDPStrategy(**kwargs) if kind == "fsdp" else ThunderDDPStrategy(**kwargs)
        fabric = Fabric(accelerator="cpu", devices=world_size, strategy=strategy)
        fabric.launch()
        with uncompiled_fusions() if "executors" in kwargs else contextlib.nullcontext():
            model = fabric.setup(_model(which))
            x, y = make_batch(batch=2, block_size=16, vocab_size=64, seed=rank)
            logits = model(x)
            fabric.backward(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))
        path = Path(out_dir) / f"{run}-rank{rank}.json"
        save(capture(model, name="GPT" if which == "litgpt" else "TinyGPT", rank=rank, stages=False), path)
        paths[run] = str(path)
        if rank == 0:
            log = [d.to_dict() for d in strategy.decisions]
            (Path(out_dir) / f"{run}-decisions.json").write_text(json.dumps(log), encoding="utf-8")
    return paths


def write_bucketed_traces(out_dir: str | Path, nproc: int = 2) -> dict[str, list[str]]:
    """Run the ranks; ``{run: [rank0.json, rank1.json]}``."""
    from thunderviz.pool.spawn import run_ranks

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    per_rank = run_ranks(capture_on_rank, str(out_dir), nproc=nproc, timeout=600)
    return {run: [r[run] for r in per_rank] for run in RUNS}


def decisions_of(files: list[str]) -> list[Decision]:
    p = Path(files[0])
    log = p.with_name(p.name.split("-rank")[0] + "-decisions.json")
    return [Decision.from_dict(d) for d in json.loads(log.read_text(encoding="utf-8"))]


def run_report(run: str, files: list[str]) -> Any:
    """The ``RunReport`` a ``%%thunder_fsdp --name <run>`` cell would have returned for these files: every rank's
    bundle and ledger, the decision log, the run's strategy, each rank's measured RSS (this process's, a stand-in)."""
    import psutil

    from thunderviz.cell.protocol import ReportData, StrategySpec
    from thunderviz.reports.run_report import RunReport
    from thunderviz.trace.file import load
    from thunderviz.trace.ledger import ledger_from_bundle

    _, kwargs, kind = RUNS[run]
    decisions = decisions_of(files)
    collected = {}
    for path in files:
        (bundle,) = load(path)
        collected[bundle.rank] = ReportData(
            rank=bundle.rank,
            decisions=decisions,
            bundles={bundle.name: bundle},
            ledgers={bundle.name: ledger_from_bundle(bundle)},
            memory={"rss_bytes": psutil.Process().memory_info().rss},
            problems=[],
        )
    spec = StrategySpec(f"thunder_{kind}", dict(kwargs))
    report = RunReport.from_ranks(
        collected, outputs=dict.fromkeys(collected, ""), world_size=2, backend="gloo", strategy=spec, seconds=1.0
    )
    report.name = run
    return report


@once_per_run
def bucketed_trace_files() -> dict[str, list[str]]:
    """``write_bucketed_traces`` once per test run (shared by the xdist workers), into a fresh temporary folder.

    ``THUNDERVIZ_BUCKETED_TRACES=<folder>`` reuses files an earlier ``python -m tests.helpers.bucketed_traces
    <folder>`` wrote (while working on the views; CI never sets it, so it always tests fresh traces).
    """
    return trace_files("THUNDERVIZ_BUCKETED_TRACES", RUNS, write_bucketed_traces, "thunderviz-bucketed-traces-")


if __name__ == "__main__":
    import sys
    import time

    t0 = time.perf_counter()
    print(write_bucketed_traces(sys.argv[1] if len(sys.argv) > 1 else "test-output/bucketed-traces"))
    print(f"{time.perf_counter() - t0:.1f} s")
