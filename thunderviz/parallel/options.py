"""Every strategy option, declared once: name, type or choices, default, help text and where it applies.

Why one table: an option used to travel in eight shapes (a flag, an upper-cased string, a dict, a registry tuple,
thunder's enum, a ``.name``, a ``configure_comm`` string, a ``CommConfig`` field), and anything not recognised went
to ``thunder.jit``, which ignores unknown keywords. Now the strategy constructors, the Fabric registry entries, the
notebook magics' flags and their ``--help``, the decision log and the communication plan all read ``OPTIONS`` and
the one typed result of parsing them, ``StrategyOptions`` (``parallel.strategy_options``). Plain Python: no torch, no
thunder, no lightning, so the kernel validates a magic's flags before any rank is touched. The values the options
take and their converters are ``parallel.option_values``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from thunderviz.parallel.option_values import (
    DEFAULT_BUCKET_SIZE_IN_MB,
    DEFAULT_BUCKETING,
    DEFAULT_SHARDING,
    FIRST_BUCKET_SIZE_IN_MB,
    Bucketing,
    OptionError,
    Parallelism,
    ReduceDtype,
    Sharding,
    StateDictType,
    TextEnum,
    as_bool,
    as_checkpoint_policy,
    as_choice,
    as_executors,
    as_given,
    as_megabytes,
    as_mesh,
    as_reduce_dtype,
    as_text_or_none,
    as_timeout,
    comma_list,
)

__all__ = ["FOREIGN_OPTIONS", "OPTIONS", "Flag", "Option", "flag_options", "option_named", "options_for"]

BOTH = frozenset(Parallelism)
FSDP_ONLY = frozenset({Parallelism.FSDP})
DDP_ONLY = frozenset({Parallelism.DDP})

# -- the table ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """How a notebook magic spells an option: ``--sharding zero3``, ``--no-jit``, ``--executors torch,python``.

    ``parse`` turns the flag's text into the value the option's converter accepts; ``negates`` makes a bool option a
    ``store_true`` flag that sets it to False (``--no-jit``); choices are spelled in lower case.
    """

    name: str
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    negates: bool = False
    #: the spellings a choice flag offers, when not its enum's values in lower case
    choices: tuple[str, ...] = ()


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise OptionError(f"expected a number, got {text!r}") from None


@dataclass(frozen=True)
class Option:
    """One strategy option. ``default`` may differ per strategy (``defaults``); ``fabric=True`` options are
    Lightning's own ``DDPStrategy`` arguments, passed through to it unchanged."""

    name: str
    help: str
    applies_to: frozenset[Parallelism]
    default: Any = None
    convert: Callable[[Any, str, str], Any] = as_given
    choices: type[TextEnum] | None = None
    defaults: Mapping[Parallelism, Any] = field(default_factory=dict)
    flag: Flag | None = None
    fabric: bool = False
    #: what to say when this option is given to the strategy it does not apply to
    elsewhere: str = ""

    def default_for(self, parallelism: Parallelism) -> Any:
        return self.defaults.get(parallelism, self.default)

    def applies(self, parallelism: Parallelism) -> bool:
        return parallelism in self.applies_to


_DDP_NOT_SHARDED = (
    "but DDP replicates parameters: nothing is sharded or gathered. Its gradients are all-reduced in buckets of"
    f" `bucket_size_in_mb` (default {DEFAULT_BUCKET_SIZE_IN_MB:g}); for `{{name}}` use `ThunderFSDPStrategy`."
)

