"""Real traces under the strategies' default buckets, once per pytest session: the tutorial's model (TinyGPT, 4
blocks, d=32) under FSDP ZERO2 and ZERO3 and DDP, and with thunder's ``torchcompile`` fusion executor under ZERO2
(``fused``: fusion regions spanning modules; 2 blocks, since its other executors make it compile afresh: measured
side by side, 0.80x the first 4-block ZERO2 set-up, where 4 blocks took 1.47x), and a litgpt ``GPT`` under FSDP
ZERO3, on 2 gloo ranks. The fused run builds
thunder's real regions but runs their ops one by one (``executors.uncompiled_fusions``, as the memory plan's
rehearsal does): inductor's C++ compile of each region (tens of seconds on a cold cache) changes nothing traced.

The graph-order test, the comparison's naming and summary, and the browser tour's readability checks need what a
person sees by default: BLOCK buckets (a root bucket and one per block), not the one-collective-per-parameter
layout of ``gpt_traces``. Every run saves one file per rank and its decision log, as a torchrun job would.

The runs are made in ``GROUPS`` on the session's rank pair (``rank_pool``; fresh processes cost a start and the
imports first), each group once per test run and only when a test asks for one of its runs: the browser tour never
waits for the litgpt model (per rank the costliest set-up here, 54 CPU-s against 37 for the tutorial model's
ZERO2), which only the graph-order test draws. The tutorial model's three runs are one job, so ZERO3 reuses ZERO2's
interpreted trace in the same processes (10 CPU-s against 37).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from tests.helpers.run_once import once_per_run
from tests.helpers.trace_folder import trace_files
from thunderviz.parallel.decisions import Decision

__all__ = [
    "GROUPS",
    "RUNS",
    "TUTORIAL_MODEL",
    "bucketed_trace_files",
    "decisions_of",
    "run_report",
    "write_bucketed_traces",
]

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
#: runs made together, in one job: a test's runs are made group by group, each group once per test run
GROUPS = {"tutorial": ("zero2", "zero3", "ddp"), "fused": ("fused",), "litgpt": ("litgpt",)}


def _model(which: str) -> Any:
    import torch

    torch.manual_seed(0)
    if which.startswith("tiny"):
        from thunderviz.demos.models import TinyGPT

        return TinyGPT(**{**TUTORIAL_MODEL, "n_layer": 2 if which == "tiny-2" else TUTORIAL_MODEL["n_layer"]})
    from litgpt import GPT, Config

    from tests.strategies.litgpt_scenarios import CONFIG

    return GPT(Config(**{**CONFIG, "n_layer": 4}))


def capture_on_rank(rank: int, world_size: int, out_dir: str, runs: tuple[str, ...] = tuple(RUNS)) -> dict[str, str]:
    import torch
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import make_batch
    from thunderviz.thunder.capture.traces import capture
    from thunderviz.thunder.jit.executors import uncompiled_fusions
    from thunderviz.trace.file import save

    paths = {}
    for run in runs:
        which, kwargs, kind = RUNS[run]
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


def write_bucketed_traces(out_dir: str | Path, runs: tuple[str, ...] = tuple(RUNS)) -> dict[str, list[str]]:
    """Run ``runs`` on the session's rank pair; ``{run: [rank0.json, rank1.json]}``."""
    from tests.helpers.rank_pool import run_on_pool

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    per_rank = run_on_pool(capture_on_rank, str(out_dir), tuple(runs), timeout=600)
    return {run: [r[run] for r in per_rank] for run in runs}


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


def bucketed_trace_files(*runs: str) -> dict[str, list[str]]:
    """``{run: [rank0.json, rank1.json]}`` for ``runs`` (every run of ``RUNS`` when none is named), made by their
    groups, each once per test run (shared by the xdist workers), into fresh temporary folders.

    ``THUNDERVIZ_BUCKETED_TRACES=<folder>`` reuses files an earlier ``python -m tests.helpers.bucketed_traces
    <folder>`` wrote (while working on the views; CI never sets it, so it always tests fresh traces).
    """
    wanted = runs or tuple(RUNS)
    unknown = sorted(set(wanted) - set(RUNS))
    if unknown:
        raise ValueError(f"bucketed_trace_files: no run named {unknown}; the runs are {sorted(RUNS)}")
    files: dict[str, list[str]] = {}
    for group, members in GROUPS.items():
        if set(members) & set(wanted):
            files.update(_group_files(group))
    return {run: files[run] for run in wanted}


@once_per_run
def _group_files(group: str) -> dict[str, list[str]]:
    members = GROUPS[group]
    return trace_files(
        "THUNDERVIZ_BUCKETED_TRACES",
        members,
        lambda folder: write_bucketed_traces(folder, members),
        f"thunderviz-bucketed-{group}-",
    )


if __name__ == "__main__":
    import sys
    import time

    t0 = time.perf_counter()
    print(write_bucketed_traces(sys.argv[1] if len(sys.argv) > 1 else "test-output/bucketed-traces"))
    print(f"{time.perf_counter() - t0:.1f} s")
