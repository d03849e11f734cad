"""What the browser test's Memory view draws: a real plan (two candidates of a small tied-head GPT on 2 ranks, with a
budget between their predicted peaks) and thunder's saved tensors against eager's for the same model.

Made once per process (a plan rehearses each candidate through thunder: tens of seconds), and handed to the
notebook pickled, as the trace files are handed to it by path.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

__all__ = ["memory_view_file", "memory_view_inputs"]

CANDIDATES = ("ddp", "fsdp-zero3-layer")


@functools.cache
def memory_view_inputs() -> tuple[Any, Any]:
    from thunderviz.demos.memory_runs import MODELS, predict
    from thunderviz.thunder.memory.saved_compare import compare_saved

    plan = predict("gpt-tied", "adamw", (2,), candidates=CANDIDATES)
    ddp, zero3 = (plan.candidate(c).peak_bytes for c in CANDIDATES)
    budgeted = plan.with_budget((ddp + zero3) // 2)
    model = MODELS["gpt-tied"]
    x, _ = model.batch(0, "meta")
    return budgeted, compare_saved(model.build(), x)


def memory_view_file(folder: Path) -> Path:
    path = folder / "memory-view.pkl"
    path.write_bytes(pickle.dumps(memory_view_inputs()))
    return path