OPTIONS: tuple[Option, ...] = (
    Option(
        "jit",
        "True: a plain module handed to fabric.setup is jitted by the strategy (case 1). False: it is only"
        " distributed, for a function you jit yourself (case 2). A module you already jitted is distributed in place"
        " either way (case 3).",
        BOTH,
        default=True,
        convert=as_bool,
        flag=Flag("--no-jit", negates=True),
    ),
    Option(
        "executors",
        "thunder executors for the thunder.jit call the strategy makes (names or executor objects, e.g."
        " torch,python; only with jit=True). Default: thunder's own.",
        BOTH,
        default=None,
        convert=as_executors,
        flag=Flag("--executors", parse=comma_list, metavar="NAMES"),
    ),
    Option(
        "sharding_strategy",
        "FSDP sharding: ZERO2 keeps the parameters gathered in forward for backward; ZERO3 gathers them again in"
        " backward from their shards, so forward saves shards only; HYBRID_SHARD (ZERO3) and _HYBRID_SHARD_ZERO2"
        " shard within a group of ranks (device_mesh; by default one host) and all-reduce the reduced gradient shards"
        " across groups (also torch's ShardingStrategy members; 'hybrid' and 'hybrid_zero2' for short). Read back as"
        " thunder's FSDPType (the level within the group).",
        FSDP_ONLY,
        default=DEFAULT_SHARDING,
        convert=as_choice(
            Sharding,
            elsewhere_names={"FULL_SHARD": "ZERO3", "SHARD_GRAD_OP": "ZERO2"},
            aliases={
                "HYBRID": "HYBRID_SHARD",
                "HYBRID_ZERO3": "HYBRID_SHARD",
                "HYBRID_ZERO2": "_HYBRID_SHARD_ZERO2",
                "HYBRID_SHARD_ZERO2": "_HYBRID_SHARD_ZERO2",
            },
        ),
        choices=Sharding,
        flag=Flag("--sharding", choices=("zero2", "zero3", "hybrid", "hybrid_zero2")),
        elsewhere=_DDP_NOT_SHARDED,
    ),
    Option(
        "device_mesh",
        "hybrid sharding's (replicas, shard_size): parameters are sharded over shard_size consecutive ranks and"
        " replicated over the replicas groups (Fabric's FSDPStrategy argument; a 2-D torch DeviceMesh also works)."
        " Default None: one shard group per host.",
        FSDP_ONLY,
        default=None,
        convert=as_mesh,
        flag=Flag("--mesh", metavar="R,S"),
        elsewhere=(
            "but DDP replicates parameters over every rank: there is no mesh to choose. A (replicas, shard_size)"
            " mesh is hybrid sharding's: `ThunderFSDPStrategy(sharding_strategy='HYBRID_SHARD',"
            " device_mesh=(replicas, shard_size))`."
        ),
    ),
    Option(
        "bucketing_strategy",
        "FSDP collective bucketing: BLOCK, one all_gather/reduce_scatter per block (the children of the model's"
        " repeated ModuleList/Sequential) plus one for the rest; LAYER, one per module owning parameters; NONE, one"
        " per parameter. Read back as thunder's FSDPBucketingStrategy.",
        FSDP_ONLY,
        default=DEFAULT_BUCKETING,
        convert=as_choice(Bucketing),
        choices=Bucketing,
        flag=Flag("--bucketing"),
        elsewhere=_DDP_NOT_SHARDED,
    ),
    Option(
        "bucket_size_in_mb",
        "DDP: megabytes of gradients per all_reduce, packed in the order backward produces them (the first bucket"
        f" closes at {FIRST_BUCKET_SIZE_IN_MB:g} MB, as in torch DDP); 0: one all_reduce per gradient.",
        DDP_ONLY,
        default=DEFAULT_BUCKET_SIZE_IN_MB,
        convert=as_megabytes,
        flag=Flag("--bucket-size-mb", parse=_number, metavar="MB"),
        elsewhere=(
            "but FSDP buckets parameters by the model's structure, not by size: use `bucketing_strategy='BLOCK'` (one"
            " collective per block), 'LAYER' or 'NONE'. `bucket_size_in_mb` is `ThunderDDPStrategy`'s knob for its"
            " gradient all-reduces."
        ),
    ),
    Option(
        "state_dict_type",
        "checkpoints: 'full' writes one torch.save file of unsharded tensors (loadable anywhere); 'sharded' a PyTorch"
        " Distributed Checkpoint directory (loadable at any world size). Default: sharded for FSDP, full for DDP.",
        BOTH,
        convert=as_choice(
            StateDictType,
            explain={
                "full": "one torch.save file with unsharded tensors, loadable anywhere",
                "sharded": "a PyTorch Distributed Checkpoint directory, loadable at any world size",
            },
        ),
        choices=StateDictType,
        defaults={Parallelism.FSDP: StateDictType.SHARDED, Parallelism.DDP: StateDictType.FULL},
        flag=Flag("--state-dict-type"),
    ),
    Option(
        "activation_checkpointing_policy",
        "modules whose forward runs under torch.utils.checkpoint (non-reentrant), so backward recomputes their"
        " activations instead of saving them: a set of module classes (e.g. {Block}), class names, or a callable"
        " module -> bool, as Fabric's FSDPStrategy takes it. Default: none.",
        BOTH,
        default=None,
        convert=as_checkpoint_policy,
        flag=Flag("--activation-checkpointing", parse=comma_list, metavar="CLASSES"),
    ),
    Option(
        "reduce_dtype",
        "the dtype gradients are reduced in (reduce_scatter for FSDP, all_reduce for DDP): each bucket is cast to it"
        " before the collective and back after, as FSDP2's MixedPrecisionPolicy(reduce_dtype=...). Default: the"
        " gradients' own dtype (the parameters').",
        BOTH,
        default=None,
        convert=as_reduce_dtype,
        choices=ReduceDtype,
        flag=Flag("--reduce-dtype"),
    ),
    Option(
        "compile_reuse",
        "True: a module the strategy jits (case 1) or distributes (case 3), or a function you jit that takes it (case"
        " 2), reuses thunder's interpreted trace from an earlier set-up in this process when its code, parameters,"
        " plans and inputs are unchanged (a re-run cell, a ZERO2/ZERO3 switch: ~0.2x the compile). False: always"
        " interpret afresh.",
        BOTH,
        default=True,
        convert=as_bool,
        flag=Flag("--no-compile-reuse", negates=True),
    ),
    # Lightning's own DDPStrategy arguments (both strategies are built on it): passed through unchanged. Fabric sets
    # accelerator, devices, cluster environment, checkpoint I/O and precision itself when it builds the strategy.
    Option(
        "process_group_backend",
        "Fabric: the process-group backend (default: nccl on CUDA, gloo on CPU)",
        BOTH,
        convert=as_text_or_none,
        fabric=True,
    ),
    Option(
        "timeout",
        "Fabric: how long a collective may wait for its peers (a datetime.timedelta; default 30 minutes)",
        BOTH,
        default=timedelta(minutes=30),
        convert=as_timeout,
        fabric=True,
    ),
    Option(
        "start_method",
        "Fabric: how Fabric's launcher starts processes ('popen', 'spawn', 'fork', 'forkserver')",
        BOTH,
        default="popen",
        fabric=True,
    ),
    Option("accelerator", "Fabric: set by Fabric(accelerator=...)", BOTH, fabric=True),
    Option("parallel_devices", "Fabric: set by Fabric(devices=...)", BOTH, fabric=True),
    Option(
        "cluster_environment", "Fabric: set by Fabric from the environment (torchrun, Slurm, ...)", BOTH, fabric=True
    ),
    Option("checkpoint_io", "Fabric: checkpoint I/O plugin", BOTH, fabric=True),
    Option("precision", "Fabric: set by Fabric(precision=...)", BOTH, fabric=True),
)

