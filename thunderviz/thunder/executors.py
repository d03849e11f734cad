"""What the executor rule (``parallel.decisions.decide_executors``) needs from the installed thunder and torch, and the
one change that makes thunder's fusion executors safe around our collectives.

Why a change to thunder's executors at all: thunder 0.2.6's ``torchcompile`` executor claims every op the torch
executor has, the distributed prims included (``torch_compile_ex._implmap`` is all of the torch executor's). Then

- case 1 and 3: each fusion region is run through ``transform_for_execution`` again, where thunder's own DDP
  gradient bucketing walks producers of region inputs that have none (``IndexError: tuple index out of range`` in
  ``apply_bucketing_to_grad_allreduce``);
- case 2: a region holding an ``all_reduce`` / ``all_gather`` reaches Dynamo, which refuses ``async_op=True``
  (thunder's issue #298).

A collective inside a torch.compile region can never run, so taking the distributed prims out of every fusion
executor's claims turns only failures into working traces; the communication pass (``thunder.comm_pass``) then finds
the collectives where it always did, outside the fusion regions, and buckets them as before.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any

from thunderviz.parallel.decisions import ExecutorFacts

__all__ = ["executor_facts", "keep_collectives_out_of_fusions", "resolve_executors"]

_patch_lock = threading.Lock()


def keep_collectives_out_of_fusions() -> int:
    """Remove the distributed prims from every registered fusion executor's claims; return how many were removed.

    Idempotent, and it touches only fusion executors (``torchcompile`` claims them; nvFuser and the operator
    executors never do): what runs each collective stays the torch executor, exactly as without a fusion executor.
    """
    import thunder.distributed.prims as dist_prims
    from thunder.extend import FusionExecutor, get_all_executors

    removed = 0
    with _patch_lock:
        for ex in get_all_executors():
            if not isinstance(ex, FusionExecutor):
                continue
            claimed = [op for op in ex._implmap if isinstance(op, dist_prims.PrimIDs)]
            for op in claimed:
                del ex._implmap[op]
            removed += len(claimed)
    return removed


def _inductor_problem(device: str) -> str:
    """Why torch.compile's inductor cannot build kernels on ``device`` here ("" when it can)."""
    if device == "cuda":
        from torch.utils._triton import has_triton

        return "" if has_triton() else "triton is not installed (torch.compile's CUDA kernels need it)"
    import torch._inductor.config as inductor_config

    names = [n for n in (os.environ.get("CXX"), *inductor_config.cpp.cxx) if n]
    if any(shutil.which(n) for n in names):
        return ""
    return (
        f"no C++ compiler was found ({' / '.join(dict.fromkeys(names)) or 'g++'}; torch.compile's CPU kernels are C++)."
        " Install one (`apt-get install g++`) or set CXX"
    )


def executor_facts(device: str, user_jitted: Any = None) -> ExecutorFacts:
    """Read the facts for ``decide_executors``: registered executors, thunder's defaults, and whether inductor can
    compile on ``device``; with ``user_jitted`` (case 3), the executors of the user's own thunder.jit call."""
    import thunder
    from thunder.extend import get_all_executors

    installed = tuple(ex.name for ex in get_all_executors())
    defaults = tuple(ex.name for ex in thunder.get_default_executors())
    problem = _inductor_problem(device)
    mine: tuple[str, ...] = ()
    if user_jitted is not None:
        cd = thunder.compile_data(user_jitted)
        mine = tuple(ex.name for ex in getattr(cd, "executors_list", ()) or ())
    return ExecutorFacts(
        device=device,
        installed=installed,
        defaults=defaults,
        inductor_ok=not problem,
        inductor_problem=problem,
        user_jitted=mine,
    )


def resolve_executors(names: tuple[str, ...], given: tuple[Any, ...] | None) -> list[Any]:
    """The list for ``thunder.jit(executors=...)``: each chosen name, as the executor object the user passed when
    they passed one (an executor of their own that is registered under no name), else the name."""
    objects = {getattr(e, "name", None): e for e in (given or ()) if not isinstance(e, str)}
    return [objects.get(n, n) for n in names]
