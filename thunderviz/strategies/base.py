"""What the two thunder strategies share: the decision log, carrying out a decision, clipping, checkpoints.

Built on Fabric's ``DDPStrategy`` for what is not ours to redo (cluster environment, process group set-up,
``all_reduce``/``barrier``/``broadcast``, launchers); everything thunder-specific goes through
``thunderviz.parallel.decisions`` (what to do) and ``thunderviz.thunder.hooks`` (how). Models built on the meta
device are materialized by ``strategies.materialize``, gradients clipped by ``strategies.clipping``, checkpoints
written and read by the ``strategies.checkpoint`` package.
"""

from __future__ import annotations

import inspect
import warnings
from abc import abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any, ClassVar

import torch
import torch.distributed as tdist
from lightning.fabric.strategies import DDPStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from lightning.fabric.utilities.distributed import _distributed_is_initialized
from torch import nn
from torch.optim import Optimizer
from typing_extensions import Self, override

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.decisions import Action, Case, Decision, decide, decide_executors, impossible
from thunderviz.parallel.option_values import Parallelism, StateDictType
from thunderviz.parallel.options import options_for
from thunderviz.parallel.strategy_options import StrategyOptions, parse_options
from thunderviz.strategies import clipping
from thunderviz.strategies.checkpoint import full as full_format
from thunderviz.strategies.checkpoint import save_load
from thunderviz.strategies.checkpoint.state import CheckpointContext
from thunderviz.strategies.front_doors import (
    fabric_compile_kwargs,
    guard_front_door,
    hide_from_dynamo,
    keep_compile_kwargs_captured,
)
from thunderviz.strategies.materialize import has_meta_tensors
from thunderviz.thunder import compile_state, hooks
from thunderviz.thunder.comm.setup import configure_comm
from thunderviz.thunder.jit.checkpointed_forward import checkpoint_modules_
from thunderviz.thunder.jit.executors import executor_facts, resolve_executors
from thunderviz.thunder.jit.facts import inspect_object
from thunderviz.thunder.jit.hf import prepare_transformers
from thunderviz.thunder.jit.keywords import jit_keywords
from thunderviz.thunder.modules import user_module
from thunderviz.thunder.reuse import compile_reuse

__all__ = ["ThunderParallelStrategy", "options_signature"]


