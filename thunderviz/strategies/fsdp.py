"""``ThunderFSDPStrategy``: fully sharded data parallel for thunder-jitted models, decided by ``parallel.decisions``."""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as tdist
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from torch import nn
from typing_extensions import override

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.decisions import Decision, decide_mesh, impossible
from thunderviz.parallel.option_values import Parallelism
from thunderviz.strategies.base import ThunderParallelStrategy
from thunderviz.strategies.materialize import has_meta_tensors, materialize_, rank0_generator_state
from thunderviz.strategies.mesh import mesh_facts, mesh_groups
from thunderviz.strategies.registry import register_strategy_names
from thunderviz.thunder import hooks, param_tags
from thunderviz.thunder.comm import distribute
from thunderviz.thunder.compile_state import fsdp_enums
from thunderviz.thunder.modules import user_module

__all__ = ["ThunderFSDPStrategy"]


class ThunderFSDPStrategy(ThunderParallelStrategy):
    """Shards every parameter along dim 0 across ranks; gathers them per bucket in forward, reduce-scatters grads.

    A model built under ``fabric.init_module(empty_init=True)`` stays on the meta device until ``fabric.setup``,
    which materializes it module by module with each module's ``reset_parameters()`` (rank 0's random generator
    on every rank) and keeps only this rank's shard of each parameter right away: a rank's peak memory is its
    shards plus the largest single module. ``fabric.no_backward_sync(model)`` accumulates micro-batches without
    any reduce_scatter (``_ShardedBackwardSyncControl``), at the cost of one unsharded gradient per parameter kept
    between micro-batches. The options are ``parallel.options.OPTIONS``; ``sharding_strategy`` and
    ``bucketing_strategy`` read back as thunder's own enums (``strategy.sharding_strategy is FSDPType.ZERO3``).
    """

    parallelism = Parallelism.FSDP

    @property
    def sharding_strategy(self) -> Any:
        """thunder's ``FSDPType`` member of the ``sharding_strategy`` option (for hybrid sharding, the level within
        the shard group: ``HYBRID_SHARD`` reads back as ZERO3)."""
        return fsdp_enums()[0][self.options.sharding_strategy.level.value]

    @property
    def bucketing_strategy(self) -> Any:
        """thunder's ``FSDPBucketingStrategy`` member of the ``bucketing_strategy`` option."""
        return fsdp_enums()[1][self.options.bucketing_strategy.value]

    @override
    def _make_backward_sync_control(self) -> _BackwardSyncControl | None:
        return _ShardedBackwardSyncControl()

    @override
    def _decide_layout(self, decision: Decision) -> list[Decision]:
        self._mesh = None
        if not self.options.hybrid:
            return []
        try:
            row = decide_mesh(mesh_facts(), self.options, decision.target, decision.case)
        except JitDecisionError as err:
            self.decisions.append(impossible(decision.target, err, self.options))
            raise
        if row.warning:
            warnings.warn(row.warning, UserWarning, stacklevel=5)  # the user's fabric.setup(...) line
        self._mesh = mesh_groups(row.mesh, self.root_device.type)
        self._mesh_shape = row.mesh
        return [row]

    def _groups(self) -> tuple[tdist.ProcessGroup, tdist.ProcessGroup | None]:
        """The group parameters are sharded over, and (hybrid sharding, more than one replica) the replica group."""
        mesh = getattr(self, "_mesh", None)
        if mesh is None:
            return self.process_group, None
        return mesh.shard, mesh.replica if self._mesh_shape[0] > 1 else None

    @override
    def _distribute_(self, module: nn.Module) -> dict[int, torch.Tensor]:
        (group, replicas), device = self._groups(), self.root_device
        replaced: dict[int, torch.Tensor] = {}
        done: frozenset[int] = frozenset()
        if has_meta_tensors(module):
            # Every rank starts from rank 0's generator (the replicas too), then keeps its shard-group shard.
            with rank0_generator_state(device, self.process_group):
                replaced = materialize_(
                    module, device, keep=lambda _name, p: distribute.shard_param_(p, group, replicas)
                )
            done = frozenset(id(p) for p in module.parameters() if distribute.is_sharded(p))
        distribute.shard_params_(module, group, device, done=done, replica_group=replicas)
        return replaced

    @override
    def backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        super().backward(tensor, module, *args, **kwargs)
        if not hooks.is_skipping_grad_sync():
            # A synchronizing backward reduces every bucket together with what was accumulated for it; anything
            # still pending was left out of a reduction, and the gradients would silently miss those micro-batches.
            left = _pending_params(self._setup_modules)
            if left:
                raise RuntimeError(
                    f"thunderviz: after a synchronizing backward, gradients accumulated under `no_backward_sync` for"
                    f" {', '.join(left[:3])}{' ...' if len(left) > 3 else ''} were not reduced (their reduction is not"
                    " one thunderviz's communication pass recognised). Accumulate without `no_backward_sync` for this"
                    " model, and report this."
                )

    @override
    def _pending_accumulation(self) -> list[str]:
        return _pending_params(self._setup_modules)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        register_strategy_names(strategy_registry, only=Parallelism.FSDP)


def _pending_params(modules: list[nn.Module]) -> list[str]:
    """Names of sharded parameters whose accumulated gradient waits for a synchronizing backward."""
    from thunderviz.thunder.comm.accumulation import any_pending

    if not any_pending():
        return []
    out = []
    for module in modules:
        for name, p in user_module(module).named_parameters():
            acc = param_tags.accumulator(p)
            if acc is not None and acc.pending:
                out.append(name)
    return out


class _ShardedBackwardSyncControl(_BackwardSyncControl):
    """FSDP's ``no_backward_sync``: backward inside it reduce_scatters nothing.

    thunder keys the jitted object's cache on the no-sync mode (``hooks._key_cache_on_no_sync``), so micro-batches
    inside the block run a backward of their own, in which the communication pass adds each bucket's unsharded
    gradients to the parameters' accumulators (``thunder.comm.accumulation``) and returns no gradient for them; the next
    backward outside the block reduces each bucket once, accumulated micro-batches included. The result equals
    reducing the sum of all micro-batches' gradients, as torch FSDP2's ``set_requires_gradient_sync(False)`` does.
    """

    @override
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager:
        return hooks.skip_grad_sync() if enabled else nullcontext()
