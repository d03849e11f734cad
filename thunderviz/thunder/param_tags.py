"""What our strategies attach to a parameter they distribute, in the attributes thunder and our hooks read.

The tag is thunder's own format where thunder reads it: ``distparallel_type`` (read by
``thunder.core.proxies.tensorproxy``) and its FSDP padding. The rest is ours: the process group (and, for hybrid
sharding, the replica group), the unsharded shape, the communication plan (``parallel.buckets.CommConfig``) and the
gradient accumulator of ``no_backward_sync``. The sync hook (``thunder.hooks``) reads them when thunder traces.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist

__all__ = [
    "SyncKind",
    "accumulator",
    "comm_config",
    "full_shape",
    "param_group",
    "recorded_full_shape",
    "replica_group",
    "set_accumulator",
    "set_comm_config",
    "sync_tag",
    "tag_param",
]

# Attribute names we put on parameters. ``distparallel_type`` and ``_thunder_fsdp_padding_size`` are thunder's own
# (read by ``tensorproxy``); the group is ours.
_TYPE_ATTR = "distparallel_type"
_PADDING_ATTR = "_thunder_fsdp_padding_size"
_GROUP_ATTR = "_thunderviz_process_group"
_REPLICA_GROUP_ATTR = "_thunderviz_replica_group"
_FULL_SHAPE_ATTR = "_thunderviz_full_shape"
_COMM_ATTR = "_thunderviz_comm"
_ACCUMULATOR_ATTR = "_thunderviz_accumulator"


class SyncKind:
    """The two ways a parameter can be distributed; values are thunder's ``DistParallelType`` names."""

    FULLY_SHARDED = "FULLY_SHARDED"
    REPLICATED = "REPLICATED"


def _dist_type(kind: str) -> Any:
    from thunder.core.proxies import DistParallelType

    return getattr(DistParallelType, kind)


def tag_param(
    param: torch.Tensor,
    kind: str,
    *,
    group: tdist.ProcessGroup,
    padding: int,
    full_shape: tuple[int, ...],
    replica_group: tdist.ProcessGroup | None = None,
) -> None:
    """Mark a parameter our strategies distributed, in the attributes thunder and our sync hook read.

    ``replica_group`` (hybrid sharding): the ranks that hold this same shard; its reduced gradient is all-reduced
    over them. thunder knows nothing of it: the communication pass adds that all_reduce.
    """
    setattr(param, _TYPE_ATTR, _dist_type(kind))
    setattr(param, _PADDING_ATTR, padding if padding else None)
    setattr(param, _GROUP_ATTR, group)
    setattr(param, _FULL_SHAPE_ATTR, tuple(full_shape))
    setattr(param, _REPLICA_GROUP_ATTR, replica_group)


def sync_tag(param: torch.Tensor) -> str | None:
    """The SyncKind a parameter was tagged with by ``tag_param``, or None."""
    if getattr(param, _GROUP_ATTR, None) is None:
        return None
    return getattr(param, _TYPE_ATTR).name


def param_group(param: torch.Tensor) -> tdist.ProcessGroup | None:
    """The process group a tagged parameter is distributed over (None when untagged)."""
    return getattr(param, _GROUP_ATTR, None)


def replica_group(param: torch.Tensor) -> tdist.ProcessGroup | None:
    """Hybrid sharding: the group over which a sharded parameter is replicated (None otherwise)."""
    return getattr(param, _REPLICA_GROUP_ATTR, None)


def full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The unsharded shape of a tagged parameter (its own shape when untagged)."""
    return tuple(getattr(param, _FULL_SHAPE_ATTR, tuple(param.shape)))


def recorded_full_shape(tensor: Any) -> tuple[int, ...] | None:
    """The unsharded shape ``tag_param`` recorded on ``tensor``, or None when it carries none."""
    return getattr(tensor, _FULL_SHAPE_ATTR, None)


def set_comm_config(param: torch.Tensor, config: Any) -> None:
    """Attach a parameter's communication plan (a ``parallel.buckets.CommConfig``); traces made later follow it."""
    if sync_tag(param) is None:
        raise ValueError("set_comm_config: the parameter is not distributed by thunderviz (no sync tag)")
    setattr(param, _COMM_ATTR, config)


def comm_config(param: torch.Tensor) -> Any:
    """The ``CommConfig`` attached by ``set_comm_config``, or None."""
    return getattr(param, _COMM_ATTR, None)


def set_accumulator(param: torch.Tensor, key: str, name: str) -> Any:
    """Give a sharded parameter the ``GradAccumulator`` its no_backward_sync gradients go to (kept if it has one)."""
    from thunderviz.thunder.comm import accumulation

    found = getattr(param, _ACCUMULATOR_ATTR, None)
    if found is None:
        found = accumulation.GradAccumulator(name, key)
        setattr(param, _ACCUMULATOR_ATTR, found)
    return accumulation.register(found, key)


def accumulator(param: torch.Tensor) -> Any:
    """The parameter's ``GradAccumulator`` (``thunder.comm.accumulation``), or None."""
    return getattr(param, _ACCUMULATOR_ATTR, None)
