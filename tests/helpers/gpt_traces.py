"""Real traces of the small GPT (4 blocks, d=128) on 2 gloo ranks, under thunderviz's FSDP and DDP strategies.

The browser test and the render bench need the 1,451-op FSDP backward, one collective per parameter (the largest
trace the views are held to); the bench also compares it with the DDP run. Producing them takes real rank processes
(each strategy's set-up of this model is 30-40 CPU-s per rank: DDP cannot reuse FSDP's interpreted trace), so
``gpt_trace_files`` runs the FSDP one once per pytest session and hands out the saved JSON files, which is also how
a person would keep runs around to compare. The browser test compares DDP with FSDP on the bucketed runs
(``bucketed_traces``), the layout a person sees by default.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from tests.helpers.trace_folder import trace_files
from thunderviz.parallel.decisions import Decision

__all__ = ["capture_gpt_on_rank", "decisions_for", "gpt_trace_files", "write_gpt_traces"]


def capture_gpt_on_rank(rank: int, world_size: int, out_dir: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    """One training step of TinyGPT under each strategy in ``kinds``; saves ``<kind>-rank<r>.json`` per rank."""
    import torch
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import TinyGPT, make_batch
    from thunderviz.thunder.capture.traces import capture
    from thunderviz.trace.file import save

    paths: dict[str, str] = {}
    decisions: dict[str, Any] = {}
    for kind in kinds:
        # One collective per parameter (no buckets): the layout these view tests and the render bench were written
        # around (the 1,451-op FSDP backward); buckets have their own tests (tests/strategies/test_comm_2rank.py).
        if kind == "fsdp":
            strategy = ThunderFSDPStrategy(bucketing_strategy="NONE")
        else:
            strategy = ThunderDDPStrategy(bucket_size_in_mb=0)
        fabric = Fabric(accelerator="cpu", devices=world_size, strategy=strategy)
        fabric.launch()
        torch.manual_seed(0)
        model = fabric.setup_module(TinyGPT(n_layer=4, d_model=128))
        x, y = make_batch(seed=rank)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        fabric.backward(loss)
        bundle = capture(model, name=f"gpt-{kind}", rank=rank, stages=False)  # what fabric.setup returned
        path = Path(out_dir) / f"{kind}-rank{rank}.json"
        save(bundle, path)
        paths[kind] = str(path)
        decisions[kind] = [d.to_dict() for d in getattr(strategy, "decisions", [])]
    return {"paths": paths, "decisions": decisions}


def write_gpt_traces(
    out_dir: str | Path, kinds: tuple[str, ...] = ("fsdp", "ddp"), nproc: int = 2
) -> dict[str, list[str]]:
    """Run the ranks (2: the session's rank pair; another count: fresh processes); return
    ``{kind: [rank0.json, rank1.json, ...]}``."""
    from tests.helpers import rank_pool
    from thunderviz.pool.spawn import run_ranks

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    args = (capture_gpt_on_rank, str(out), tuple(kinds))
    if nproc == rank_pool.WORLD_SIZE:
        per_rank = rank_pool.run_on_pool(*args, timeout=600)
    else:
        per_rank = run_ranks(*args, nproc=nproc, timeout=600)
    for k in kinds:  # the strategies' decision logs, which trace files do not hold
        (out / f"{k}-decisions.json").write_text(json.dumps(per_rank[0]["decisions"][k]), encoding="utf-8")
    return {k: [r["paths"][k] for r in per_rank] for k in kinds}


def decisions_for(trace_file: str | Path) -> list[Decision]:
    """The decision log saved next to a trace file by ``write_gpt_traces`` (``[]`` for older folders)."""
    p = Path(trace_file)
    d = p.with_name(p.name.split("-rank")[0] + "-decisions.json")
    return [Decision.from_dict(row) for row in json.loads(d.read_text(encoding="utf-8"))] if d.exists() else []


@functools.lru_cache(maxsize=1)
def gpt_trace_files() -> dict[str, list[str]]:
    """``write_gpt_traces`` of the FSDP run, once per process, into a fresh temporary folder: ``{"fsdp": [...]}``.

    ``THUNDERVIZ_GPT_TRACES=<folder>`` reuses files an earlier ``python -m tests.helpers.gpt_traces <folder>``
    wrote (saves two minutes while working on the widgets; CI never sets it, so it always tests fresh traces).
    """
    kinds = ("fsdp",)
    return trace_files(
        "THUNDERVIZ_GPT_TRACES", kinds, lambda folder: write_gpt_traces(folder, kinds), "thunderviz-gpt-traces-"
    )


if __name__ == "__main__":
    import sys
    import time

    t0 = time.perf_counter()
    print(write_gpt_traces(sys.argv[1] if len(sys.argv) > 1 else "test-output/gpt-traces"))
    print(f"{time.perf_counter() - t0:.1f} s")