def options_signature(parallelism: Parallelism) -> inspect.Signature:
    """The constructor signature ``inspect.signature`` / ``help()`` show: every option of ``parallelism`` with its
    default, keyword-only, then ``**jit_kwargs`` (what ``thunder.jit`` reads)."""
    params = [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default_for(parallelism))
        for o in options_for(parallelism)
    ]
    params.append(inspect.Parameter("jit_kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def options_docstring(parallelism: Parallelism) -> str:
    """The ``Args:`` section of a strategy's docstring, from the option table."""
    lines = ["", "    Args:"]
    for option in options_for(parallelism):
        if not option.fabric:
            lines.append(f"        {option.name}: {option.help}")
    lines.append(
        "        **kwargs: Lightning's DDPStrategy arguments (timeout, process_group_backend, start_method), and"
        " keywords the installed thunder.jit reads (checked: anything else raises, naming the closest option)."
    )
    return "\n".join(lines) + "\n"


class ThunderParallelStrategy(DDPStrategy):
    """Base of ``ThunderFSDPStrategy`` and ``ThunderDDPStrategy``; not registered itself.

    Every keyword is one of ``parallel.options.OPTIONS`` (parsed once into ``self.options``), a keyword
    ``thunder.jit`` really reads, or an error.
    """

    parallelism: ClassVar[Parallelism]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "parallelism" in cls.__dict__:
            cls.__signature__ = options_signature(cls.parallelism)  # type: ignore[attr-defined]
            cls.__doc__ = (cls.__doc__ or "") + options_docstring(cls.parallelism)

    def __init__(self, **options: Any) -> None:
        parsed = parse_options(self.parallelism, options, jit_keywords=jit_keywords)
        self._init_from(parsed)

    @classmethod
    def from_options(cls, options: StrategyOptions) -> Self:
        """The strategy for already parsed options (what a rank builds from the kernel's ``StrategySpec``)."""
        if options.parallelism is not cls.parallelism:
            raise ValueError(f"{cls.__name__}.from_options: these options are for {options.strategy_name}")
        strategy = cls.__new__(cls)
        strategy._init_from(options)
        return strategy

    def _init_from(self, options: StrategyOptions) -> None:
        fabric = {o.name: o.default_for(self.parallelism) for o in options_for(self.parallelism) if o.fabric}
        super().__init__(**{**fabric, **dict(options.fabric_kwargs)})
        hooks.ensure_supported_thunder()
        self.options = options
        keep_compile_kwargs_captured()
        self.decisions: list[Any] = []
        self.thunder_modules: list[tuple[str, Any]] = []
        self._setup_modules: list[nn.Module] = []
        self._backward_sync_control = self._make_backward_sync_control()

    # -- the options, read back -------------------------------------------------------------------------------------

    @property
    def jit(self) -> bool:
        return self.options.jit

    @property
    def executors(self) -> list[Any] | None:
        return list(self.options.executors) if self.options.executors is not None else None

    @property
    def jit_kwargs(self) -> dict[str, Any]:
        """The keywords for this strategy's own ``thunder.jit`` call."""
        return dict(self.options.jit_kwargs)

    @property
    def state_dict_type(self) -> StateDictType:
        return self.options.state_dict_type

    # -- what subclasses define ---------------------------------------------------------------------------------

    @abstractmethod
    def _distribute_(self, module: nn.Module) -> dict[int, torch.Tensor]:
        """Shard or replicate ``module``'s parameters in place and tag them for the sync hook.

        A model built on the meta device is materialized first; returns ``{id(old tensor): new tensor}`` for the
        parameters and buffers that got new objects doing so (empty otherwise).
        """

    def _make_backward_sync_control(self) -> _BackwardSyncControl | None:
        return None

    def _decide_layout(self, decision: Decision) -> list[Decision]:
        """Decisions about which ranks a module's parameters are distributed over, made (collectively, on every
        rank) before ``_distribute_``; logged after the case's row. None unless a strategy has a choice to make."""
        return []

    # -- Fabric plumbing ---------------------------------------------------------------------------------------

    @property  # type: ignore[override]
    def precision(self) -> Any:
        return DDPStrategy.precision.fget(self)  # type: ignore[attr-defined]

    @precision.setter
    def precision(self, precision: Any) -> None:
        # Fabric hands the object to the precision before the strategy: the front door is checked there first.
        if precision is not None:
            guard_front_door(precision, self._check_front_door)
        self._precision = precision

    def _check_front_door(self, obj: Any) -> None:
        """Refuse, before Fabric touches it, an object the decision table refuses (``thunderfx``'s object, a module
        thunder's FSDP plugin already sharded); everything else is decided again in ``setup_module``."""
        facts = inspect_object(obj, self.options.activation_checkpointing_policy, fabric_compile_kwargs())
        try:
            decide(facts, self.options)
        except JitDecisionError as err:
            self.decisions.append(impossible(facts.type_name, err, self.options))
            raise

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
        facts = inspect_object(module, self.options.activation_checkpointing_policy, fabric_compile_kwargs())
        try:
            decision = decide(facts, self.options)
        except JitDecisionError as err:
            if not self.decisions or self.decisions[-1].reason != str(err):  # not already logged at the front door
                self.decisions.append(impossible(facts.type_name, err, self.options))
            raise
        if self.process_group is None:
            raise RuntimeError(
                f"{type(self).__name__} needs a process group before `fabric.setup`: call `fabric.launch()` first."
            )
        how = self._decide_executors(module, decision, facts.door.call)
        self.decisions += [how, decision]
        self.decisions += self._decide_layout(decision)
        # Before anything traces the module: thunder must see the checkpointed forwards
        # (thunder.jit.checkpointed_forward)
        # and a transformers model's registrations (thunder.jit.hf).
        checkpoint_modules_(user_module(module), facts.checkpointed)
        prepare_transformers(user_module(module), decision.prepare)
        if decision.action is Action.JIT_AND_DISTRIBUTE:
            compile_reuse.mark(module, self.options.compile_reuse)
            jitted = compile_state.jit(
                module, executors=resolve_executors(how.executors, self.options.executors), **self.jit_kwargs
            )
            replaced = self._distribute_(module)
            compile_state.rebind_module_tensors(jitted, replaced)
            if decision.dynamo_passthrough:
                hide_from_dynamo(jitted)
            self._register(decision.target, module, jitted)
            return jitted, replaced
        if decision.action is Action.DISTRIBUTE_IN_PLACE:
            inner = compile_state.original_module(module)
            compile_reuse.mark(inner, self.options.compile_reuse)
            replaced = self._distribute_(inner)
            compile_state.rebind_module_tensors(module, replaced)
            if decision.clear_cache:
                compile_state.clear_trace_cache(module)
            self._register(decision.target, inner, module)
            return module, replaced
        # Case 2: the user jits a function that takes this module.
        compile_reuse.mark(module, self.options.compile_reuse)  # that function's compile may reuse a trace
        replaced = self._distribute_(module)
        compile_state.clear_all_trace_caches()
        self._register(decision.target, module, None)
        return module, replaced

    def _decide_executors(self, module: nn.Module, decision: Decision, call: str = "") -> Decision:
        """How thunder.jit compiles (``parallel.decisions.decide_executors``); warns where a request was cut down."""
        mine = decision.case is Case.USER_JITTED
        facts = executor_facts(self.root_device.type, module if mine else None, call if mine else "")
        how = decide_executors(facts, self.options, decision.case, decision.target)
        if how.warning:
            warnings.warn(how.warning, UserWarning, stacklevel=5)  # the user's fabric.setup(...) line
        return how

    def _register(self, name: str, inner: nn.Module, jitted: Any) -> None:
        self._setup_modules.append(inner)
        self._after_distribute(inner, jitted)
        # The communication plan rides on each distributed parameter into whatever thunder traces it
        # (thunder.comm.setup).
        configure_comm(inner, self.options)
        if jitted is not None:
            self.thunder_modules.append((name, jitted))

    def _after_distribute(self, inner: nn.Module, jitted: Any) -> None:
        """What a strategy adds once a module is distributed, before its communication plan is attached."""

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

    # -- gradient accumulation (fabric.no_backward_sync) -------------------------------------------------------

    def _pending_accumulation(self) -> list[str]:
        """Parameters whose gradients accumulated under ``no_backward_sync`` are not reduced across ranks yet."""
        return []

    def _refuse_unsynced_gradients(self, what: str = "`fabric.clip_gradients`") -> None:
        """Raise where using the gradients now would not be exact: micro-batches accumulated under
        ``no_backward_sync`` are not reduced until the next backward outside it."""
        pending = self._pending_accumulation()
        if pending:
            raise RuntimeError(
                f"{what} was called while gradients accumulated under `fabric.no_backward_sync` are not yet reduced"
                f" across ranks ({', '.join(pending[:3])}{' ...' if len(pending) > 3 else ''}), so each rank would"
                " use its own partial sum. Run the last micro-batch's backward outside `no_backward_sync`"
                " (`fabric.no_backward_sync(model, enabled=not is_last_micro_batch)`), then clip and step."
            )

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        self._refuse_unsynced_gradients("`optimizer.step()`")
        return super().optimizer_step(optimizer, **kwargs)

    # -- gradient clipping ---------------------------------------------------------------------------------------

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

    def _checkpoint_context(self) -> CheckpointContext:
        return CheckpointContext(
            strategy=type(self).__name__, rank=self.global_rank, sharded=self.state_dict_type is StateDictType.SHARDED
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
        save_load.save_checkpoint(self._checkpoint_context(), path, state, filter)

    @override
    def load_checkpoint(
        self,
        path: Any,
        state: nn.Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        return save_load.load_checkpoint(self._checkpoint_context(), path, state, strict, weights_only)

    @override
    def get_module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """Full tensors with ``state_dict_type='full'`` (a collective), this rank's shards with ``'sharded'``."""
        if self.state_dict_type is StateDictType.FULL:
            return full_format.full_module_state(module)
        return {k: v.detach().clone() for k, v in user_module(module).state_dict(keep_vars=True).items()}

    @override
    def load_module_state_dict(self, module: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load a full (one-process) state dict into the model's local shards or replicas."""
        full_format.load_full_module(module, state_dict, strict=strict, what="load_module_state_dict(module, ...)")
