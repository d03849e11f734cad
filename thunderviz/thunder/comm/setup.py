"""Attaching a communication plan to a module whose parameters a strategy distributed: ``configure_comm``.

The plan is per parameter (``parallel.buckets.CommConfig``), so it travels with the tensor into whatever thunder traces
it — the module jitted by the strategy (case 1), the user's own ThunderModule (case 3) or a jitted function that
takes the module (case 2) — and the trace-time hook (``thunder_hooks``) hands it to the communication pass
(``thunder.comm.comm_pass``). Call it after the parameters are distributed and before the first traced call.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from thunderviz.parallel.buckets import CommConfig, bucket_label, find_blocks
from thunderviz.parallel.option_values import FIRST_BUCKET_SIZE_IN_MB, Bucketing, Parallelism
from thunderviz.parallel.strategy_options import StrategyOptions
from thunderviz.thunder import param_tags
from thunderviz.thunder.modules import user_module

__all__ = ["configure_comm"]

_MIB = 1024 * 1024


def configure_comm(module: Any, options: StrategyOptions) -> list[CommConfig]:
    """Attach a ``CommConfig`` to every parameter of ``module`` that a thunderviz strategy distributed.

    What each option means for the collectives is said once, in ``parallel.options.OPTIONS``: FSDP's
    ``sharding_strategy`` (ZERO3 gathers every bucket again in backward, as FSDP2 with ``reshard_after_forward=True``
    on every module, the root included) and ``bucketing_strategy`` (``parallel.buckets``); DDP's
    ``bucket_size_in_mb``, with a first bucket capped at ``FIRST_BUCKET_SIZE_IN_MB`` so the first all_reduce starts
    while most of backward is still to run (as torch DDP; on a 4-block GPT on 2 CPU ranks it took 7-10 ms off the
    wall time of a step at the same CPU time, ``bench/comm_overhead.py``).

    Args:
        module: the set-up module (Fabric's wrapper, a ThunderModule or the plain module; its parameters must
            already be sharded or replicated).
        options: the strategy's parsed options.

    Returns:
        The configs attached, in parameter order.
    """
    inner: nn.Module = user_module(module)
    blocks = find_blocks(inner) if options.bucketing_strategy is Bucketing.BLOCK else []
    owner = type(inner).__name__
    cap = int(options.bucket_size_in_mb * _MIB)
    first_cap = int(min(FIRST_BUCKET_SIZE_IN_MB, options.bucket_size_in_mb) * _MIB)
    reduce_dtype = None if options.reduce_dtype is None else str(options.reduce_dtype)
    configs = []
    for name, param in inner.named_parameters(remove_duplicate=True):
        kind = param_tags.sync_tag(param)
        if kind is None:
            continue
        if kind == param_tags.SyncKind.FULLY_SHARDED:
            config = CommConfig(
                param_name=name,
                owner=owner,
                owner_id=id(inner),
                parallelism=Parallelism.FSDP,
                label=bucket_label(name, options.bucketing_strategy, blocks),
                bucketing=options.bucketing_strategy,
                reshard_after_forward=options.reshard_after_forward,
                reduce_dtype=reduce_dtype,
            )
            # Where no_backward_sync keeps this parameter's unsharded gradient (thunder.comm.accumulation).
            param_tags.set_accumulator(param, config.key, name)
        else:
            config = CommConfig(
                param_name=name,
                owner=owner,
                owner_id=id(inner),
                parallelism=Parallelism.DDP,
                label="",
                bucket_cap_bytes=cap,
                first_bucket_cap_bytes=first_cap,
                reduce_dtype=reduce_dtype,
            )
        param_tags.set_comm_config(param, config)
        configs.append(config)
    return configs
