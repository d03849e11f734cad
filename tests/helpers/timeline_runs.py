"""A real 2-rank gloo FSDP run recorded with ``record_timeline``, shared by the timeline tests (once per test run).

Each rank builds a 1-block GPT under ``ThunderFSDPStrategy`` through Fabric, runs the training steps a
``record_timeline(steps=STEPS)`` observes (``observed_steps``: one to compile, STEPS recorded, one settling, two timed
with the profiler stopped) inside it (rank 1 sleeps SLEEP_S before every backward, the straggler the analysis must
name), saves its recording to its own file as a torchrun job would (and the model's trace bundle next to it, for a
graph of the same run), and reports what it checked from inside (patches undone, recording stopped by itself).
Then, in the same processes (the model already compiled), QUIET_REPEATS more recordings with nobody sleeping, under
FSDP and under DDP: the runs in which no straggler may be named (two ranks sharing CPUs take turns arriving last).
Run it by hand to refresh the files: ``python -m tests.helpers.timeline_runs DIR``.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.rank_pool import run_on_pool
from tests.helpers.run_once import once_per_run
from thunderviz.pool.spawn import run_ranks

STEPS = 4
# Well above what two ranks sharing 2 busy CPU cores lose to each other (tens of ms; see STRAGGLER_RULE).
SLEEP_S = 0.1
QUIET_REPEATS = 2
# Unslowed recordings are longer: scheduling is correlated over tens of ms, so on a machine busy with other work (CI's
# second pytest worker) one rank can lose every one of 4 consecutive ~12 ms steps (a CI run: rank 0 last in 4 of 4,
# the other waiting 37-66% of each step). Over 12 steps the turns even out; the sleeping run keeps STEPS.
QUIET_STEPS = 12
MODEL_KW = {"vocab_size": 64, "block_size": 16, "d_model": 32, "n_layer": 1, "n_head": 2}


@dataclass
class RankRun:
    rank: int
    path: str
    traces: str
    restored: bool
    recording_after: bool
    boundaries: int
    #: the unslowed recordings of this rank: (strategy kind, path), QUIET_REPEATS per kind
    quiet: list[tuple[str, str]]
    #: per unslowed recording, in the same order: the seconds this rank was ready to run but waited for a CPU (the
    #: kernel's run-queue delay, /proc/self/schedstat): what another process on the machine took from it
    cpu_waits: list[float] = dataclasses.field(default_factory=list)


def record_fsdp(rank: int, world_size: int, out_dir: str, kind: str = "fsdp", sleep_s: float = SLEEP_S) -> RankRun:
    import time

    import torch
    import torch.distributed as dist
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import TinyGPT, make_batch
    from thunderviz.timeline.record import observed_steps, record_timeline

    strategy = ThunderFSDPStrategy() if kind == "fsdp" else ThunderDDPStrategy()
    fabric = Fabric(accelerator="cpu", devices=world_size, strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    model = fabric.setup(TinyGPT(**MODEL_KW))
    opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = make_batch(batch=2, block_size=MODEL_KW["block_size"], vocab_size=MODEL_KW["vocab_size"])
    originals = {
        name: getattr(dist, name) for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
    }
    with record_timeline(steps=STEPS, fabric=fabric, name=f"gpt-{kind}") as rec:
        # one warm-up step, STEPS recorded, and after the recording stopped one settling step and the unprofiled ones
        for _ in range(observed_steps(STEPS)):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            if rank == 1 and sleep_s:
                time.sleep(sleep_s)
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()
        recording_after = rec.recording
    restored = all(getattr(dist, n) is f for n, f in originals.items()) and "backward" not in vars(fabric)
    path = str(Path(out_dir) / f"{kind}-rank{rank}.json")
    rec.save(path)
    from thunderviz.thunder.capture.traces import capture
    from thunderviz.trace.file import save

    traces = str(Path(out_dir) / f"{kind}-traces-rank{rank}.json")
    save(capture(model, name="TinyGPT", rank=rank, stages=False), traces)
    quiet, waits = _record_quiet(rank, out_dir, kind, fabric, model, opt, x, y)
    ddp = ThunderDDPStrategy()
    fabric = Fabric(accelerator="cpu", devices=world_size, strategy=ddp)
    fabric.launch()
    torch.manual_seed(0)
    model = fabric.setup(TinyGPT(**MODEL_KW))
    opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    more, more_waits = _record_quiet(rank, out_dir, "ddp", fabric, model, opt, x, y)
    return RankRun(rank, path, traces, restored, recording_after, rec._boundaries, quiet + more, waits + more_waits)


def _cpu_wait_s() -> float:
    """How long this process's main thread has been ready to run without a CPU (Linux's schedstat run delay)."""
    return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9


def _record_quiet(rank: int, out_dir: str, kind: str, fabric, model, opt, x, y) -> tuple[list, list[float]]:
    """QUIET_REPEATS recordings of QUIET_STEPS steps in which no rank sleeps, and how long this rank waited for a
    CPU during each."""
    import torch

    from thunderviz.timeline.record import record_timeline

    out, waits = [], []
    for i in range(QUIET_REPEATS):
        before = _cpu_wait_s()
        with record_timeline(steps=QUIET_STEPS, fabric=fabric, name=f"quiet-{kind}-{i}") as rec:
            for _ in range(QUIET_STEPS + 1):
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                fabric.backward(loss)
                opt.step()
                opt.zero_grad()
        waits.append(_cpu_wait_s() - before)
        path = str(Path(out_dir) / f"quiet-{kind}-{i}-rank{rank}.json")
        rec.save(path)
        out.append((kind, path))
    return out, waits


def recorded(kind: str = "fsdp") -> list[RankRun]:
    """The run for ``kind``, recorded once per test run, shared by the xdist workers (``recorded()`` and
    ``recorded("fsdp")`` are one run)."""
    return _recorded(kind)


@once_per_run
def _recorded(kind: str) -> list[RankRun]:
    out_dir = tempfile.mkdtemp(prefix=f"thunderviz-timeline-{kind}-")
    return run_on_pool(record_fsdp, out_dir, kind, timeout=400)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    Path(out).mkdir(parents=True, exist_ok=True)
    print([r.path for r in run_ranks(record_fsdp, out, nproc=2, timeout=400)])