_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def option_named(name: str) -> Option | None:
    """The option called ``name`` (of either strategy), or None when no option is."""
    return _BY_NAME.get(name)


def options_for(parallelism: Parallelism) -> tuple[Option, ...]:
    """The options one strategy takes, in declaration order."""
    return tuple(o for o in OPTIONS if o.applies(parallelism))


def flag_options(parallelism: Parallelism) -> tuple[Option, ...]:
    """The options a notebook magic exposes as flags for this strategy."""
    return tuple(o for o in options_for(parallelism) if o.flag is not None)


#: Options of Lightning Fabric's ``FSDPStrategy`` / ``DDPStrategy`` — and of torch's ``FullyShardedDataParallel`` /
#: ``DistributedDataParallel``, which those forward their extra keywords to — that thunderviz does not implement,
#: each with what to use instead. ``tests/strategies/test_options.py`` checks the list against the installed
#: Lightning and torch signatures, so it cannot drift.
FOREIGN_OPTIONS: dict[str, str] = {
    "activation_checkpointing": (
        "it is Fabric's deprecated spelling; pass the same module classes as `activation_checkpointing_policy={Block}`"
        " (a set of classes, class names, or a callable `module -> bool`)"
    ),
    "auto_wrap_policy": (
        "thunderviz shards every parameter; which parameters share one collective is `bucketing_strategy` ('BLOCK':"
        " one per block, 'LAYER': one per module, 'NONE': one per parameter)"
    ),
    "cpu_offload": (
        "CPU offload is not supported (thunder 0.2.6 has none for FSDP); `sharding_strategy='ZERO3'` keeps only shards"
        " between forward and backward"
    ),
    "mixed_precision": (
        "choose the compute precision on Fabric instead (`Fabric(precision='bf16-true')`: bf16 parameters and"
        " compute; 'bf16-mixed' or '16-mixed': fp32 parameters under autocast), and the gradient reduction dtype with"
        " `reduce_dtype=torch.float32`"
    ),
    "use_orig_params": "not needed: `model.parameters()` are always the real shards the optimizer updates",
    "limit_all_gathers": (
        "not needed: forward issues at most one bucket's all_gather ahead of use, so at most two unsharded buckets are"
        " in flight"
    ),
    "forward_prefetch": "forward always prefetches one bucket ahead; leave it out",
    "backward_prefetch": "the backward schedule is fixed (each reduction issued as soon as its gradients exist)",
    "sync_module_states": (
        "always done: DDP broadcasts rank 0's parameters, FSDP materializes every shard from rank 0's random generator"
    ),
    "param_init_fn": (
        "build the model under `fabric.init_module(empty_init=True)`: `fabric.setup` materializes it with each"
        " module's `reset_parameters()`"
    ),
    "ignored_modules": "every parameter is distributed; freeze parameters with `requires_grad_(False)` instead",
    "ignored_states": "every parameter is distributed; freeze parameters with `requires_grad_(False)` instead",
    "device_id": "set by Fabric (the rank's device); leave it out",
    "process_group": "thunderviz uses Fabric's world process group; leave it out",
    "bucket_cap_mb": "`ThunderDDPStrategy` takes `bucket_size_in_mb` (same meaning: megabytes per all-reduce)",
    "find_unused_parameters": (
        "not needed: thunder's traced backward knows which parameters get gradients, and reduces only those"
    ),
    "static_graph": "not needed: every step runs the same traced backward",
    "gradient_as_bucket_view": "gradients are already views of each reduced bucket's buffer; leave it out",
    "broadcast_buffers": "buffers are broadcast from rank 0 once at `fabric.setup`; leave it out",
    "ddp_comm_hook": "communication hooks are not supported: the collectives are part of thunder's traced backward",
    "ddp_comm_state": "communication hooks are not supported: the collectives are part of thunder's traced backward",
    "ddp_comm_wrapper": "communication hooks are not supported: the collectives are part of thunder's traced backward",
    "model_averaging_period": "post-local SGD is not supported; leave it out",
    "device_ids": "set by Fabric (the rank's device); leave it out",
    "output_device": "set by Fabric (the rank's device); leave it out",
    "dim": "batches are split by you (each rank loads its own data); leave it out",
    "init_sync": "always done: parameters are synchronized from rank 0 at `fabric.setup`",
    "delay_all_reduce_named_params": "not supported; every gradient bucket is reduced in backward",
    "param_to_hook_all_reduce": "not supported; every gradient bucket is reduced in backward",
    "skip_all_reduce_unused_params": "not needed: only parameters that get gradients are reduced",
    "check_reduction": "deprecated and ignored by torch's DDP itself; leave it out",
}
