"""This process's rank and world size, for labelling what it captures: the default process group's, else 0 of 1."""

from __future__ import annotations

__all__ = ["rank_and_world_size"]


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, or ``(0, 1)`` when none is initialized."""
    return _dist_rank(), _dist_world_size()


def _dist_rank() -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:
        return 0


def _dist_world_size() -> int:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:
        return 1
