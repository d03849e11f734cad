"""What the browser test's Memory view draws: a real plan (two candidates of a small tied-head GPT on 2 ranks, with a
budget between their predicted peaks) and thunder's saved tensors against eager's for the same model.

Made once per process (a plan rehearses each candidate through thunder: tens of CPU-seconds), and handed to the
notebook pickled, as the trace files are handed to it by path. One block is enough for everything the view is held
to (a bar per candidate, one over the budget and one under it, saved tensors by module and by line, lines where
thunder saves more than eager): the plan and the comparison took 34 CPU-s here, against 56 with the 2-block model of
``thunderviz.demos.memory_runs`` (``gpt-tied``).
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

__all__ = ["memory_view_file", "memory_view_inputs"]

CANDIDATES = ("ddp", "fsdp-zero3-layer")
#: ``memory_runs``' tied-head GPT with one block instead of two
MODEL = {"vocab_size": 256, "block_size": 32, "d_model": 64, "n_layer": 1, "n_head": 4, "tie_weights": True}
BATCH = (4, 32)


@functools.cache
def memory_view_inputs() -> tuple[Any, Any]:
    import torch

    from thunderviz import plan
    from thunderviz.demos.models import TinyGPT
    from thunderviz.thunder.memory.saved_compare import compare_saved

    build = functools.partial(TinyGPT, **MODEL)
    x = torch.empty(BATCH, dtype=torch.long, device="meta")
    y = torch.empty(BATCH, dtype=torch.long, device="meta")

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    planned = plan(build, x, loss_fn=loss_fn, optimizer="adamw", world_sizes=(2,), device="cpu", candidates=CANDIDATES)
    ddp, zero3 = (planned.candidate(c).peak_bytes for c in CANDIDATES)
    budgeted = planned.with_budget((ddp + zero3) // 2)
    return budgeted, compare_saved(build(), x)


def memory_view_file(folder: Path) -> Path:
    path = folder / "memory-view.pkl"
    path.write_bytes(pickle.dumps(memory_view_inputs()))
    return path
