"""What the two thunder strategies share: the decision log, carrying out a decision, and checkpoints.

Built on Fabric's ``DDPStrategy`` for what is not ours to redo (cluster environment, process group set-up,
``all_reduce``/``barrier``/``broadcast``, launchers); everything thunder-specific goes through
``thunderviz.core.decisions`` (what to do) and ``thunderviz.core.thunder_hooks`` (how).
"""

from __future__ import annotations

import json
import warnings
from abc import abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from lightning.fabric.strategies import DDPStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from lightning.fabric.utilities.distributed import _distributed_is_initialized
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from thunderviz.core import distribute
from thunderviz.core import thunder_hooks as hooks
from thunderviz.core.decisions import Action, Decision, StrategyOptions, decide, inspect_object, validate_options
from thunderviz.errors import JitDecisionError

__all__ = ["ThunderParallelStrategy"]

_DEFAULT_TIMEOUT = timedelta(minutes=30)
_SHARDED_META = "thunderviz_meta.json"


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
        bucketing_strategy: str = "NONE",
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
        if state_dict_type not in ("full", "sharded"):
            raise ValueError(
                f"You set `{type(self).__name__}(state_dict_type={state_dict_type!r})`; it must be 'full' (one file"
                " with unsharded tensors, loadable at any world size) or 'sharded' (one file per rank)."
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
        )
        self._notes = validate_options(self.options)
        self._warn_for_notes()
        self.decisions: list[Decision] = []
        self.thunder_modules: list[tuple[str, Any]] = []
        self._backward_sync_control = self._make_backward_sync_control()
        self._bucket_size_in_mb = 25.0

    # -- what subclasses define ---------------------------------------------------------------------------------

    @abstractmethod
    def _distribute_(self, module: nn.Module) -> list[str]:
        """Shard or replicate ``module``'s parameters in place and tag them for the sync hook."""

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
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Decide (``core.decisions``), record the decision, and carry it out."""
        try:
            decision = decide(inspect_object(module), self.options, self._notes)
        except JitDecisionError as err:
            self.decisions.append(
                Decision(target=type(module).__name__, case="not possible", action="error", reason=str(err))
            )
            raise
        if self.process_group is None:
            raise RuntimeError(
                f"{type(self).__name__} needs a process group before `fabric.setup`: call `fabric.launch()` first."
            )
        self.decisions.append(decision)
        if decision.action == Action.JIT_AND_DISTRIBUTE.value:
            import thunder

            jitted = thunder.jit(module, executors=self.executors, **self.jit_kwargs)
            self._distribute_(module)
            self._register(decision.target, module, jitted)
            return jitted
        if decision.action == Action.DISTRIBUTE_IN_PLACE.value:
            inner = module._model
            self._distribute_(inner)
            if decision.clear_cache:
                hooks.clear_trace_cache(module)
            self._register(decision.target, inner, module)
            return module
        # Case 2: the user jits a function that takes this module.
        self._distribute_(module)
        hooks.clear_all_trace_caches()
        self._register(decision.target, module, None)
        return module

    def _register(self, name: str, inner: nn.Module, jitted: Any) -> None:
        if self.parallelism == "ddp":
            hooks.mark_module_ddp(inner, jitted, self.process_group, self._bucket_size_in_mb)
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
        # as long as it has no per-parameter state yet (that state would have the unsharded shapes).
        for opt in optimizers:
            if any(len(s) > 0 for s in opt.state.values()):
                raise RuntimeError(
                    f"The optimizer passed to `fabric.setup` already holds state for the unsharded parameters, which"
                    f" {type(self).__name__} cannot convert. Set up the model first (`model ="
                    " fabric.setup_module(model)`), then create the optimizer and call"
                    " `fabric.setup_optimizers(optimizer)`."
                )
        return self.setup_module(module), optimizers, scheduler

    @override
    def backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        control = self._backward_sync_control
        if isinstance(control, _ReplicatedBackwardSyncControl) and control.pending and not _skipping_sync():
            control.sync_pending()
        super().backward(tensor, module, *args, **kwargs)

    @override
    def module_to_device(self, module: nn.Module) -> None:
        module.to(self.root_device)

    # -- checkpoints ---------------------------------------------------------------------------------------------

    @override
    def save_checkpoint(
        self,
        path: Any,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint does not take storage_options.")
        path = Path(path)
        converted = {k: self._state_of(k, v, filter or {}) for k, v in state.items()}
        if self.state_dict_type == "full":
            if self.is_global_zero:
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(converted, path)
            self.barrier()
            return
        path.mkdir(parents=True, exist_ok=True)
        torch.save(converted, path / f"rank_{self.global_rank}.pt")
        if self.is_global_zero:
            (path / _SHARDED_META).write_text(json.dumps({"world_size": self.world_size, "format": 1}))
        self.barrier()

    def _state_of(self, key: str, obj: Any, filters: dict[str, Callable[[str, Any], bool]]) -> Any:
        full = self.state_dict_type == "full"
        if isinstance(obj, nn.Module):
            sd = self.get_module_state_dict(obj)
        elif isinstance(obj, Optimizer):
            sd = _optimizer_state(obj, full=full)
        elif hasattr(obj, "state_dict") and callable(obj.state_dict):
            sd = obj.state_dict()
        else:
            return obj
        if key in filters and isinstance(sd, dict):
            sd = {k: v for k, v in sd.items() if filters[key](k, v)}
        return sd

    @override
    def get_module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        inner = _inner(module)
        if self.state_dict_type == "sharded":
            return {k: v.detach().clone() for k, v in inner.state_dict(keep_vars=True).items()}
        return {k: distribute.gather_full(v.detach(), v) for k, v in inner.state_dict(keep_vars=True).items()}

    @override
    def load_module_state_dict(self, module: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> None:
        inner = _inner(module)
        own = inner.state_dict(keep_vars=True)
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if strict and (missing or unexpected):
            raise KeyError(
                f"The checkpoint does not match the model: missing keys {missing}, unexpected keys {unexpected}."
                " Pass `strict=False` to `fabric.load` to load what matches."
            )
        with torch.no_grad():
            for k, target in own.items():
                if k not in state_dict:
                    continue
                value = state_dict[k]
                if self.state_dict_type == "full":
                    value = distribute.local_shard_of(value, target)
                target.data.copy_(value.to(target.device))

    @override
    def load_checkpoint(
        self,
        path: Any,
        state: nn.Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        path = Path(path)
        if self.state_dict_type == "sharded":
            meta_file = path / _SHARDED_META
            if not meta_file.is_file():
                raise FileNotFoundError(
                    f"{path} is not a sharded thunderviz checkpoint (no {_SHARDED_META}). Load a 'full' checkpoint"
                    f" with `{type(self).__name__}(state_dict_type='full')`."
                )
            saved_world = json.loads(meta_file.read_text())["world_size"]
            if saved_world != self.world_size:
                raise RuntimeError(
                    f"{path} was saved sharded by {saved_world} ranks, but {self.world_size} are loading it. Load it"
                    f" with {saved_world} ranks, or save with `state_dict_type='full'` to change the world size."
                )
            file = path / f"rank_{self.global_rank}.pt"
        else:
            file = path
        checkpoint = torch.load(file, map_location="cpu", weights_only=bool(weights_only))
        if not state:
            return checkpoint
        if isinstance(state, nn.Module):
            self.load_module_state_dict(state, checkpoint, strict=strict)
            return {}
        if isinstance(state, Optimizer):
            _load_optimizer_state(state, checkpoint, full=self.state_dict_type == "full")
            return {}
        if strict:
            absent = sorted(set(state) - set(checkpoint))
            if absent:
                raise KeyError(f"The checkpoint at {path} has no entries {absent}; pass `strict=False` to skip them.")
        for key, obj in list(state.items()):
            if key not in checkpoint:
                continue
            if isinstance(obj, nn.Module):
                self.load_module_state_dict(obj, checkpoint.pop(key), strict=strict)
            elif isinstance(obj, Optimizer):
                _load_optimizer_state(obj, checkpoint.pop(key), full=self.state_dict_type == "full")
            elif hasattr(obj, "load_state_dict"):
                obj.load_state_dict(checkpoint.pop(key))
            else:
                state[key] = checkpoint.pop(key)
        return checkpoint


_warned: set[str] = set()


def _skipping_sync() -> bool:
    from thunder.distributed import get_skip_data_parallel_grad_sync

    return bool(get_skip_data_parallel_grad_sync())


def _inner(module: nn.Module) -> nn.Module:
    """The user's nn.Module under a ThunderModule (whose parameters we distributed in place)."""
    return module._model if hooks.is_thunder_module(module) else module


