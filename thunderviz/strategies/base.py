"""What the two thunder strategies share: the decision log, carrying out a decision, clipping, checkpoints.

Built on Fabric's ``DDPStrategy`` for what is not ours to redo (cluster environment, process group set-up,
``all_reduce``/``barrier``/``broadcast``, launchers); everything thunder-specific goes through
``thunderviz.parallel.decisions`` (what to do) and ``thunderviz.thunder.hooks`` (how). Models built on the meta
device are materialized by ``strategies.materialize``, gradients clipped by ``strategies.clipping``, checkpoints
written and read by ``strategies.checkpoint``.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist
from lightning.fabric.strategies import DDPStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from lightning.fabric.utilities.distributed import _distributed_is_initialized
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.decisions import (
    DEFAULT_BUCKETING_STRATEGY,
    Action,
    Decision,
    StrategyOptions,
    decide,
    validate_options,
)
from thunderviz.strategies import checkpoint, clipping
from thunderviz.strategies.materialize import has_meta_tensors
from thunderviz.thunder import hooks
from thunderviz.thunder.comm_setup import configure_comm
from thunderviz.thunder.facts import inspect_object

__all__ = ["ThunderParallelStrategy"]

_DEFAULT_TIMEOUT = timedelta(minutes=30)
STATE_DICT_TYPES = ("full", "sharded")


class ThunderParallelStrategy(DDPStrategy):
    """Base of ``ThunderFSDPStrategy`` and ``ThunderDDPStrategy``; not registered itself."""

    parallelism: str = ""

    def __init__(
        self,
        jit: bool = True,
        executors: Iterable[Any] | None = None,
        state_dict_type: str = "sharded",
        *,
        sharding_strategy: str = "ZERO2",
        bucketing_strategy: str = DEFAULT_BUCKETING_STRATEGY,
        bucket_size_in_mb: float = 25.0,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = _DEFAULT_TIMEOUT,
        start_method: str = "popen",
        **jit_kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,  # type: ignore[arg-type]
        )
        if state_dict_type not in STATE_DICT_TYPES:
            raise ValueError(
                f"You set `{type(self).__name__}(state_dict_type={state_dict_type!r})`; it must be 'full' (one"
                " torch.save file with unsharded tensors, loadable anywhere) or 'sharded' (a PyTorch Distributed"
                " Checkpoint directory, loadable at any world size)."
            )
        hooks.ensure_supported_thunder()
        self.jit = jit
        self.executors = list(executors) if executors is not None else None
        self.state_dict_type = state_dict_type
        self.jit_kwargs = jit_kwargs
        self.options = StrategyOptions(
            parallelism=self.parallelism,
            jit=jit,
            executors=tuple(str(e) for e in self.executors) if self.executors is not None else None,
            sharding_strategy=sharding_strategy,
            bucketing_strategy=bucketing_strategy,
            jit_kwargs=tuple(sorted(jit_kwargs)),
            bucket_size_in_mb=float(bucket_size_in_mb),
        )
        self._notes = validate_options(self.options)
        self._warn_for_notes()
        self.decisions: list[Decision] = []
        self.thunder_modules: list[tuple[str, Any]] = []
        self._backward_sync_control = self._make_backward_sync_control()
        self._bucket_size_in_mb = float(bucket_size_in_mb)

    # -- what subclasses define ---------------------------------------------------------------------------------

    @abstractmethod
    def _distribute_(self, module: nn.Module) -> dict[int, torch.Tensor]:
        """Shard or replicate ``module``'s parameters in place and tag them for the sync hook.

        A model built on the meta device is materialized first; returns ``{id(old tensor): new tensor}`` for the
        parameters and buffers that got new objects doing so (empty otherwise).
        """

    def _make_backward_sync_control(self) -> _BackwardSyncControl | None:
        return None

    # -- Fabric plumbing ---------------------------------------------------------------------------------------

    @override
    def _configure_launcher(self) -> None:
        # Processes made by torchrun, Slurm or thunderviz's rank engine need no launcher; asking for one inside a
        # notebook's rank process would make Fabric refuse to run interactively.
        if self.cluster_environment is not None and self.cluster_environment.creates_processes_externally:
            self._launcher = None
            return
        super()._configure_launcher()

    @property
    def process_group(self) -> tdist.ProcessGroup | None:
        return tdist.group.WORLD if _distributed_is_initialized() else None

    @override
    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager:
        """``fabric.init_module(empty_init=True)`` builds on the meta device: no memory until ``fabric.setup``,
        which materializes the model module by module (see ``strategies.materialize``)."""
        stack = ExitStack()
        stack.enter_context(torch.device("meta") if empty_init else self.root_device)
        stack.enter_context(self.precision.module_init_context())
        return stack

    @override
    def module_to_device(self, module: nn.Module) -> None:
        # A meta-device model has nothing to move: setup_module materializes it directly on the root device.
        if not has_meta_tensors(module):
            module.to(self.root_device)

    @override
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Decide (``parallel.decisions``), record the decision, and carry it out."""
        return self._setup_module(module)[0]

    def _setup_module(self, module: nn.Module) -> tuple[nn.Module, dict[int, torch.Tensor]]:
        facts = inspect_object(module)
        try:
            decision = decide(facts, self.options, self._notes)
        except JitDecisionError as err:
            self.decisions.append(
                Decision(target=facts.type_name, case="not possible", action="error", reason=str(err))
            )
            raise
        if self.process_group is None:
            raise RuntimeError(
                f"{type(self).__name__} needs a process group before `fabric.setup`: call `fabric.launch()` first."
            )
        self.decisions.append(decision)
        if decision.action == Action.JIT_AND_DISTRIBUTE.value:
            jitted = hooks.jit(module, executors=self.executors, **self.jit_kwargs)
            replaced = self._distribute_(module)
            hooks.rebind_module_tensors(jitted, replaced)
            self._register(decision.target, module, jitted)
            return jitted, replaced
        if decision.action == Action.DISTRIBUTE_IN_PLACE.value:
            inner = hooks.original_module(module)
            replaced = self._distribute_(inner)
            hooks.rebind_module_tensors(module, replaced)
            if decision.clear_cache:
                hooks.clear_trace_cache(module)
            self._register(decision.target, inner, module)
            return module, replaced
        # Case 2: the user jits a function that takes this module.
        replaced = self._distribute_(module)
        hooks.clear_all_trace_caches()
        self._register(decision.target, module, None)
        return module, replaced

    def _register(self, name: str, inner: nn.Module, jitted: Any) -> None:
        if self.parallelism == "ddp":
            hooks.mark_module_ddp(inner, jitted, self.process_group, self._bucket_size_in_mb)
        # The communication plan rides on each distributed parameter into whatever thunder traces it
        # (thunder.comm_setup).
        configure_comm(
            inner,
            sharding_strategy=self.options.sharding_strategy,
            bucketing_strategy=self.options.bucketing_strategy,
            bucket_size_in_mb=self._bucket_size_in_mb,
        )
        if jitted is not None:
            self.thunder_modules.append((name, jitted))

    def _warn_for_notes(self) -> None:
        for note in self._notes:
            if note not in _warned:
                _warned.add(note)
                warnings.warn(f"{type(self).__name__}: {note}.", UserWarning, stacklevel=4)

    @override
    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        # Parameters are distributed in place, so an optimizer built on them keeps pointing at the right tensors,
        # as long as it has no per-parameter state yet (that state would have the unsharded shapes). A model built
        # on the meta device gets new Parameter objects; the optimizer is re-pointed at them.
        for opt in optimizers:
            if any(len(s) > 0 for s in opt.state.values()):
                raise RuntimeError(
                    f"The optimizer passed to `fabric.setup` already holds state for the unsharded parameters, which"
                    f" {type(self).__name__} cannot convert. Set up the model first (`model ="
                    " fabric.setup_module(model)`), then create the optimizer and call"
                    " `fabric.setup_optimizers(optimizer)`."
                )
        module, replaced = self._setup_module(module)
        if replaced:
            for opt in optimizers:
                for group in opt.param_groups:
                    group["params"] = [replaced.get(id(p), p) for p in group["params"]]
        return module, optimizers, scheduler

    @override
    def backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        control = self._backward_sync_control
        if (
            isinstance(control, _ReplicatedBackwardSyncControl)
            and control.pending
            and not hooks.is_skipping_grad_sync()
        ):
            control.sync_pending()
        super().backward(tensor, module, *args, **kwargs)

    # -- gradient clipping ---------------------------------------------------------------------------------------

    def _refuse_unsynced_gradients(self) -> None:
        control = self._backward_sync_control
        if isinstance(control, _ReplicatedBackwardSyncControl) and control.pending:
            raise RuntimeError(
                "`fabric.clip_gradients` was called while gradients accumulated under `fabric.no_backward_sync` are"
                " not yet averaged across ranks, so each rank would clip by a different norm. Call it after the"
                " backward that runs outside `no_backward_sync` (the last micro-batch), right before"
                " `optimizer.step()`."
            )

    @override
    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> torch.Tensor:
        """Clip by the global norm over every rank's shards (``strategies.clipping``); return that norm."""
        self._refuse_unsynced_gradients()
        self.precision.unscale_gradients(optimizer)
        params = self.precision.main_params(optimizer)
        return clipping.clip_grad_norm_(params, max_norm, norm_type=norm_type, error_if_nonfinite=error_if_nonfinite)

    @override
    def clip_gradients_value(self, module: nn.Module, optimizer: Optimizer, clip_val: float) -> None:
        """Clip every gradient element to ``[-clip_val, clip_val]`` (element-wise: exact on shards)."""
        self._refuse_unsynced_gradients()
        self.precision.unscale_gradients(optimizer)
        clipping.clip_grad_value_(self.precision.main_params(optimizer), clip_val)

    # -- checkpoints (strategies.checkpoint) ---------------------------------------------------------------------

    def _checkpoint_context(self) -> checkpoint.CheckpointContext:
        return checkpoint.CheckpointContext(
            strategy=type(self).__name__, rank=self.global_rank, sharded=self.state_dict_type == "sharded"
        )

    @override
    def save_checkpoint(
        self,
        path: Any,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                f"`{type(self).__name__}.save_checkpoint` does not take `storage_options`: it writes with"
                " `torch.save` ('full') or `torch.distributed.checkpoint` ('sharded'). Drop the argument."
            )
        checkpoint.save_checkpoint(self._checkpoint_context(), path, state, filter)

    @override
    def load_checkpoint(
        self,
        path: Any,
        state: nn.Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        return checkpoint.load_checkpoint(self._checkpoint_context(), path, state, strict, weights_only)

    @override
    def get_module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """Full tensors with ``state_dict_type='full'`` (a collective), this rank's shards with ``'sharded'``."""
        if self.state_dict_type == "full":
            return checkpoint.full_module_state(module)
        return {k: v.detach().clone() for k, v in checkpoint.inner_module(module).state_dict(keep_vars=True).items()}

    @override
    def load_module_state_dict(self, module: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load a full (one-process) state dict into the model's local shards or replicas."""
        checkpoint.load_full_module(module, state_dict, strict=strict, what="load_module_state_dict(module, ...)")


_warned: set[str] = set()


def _inner(module: nn.Module) -> nn.Module:
    """The user's nn.Module under a ThunderModule (whose parameters we distributed in place)."""
    return checkpoint.inner_module(module)


class _ReplicatedBackwardSyncControl(_BackwardSyncControl):
    """DDP's ``no_backward_sync`` for thunder: skip the all-reduce in backward, average the local sum once later.

    thunder's own ``ThunderModule.no_sync`` all-reduces on every exit, which with Fabric's usual pattern (one
    ``no_backward_sync`` block per micro-batch) saves nothing. Here the gradients accumulated without sync are
    averaged once, right before the next synchronized backward, so the result equals torch DDP's
    ``AllReduce(sum of micro-batch gradients) / world_size`` and the collectives are paid once per window.
    """

    def __init__(self) -> None:
        self.pending: dict[int, nn.Module] = {}

    @override
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager:
        if not enabled:
            return nullcontext()
        return self._skip(module)

    @contextmanager
    def _skip(self, module: nn.Module) -> Any:
        with hooks.skip_grad_sync():
            yield
        self.pending[id(module)] = module

    def sync_pending(self) -> None:
        """One all_reduce per process group and dtype (not per gradient), as the bucketed backward does."""
        buckets: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}
        groups: dict[int, tdist.ProcessGroup] = {}
        for module in self.pending.values():
            for p in _inner(module).parameters():
                if p.grad is not None and hooks.sync_tag(p) == hooks.SyncKind.REPLICATED:
                    group = hooks.param_group(p)
                    groups[id(group)] = group
                    buckets.setdefault((id(group), p.grad.dtype, p.grad.device), []).append(p.grad)
        with torch.no_grad():
            for (gid, _, _), grads in buckets.items():
                group = groups[gid]
                flat = torch.cat([g.reshape(-1) for g in grads]).div_(tdist.get_world_size(group))
                tdist.all_reduce(flat, group=group)
                pieces = flat.split([g.numel() for g in grads])
                torch._foreach_copy_(grads, [piece.view_as(g) for piece, g in zip(pieces, grads, strict=True)])
        self.pending.clear()
