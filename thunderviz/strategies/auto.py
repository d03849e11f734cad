"""``ThunderAutoStrategy`` (``Fabric(strategy="thunder_auto")``): DDP or FSDP, chosen at ``fabric.setup`` by the plan.

At the first ``fabric.setup`` the strategy predicts the candidates (``strategies.candidates``) for this world size,
with this rank's example batch, the optimizer handed to ``fabric.setup`` (or the one named at construction) and
Fabric's precision, and picks DDP if it fits ``memory_per_rank``, else the one that fits with the least predicted
communication time (``parallel.plan.choose``: bytes and collectives priced on the device's link). Rank 0 plans
and broadcasts the result, so every rank makes the same choice. From then on the strategy *is* the chosen one — a
``ThunderDDPStrategy`` or ``ThunderFSDPStrategy`` with those options (``isinstance`` says so), sharing Fabric's
process group and plumbing — and the decision log's entry for the module says what was chosen and the numbers it
was chosen by. When nothing fits, ``fabric.setup`` raises ``PlanError`` naming the smallest per-rank memory that
would work.

Candidates are predicted one trace at a time, in ``parallel.plan.PREFERENCE`` order (DDP; ZERO2 BLOCK and LAYER;
ZERO3 BLOCK and LAYER), and predicting stops once the best that fits is DDP or a BLOCK candidate (``settled``):
``choose`` takes DDP whenever it fits, and every FSDP candidate after a BLOCK one moves at least its bytes in at
least its collectives (ZERO3 a third more bytes than ZERO2 of padded shards; LAYER the same bytes as BLOCK in more
collectives), so it is what ``choose`` would pick from all of them. When only ZERO2-LAYER of the ZERO2 pair fits,
ZERO3 is predicted too: ZERO3-BLOCK sends more bytes in fewer collectives and may be faster.

When none of them fits and the model has repeated blocks, the same groups are predicted with every block
checkpointed (``+ac``, ``parallel.plan``), and the pick is recorded with what the recomputation costs per step. A
plan handed in (``plan=``) is chosen from as it is, checkpointed candidates included.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from functools import cache
from typing import Any

import torch
import torch.distributed as tdist
from lightning.fabric.strategies.registry import _StrategyRegistry
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from thunderviz.errors import PlanError
from thunderviz.parallel.decisions import impossible
from thunderviz.parallel.option_values import Bucketing, Parallelism
from thunderviz.parallel.plan import AC_SUFFIX, HYBRID_PREFERENCE, PREFERENCE, candidate_specs, choose, parse_memory
from thunderviz.parallel.strategy_options import parse_options
from thunderviz.strategies.base import ThunderParallelStrategy
from thunderviz.strategies.candidates import Candidate, predict_candidates
from thunderviz.strategies.ddp import ThunderDDPStrategy
from thunderviz.strategies.fsdp import ThunderFSDPStrategy
from thunderviz.strategies.planning import Plan, block_checkpoint_policy
from thunderviz.strategies.registry import register_strategy_names
from thunderviz.thunder import compile_state
from thunderviz.trace.units import format_bytes

__all__ = ["ThunderAutoStrategy"]

#: The candidates in ``PREFERENCE`` order, grouped by the trace they share.
_BY_TRACE = (PREFERENCE[:1], PREFERENCE[1:3], PREFERENCE[3:5])


class ThunderAutoStrategy(ThunderParallelStrategy):
    """Chooses DDP or FSDP (ZERO2/ZERO3 x BLOCK/LAYER) at ``fabric.setup`` by predicted memory and communication.

    Args:
        memory_per_rank: the budget per rank, bytes or a size such as ``"80GiB"``. Default: the GPU's memory on
            CUDA; required on CPU.
        example_input: what one rank's ``model(...)`` takes per step (a tensor or a tuple; meta tensors are fine):
            activation memory depends on it. Required unless ``plan`` is given.
        loss_fn: ``loss_fn(output) -> scalar`` of the training step; default ``output.sum()``.
        optimizer: what ``thunderviz.plan`` takes; default: the optimizer handed to ``fabric.setup(model,
            optimizer)`` (same class and settings), else ``"adamw"``.
        plan: a ``thunderviz.plan(...)`` result to choose from instead of planning at ``fabric.setup``.
        timeout: Lightning's ``DDPStrategy`` argument of that name (the process group's timeout).
        process_group_backend: Lightning's ``DDPStrategy`` argument (``"gloo"``, ``"nccl"``; default by device).
        start_method: Lightning's ``DDPStrategy`` argument (how Fabric starts its processes).
    """

    def __init__(
        self,
        memory_per_rank: int | str | None = None,
        *,
        example_input: Any = None,
        loss_fn: Any = None,
        optimizer: Any = None,
        plan: Plan | None = None,
        timeout: timedelta | None = timedelta(minutes=30),
        process_group_backend: str | None = None,
        start_method: str = "popen",
    ) -> None:
        fabric = {"timeout": timeout, "process_group_backend": process_group_backend, "start_method": start_method}
        #: DDP or FSDP once chosen; before ``fabric.setup``, DDP's Fabric plumbing (which both share)
        self.parallelism = Parallelism.DDP
        self._init_from(parse_options(Parallelism.DDP, fabric))
        try:
            self.memory_per_rank = parse_memory(memory_per_rank) if memory_per_rank is not None else None
        except ValueError as exc:
            raise PlanError(f"ThunderAutoStrategy: {exc}") from None
        self.example_input = example_input
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.plan = plan
        self.chosen: Candidate | None = None

    # -- choosing ---------------------------------------------------------------------------------------------

    @override
    def setup_module(self, module: nn.Module) -> nn.Module:
        self._choose(module, [])
        return super().setup_module(module)

    @override
    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        self._choose(module, optimizers)
        return super().setup_module_and_optimizers(module, optimizers, scheduler)

    @override
    def _setup_module(self, module: nn.Module) -> tuple[nn.Module, dict[int, torch.Tensor]]:
        done = super()._setup_module(module)
        # the case's own row says why this strategy (the rows after it are choices it made: the mesh)
        rows = [i for i, d in enumerate(self.decisions) if not str(d.action).startswith("choose")]
        if self.chosen is not None and rows:
            case = self.decisions[rows[-1]]
            self.decisions[rows[-1]] = dataclasses.replace(case, reason=f"{self._why}; {case.reason}")
        return done

    @override
    def _distribute_(self, module: nn.Module) -> dict[int, torch.Tensor]:
        if self.chosen is None:
            raise RuntimeError("ThunderAutoStrategy distributes only after choosing at fabric.setup")
        return super()._distribute_(module)

    def _budget(self) -> int:
        if self.memory_per_rank is not None:
            return self.memory_per_rank
        if self.root_device.type == "cuda":
            return int(torch.cuda.get_device_properties(self.root_device).total_memory)
        raise PlanError(
            "ThunderAutoStrategy on CPU needs the memory each rank may use: ThunderAutoStrategy(memory_per_rank="
            "'8GiB') (on CUDA it defaults to the GPU's memory)"
        )

    def _choose(self, module: nn.Module, optimizers: list[Optimizer]) -> None:
        if self.chosen is not None:
            return
        budget = self._budget()
        world = self.world_size
        target = compile_state.original_module(module) if compile_state.is_thunder_module(module) else module
        payload: list[Any] = [None]
        per_host = _ranks_per_host(self.process_group) if world > 1 else None
        if self.global_rank == 0:
            try:
                payload[0] = self._predict(target, optimizers, budget, world, per_host)
            except Exception as exc:  # every rank must learn it, not wait in the broadcast below
                payload[0] = exc
        if self.process_group is not None and world > 1:
            tdist.broadcast_object_list(payload, src=0, group=self.process_group)
        result = payload[0]
        if isinstance(result, BaseException):
            raise result
        tried, pick = result
        self._tried = tried
        if pick is None:
            smallest = min(tried, key=lambda c: c.peak_bytes)
            error = PlanError(
                f"ThunderAutoStrategy(memory_per_rank={format_bytes(budget)}): no strategy fits on {world} ranks."
                f" The smallest predicted per-rank peak is {smallest.name}'s, {format_bytes(smallest.peak_bytes)}"
                f" ({smallest.peak_bytes} bytes): give each rank at least that much, use more ranks, or a smaller"
                f" batch. Predicted: " + "; ".join(c.describe() for c in tried)
            )
            self.decisions.append(impossible(type(target).__name__, error, self.options))
            raise error
        self._become(pick, budget)

    def _predict(
        self, target: nn.Module, optimizers: list[Optimizer], budget: int, world: int, per_host: int | None = None
    ) -> tuple[list[Candidate], Candidate | None]:
        if self.plan is not None:
            pool = [c for c in self.plan.candidates if c.world_size == world]
            if not pool:
                raise PlanError(
                    f"ThunderAutoStrategy(plan=...): the plan has world sizes {self.plan.world_sizes}, this run has"
                    f" {world} ranks; plan for world_sizes=({world},)"
                )
            tried = [dataclasses.replace(c, fits=c.peak_bytes <= budget, bundle=None) for c in pool]
            return tried, _best(tried, budget)
        if self.example_input is None:
            raise PlanError(
                "ThunderAutoStrategy needs one rank's example batch to predict activation memory:"
                " ThunderAutoStrategy(memory_per_rank=..., example_input=torch.empty(8, 64, dtype=torch.long,"
                " device='meta')), or a plan: ThunderAutoStrategy(plan=thunderviz.plan(model, batch, ...))"
            )
        tried: list[Candidate] = []
        # Across hosts every candidate is predicted together: the bytes between hosts come first, which no early
        # stop by this host's order can know (parallel.plan.choose).
        policy = block_checkpoint_policy(target)
        groups: list[Any] = [None] if per_host else list(_BY_TRACE)
        if policy is not None:
            every = PREFERENCE + HYBRID_PREFERENCE if per_host else None
            groups += [[n + AC_SUFFIX for n in g] for g in ([every] if per_host else _BY_TRACE)]
        for names in groups:  # one trace each (both bucketings of a sharding share one, thunder.memory.rehearsal)
            if names is not None and names[0].endswith(AC_SUFFIX) and _best(tried, budget) is not None:
                break  # something fits unchecked: checkpointing only when nothing else does
            got, _ = predict_candidates(
                target,
                candidate_specs([world], names, per_host, policy),
                self.example_input,
                loss_fn=self.loss_fn,
                optimizer=self._optimizer_for_plan(optimizers),
                precision=str(getattr(self.precision, "precision", "32-true")),
                device=self.root_device.type,
                budget=budget,
                ranks_per_host=per_host,
            )
            tried += [dataclasses.replace(c, bundle=None) for c in got]
            pick = _best(tried, budget)
            if pick is not None and not per_host and settled(pick):
                return tried, pick
        return tried, _best(tried, budget)

    def _optimizer_for_plan(self, optimizers: list[Optimizer]) -> Any:
        if self.optimizer is not None:
            return self.optimizer
        if optimizers:
            return _same_optimizer(optimizers[0])
        return "adamw"

    def _become(self, pick: Candidate, budget: int) -> None:
        """From here on this object is the chosen strategy (see the module docstring)."""
        impl = ThunderFSDPStrategy if pick.options.parallelism is Parallelism.FSDP else ThunderDDPStrategy
        self.__class__ = _chosen_class(impl)
        self.parallelism = impl.parallelism
        self.options = dataclasses.replace(pick.options, fabric_kwargs=self.options.fabric_kwargs)
        self._backward_sync_control = impl._make_backward_sync_control(self)
        self.chosen = pick
        others = []
        for c in self._tried:
            if c is pick:
                continue
            if c.peak_bytes > budget:
                others.append(f"{c.name} predicted {format_bytes(c.peak_bytes)}, does not fit")
            elif pick.inter_host_bytes is not None and (c.inter_host_bytes or 0) > pick.inter_host_bytes:
                others.append(f"{c.name} fits but sends {format_bytes(c.inter_host_bytes or 0)} per host across hosts")
            else:
                others.append(f"{c.name} fits but communicates ~{c.comm_seconds * 1000:.1f} ms")
        # (a given plan's candidates are the user's choice; those the rehearsal skipped cost at least the pick's)
        names = {c.name for c in self._tried}
        untried = (
            [] if self.plan is not None or pick.activation_checkpointing else [n for n in PREFERENCE if n not in names]
        )
        self._why = (
            f"thunder_auto chose {pick.name} on {pick.world_size} ranks: predicted peak"
            f" {format_bytes(pick.peak_bytes)} per rank within memory_per_rank={format_bytes(budget)}, sending"
            f" {format_bytes(pick.comm_bytes)} per step in {pick.collectives} collectives"
            f" (~{pick.comm_seconds * 1000:.1f} ms on the {self.root_device.type} link)"
            + (
                f", {format_bytes(pick.inter_host_bytes)} per host across hosts, the least of those that fit"
                if pick.inter_host_bytes is not None
                else ""
            )
            + (
                f"; every block's forward checkpointed (recomputed in backward: ~{pick.recompute_seconds * 1000:.1f}"
                " ms per step)"
                if pick.activation_checkpointing
                else ""
            )
            + (f" ({'; '.join(others)})" if others else "")
            + (f"; {', '.join(untried)} communicate at least as much" if untried else "")
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        register_strategy_names(strategy_registry, only="auto")


def _same_optimizer(opt: Optimizer) -> Any:
    """A factory of ``opt``'s class with its settings, for the rehearsal. Only the settings its ``__init__`` takes: a
    class's ``defaults`` may hold more (torch's ``AdamW`` keeps ``Adam``'s ``decoupled_weight_decay``, which its own
    ``__init__`` refuses), unless it takes ``**kwargs``."""
    import inspect

    cls = type(opt)
    taken = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken.values()):
        defaults = dict(opt.defaults)
    else:
        defaults = {k: v for k, v in opt.defaults.items() if k in taken}
    return lambda params: cls(params, **defaults)


def _ranks_per_host(group: tdist.ProcessGroup | None) -> int | None:
    """The ranks each host runs when the world spans several hosts with equal, consecutive ranks (a collective);
    None on one host, or when the hosts could not form hybrid shard groups (no hybrid candidate then)."""
    from thunderviz.strategies.mesh import mesh_facts

    blocks = mesh_facts(group).host_blocks()
    if blocks is None or len(blocks) < 2 or len({n for _, n in blocks}) != 1:
        return None
    return blocks[0][1]


def settled(pick: Candidate) -> bool:
    """Whether ``choose`` takes ``pick`` over every candidate of a later trace group (``PREFERENCE`` order): true for
    DDP (taken whenever it fits) and for BLOCK candidates (every later one sends at least their bytes in at least as
    many collectives); false for a LAYER pick, which ZERO3-BLOCK (more bytes, fewer collectives) may beat on a
    latency-bound link."""
    return pick.options.parallelism is Parallelism.DDP or pick.options.bucketing_strategy is Bucketing.BLOCK


def _best(candidates: list[Candidate], budget: int) -> Candidate | None:
    """What ``choose`` takes of ``candidates`` within ``budget``; None when none fits."""
    i = choose([c.row() for c in candidates], budget)
    return candidates[i] if i is not None else None


@cache
def _chosen_class(impl: type[ThunderParallelStrategy]) -> type[ThunderAutoStrategy]:
    """``ThunderAutoStrategy`` on top of the chosen strategy: its own methods choose, everything else is ``impl``'s."""
    return type(
        f"ThunderAutoStrategy[{impl.parallelism.value}]",
        (ThunderAutoStrategy, impl),
        {"__module__": __name__, "__doc__": ThunderAutoStrategy.__doc__},
    )