def _params_in_order(optimizer: Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _optimizer_state(optimizer: Optimizer, *, full: bool) -> dict[str, Any]:
    sd = optimizer.state_dict()
    if not full:
        return sd
    params = _params_in_order(optimizer)
    state = {}
    for idx, entry in sd["state"].items():
        param = params[idx]
        state[idx] = {
            k: distribute.gather_full(v, param) if _is_per_element(v, param) else v for k, v in entry.items()
        }
    return {"state": state, "param_groups": sd["param_groups"]}


def _load_optimizer_state(optimizer: Optimizer, sd: dict[str, Any], *, full: bool) -> None:
    if full:
        params = _params_in_order(optimizer)
        state = {}
        for idx, entry in sd["state"].items():
            param = params[int(idx)]
            state[idx] = {
                k: distribute.local_shard_of(v, param) if _is_full_per_element(v, param) else v for k, v in entry.items()
            }
        sd = {"state": state, "param_groups": sd["param_groups"]}
    optimizer.load_state_dict(sd)


def _is_per_element(value: Any, param: torch.Tensor) -> bool:
    return isinstance(value, torch.Tensor) and value.shape == param.shape and hooks.sync_tag(param) is not None


def _is_full_per_element(value: Any, param: torch.Tensor) -> bool:
    return isinstance(value, torch.Tensor) and tuple(value.shape) == hooks.full_shape(param) and value.dim() > 0


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
        with torch.no_grad():
            for module in self.pending.values():
                for p in _inner(module).parameters():
                    if p.grad is not None and hooks.sync_tag(p) == hooks.SyncKind.REPLICATED:
                        group = hooks.param_group(p)
                        p.grad.div_(tdist.get_world_size(group))
                        tdist.all_reduce(p.grad, group=group)
        self.pending.clear()
