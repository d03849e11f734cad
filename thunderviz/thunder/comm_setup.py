"""Attaching a communication plan to a module whose parameters a strategy distributed: ``configure_comm``.

The plan is per parameter (``parallel.buckets.CommConfig``), so it travels with the tensor into whatever thunder traces
it — the module jitted by the strategy (case 1), the user's own ThunderModule (case 3) or a jitted function that
takes the module (case 2) — and the trace-time hook (``thunder_hooks``) hands it to the communication pass
(``thunder.comm_pass``). Call it after the parameters are distributed and before the first traced call.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from thunderviz.parallel.buckets import BUCKETING_CHOICES, CommConfig, bucket_label, find_blocks
from thunderviz.thunder import hooks
from thunderviz.thunder.modules import user_module

__all__ = ["configure_comm", "unwrap_module"]

_MIB = 1024 * 1024

#: The name tests/strategies know (``thunder.modules.user_module`` is the one implementation).
unwrap_module = user_module


def configure_comm(
    module: Any,
    *,
    sharding_strategy: str = "ZERO2",
    bucketing_strategy: str = "NONE",
    bucket_size_in_mb: float = 25.0,
    first_bucket_size_in_mb: float = 1.0,
) -> list[CommConfig]:
    """Attach a ``CommConfig`` to every parameter of ``module`` that a thunderviz strategy distributed.

    Args:
        module: the set-up module (Fabric's wrapper, a ThunderModule or the plain module; its parameters must
            already be sharded or replicated).
        sharding_strategy: FSDP only: ``"ZERO2"`` keeps the unsharded parameters from forward for backward;
            ``"ZERO3"`` gathers every bucket again in backward from its shards (as FSDP2 with
            ``reshard_after_forward=True`` on every module, the root included), so forward saves shards only.
        bucketing_strategy: FSDP only: ``"NONE"``, ``"LAYER"`` or ``"BLOCK"`` (see ``parallel.buckets``).
        bucket_size_in_mb: DDP only: gradients per all_reduce bucket; ``0`` gives one all_reduce per gradient.
        first_bucket_size_in_mb: DDP only: a smaller cap for the first bucket, so the first all_reduce starts while
            most of backward is still to run (1 MiB, as torch DDP); ``0`` uses ``bucket_size_in_mb`` for every
            bucket. On a 4-block GPT on 2 CPU ranks it took 7-10 ms off the wall time of a step, at the same CPU
            time (``bench/comm_overhead.py``).

    Returns:
        The configs attached, in parameter order.
    """
    if sharding_strategy not in ("ZERO2", "ZERO3"):
        raise ValueError(f"configure_comm(sharding_strategy={sharding_strategy!r}): choose 'ZERO2' or 'ZERO3'.")
    if bucketing_strategy not in BUCKETING_CHOICES:
        raise ValueError(
            f"configure_comm(bucketing_strategy={bucketing_strategy!r}): choose one of"
            f" {', '.join(repr(c) for c in BUCKETING_CHOICES)}."
        )
    if bucket_size_in_mb < 0 or first_bucket_size_in_mb < 0:
        raise ValueError("configure_comm: bucket sizes must be >= 0 (0 disables DDP bucketing).")
    inner: nn.Module = user_module(module)
    blocks = find_blocks(inner) if bucketing_strategy == "BLOCK" else []
    owner = type(inner).__name__
    configs = []
    for name, param in inner.named_parameters(remove_duplicate=True):
        kind = hooks.sync_tag(param)
        if kind is None:
            continue
        if kind == hooks.SyncKind.FULLY_SHARDED:
            label = bucket_label(name, bucketing_strategy, blocks)
            config = CommConfig(
                param_name=name,
                owner=owner,
                owner_id=id(inner),
                parallelism="fsdp",
                label=label,
                bucketing=bucketing_strategy,
                reshard_after_forward=sharding_strategy == "ZERO3",
            )
        else:
            config = CommConfig(
                param_name=name,
                owner=owner,
                owner_id=id(inner),
                parallelism="ddp",
                label="",
                bucketing="SIZE",
                bucket_cap_bytes=int(bucket_size_in_mb * _MIB),
                first_bucket_cap_bytes=int(min(first_bucket_size_in_mb, bucket_size_in_mb) * _MIB),
            )
        hooks.set_comm_config(param, config)
        configs.append(config)
    return configs
