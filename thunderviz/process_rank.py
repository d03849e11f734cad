"""Where this process sits in its world of ranks: its rank, the world size and the process group's backend.

Why one function: trace capture, the timeline recorder and the rank engine each asked the same question with
different fallbacks (one answered rank 0 of 1 whenever no process group existed, even in a process torchrun started
as rank 3; one read the torchrun environment then). The answer, in order of authority:

1. the default ``torch.distributed`` process group, when one is initialised;
2. the torchrun environment (``RANK``, ``WORLD_SIZE``), which torchrun, ``run_ranks`` and the rank engine set before
   the group exists;
3. rank 0 of a world of 1.

Depends on nothing and never imports torch: a process group can only exist once ``torch.distributed`` was imported,
so it is read from ``sys.modules`` when it is there. Any package may import this module (like ``errors``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

__all__ = ["ProcessRank", "process_rank"]


@dataclass(frozen=True)
class ProcessRank:
    """This process's rank, how many ranks there are, and the backend of its process group (``""`` without one)."""

    rank: int
    world_size: int
    backend: str = ""


def process_rank() -> ProcessRank:
    """This process's place in its world (see the module docstring for the order of authority).

    Raises:
        ValueError: ``RANK`` or ``WORLD_SIZE`` is set but is not a whole number (names the variable and its value).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return ProcessRank(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
    return ProcessRank(_environment_int("RANK", 0), _environment_int("WORLD_SIZE", 1))


def _environment_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"{name}={value!r} in the environment is not a whole number; set it as torchrun does (e.g. {name}=0) "
            "or unset it"
        ) from None
