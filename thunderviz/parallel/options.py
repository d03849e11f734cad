"""Every strategy option, declared once: name, type or choices, default, help text and where it applies.

Why one table: an option used to travel in eight shapes (a flag, an upper-cased string, a dict, a registry tuple,
thunder's enum, a ``.name``, a ``configure_comm`` string, a ``CommConfig`` field), and anything not recognised went
to ``thunder.jit``, which ignores unknown keywords. Now the strategy constructors, the Fabric registry entries, the
notebook magics' flags and their ``--help``, the decision log and the communication plan all read ``OPTIONS`` and
the one typed result of parsing them, ``StrategyOptions``. Plain Python: no torch, no thunder, no lightning, so the
kernel validates a magic's flags before any rank is touched.

What a keyword handed to a strategy can be, checked in this order by ``parse_options``:

1. one of ``OPTIONS`` that applies to this strategy: converted and checked (``Option.convert``);
2. one of ``OPTIONS`` for the other strategy: an error naming what to use here (``Option.elsewhere``);
3. an option of Fabric's own ``FSDPStrategy`` / ``DDPStrategy`` (or of torch's FSDP/DDP they forward to) that we do
   not implement: an error saying what to use instead (``FOREIGN_OPTIONS``);
4. a keyword ``thunder.jit`` really reads (asked of the installed thunder: ``thunder.jit.keywords``): kept for the
   strategy's own ``thunder.jit`` call;
5. anything else: an error naming the closest valid option.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from thunderviz.errors import ThundervizError

__all__ = [
    "AUTO_STRATEGY",
    "DEFAULT_BUCKETING",
    "DEFAULT_BUCKET_SIZE_IN_MB",
    "DEFAULT_SHARDING",
    "FIRST_BUCKET_SIZE_IN_MB",
    "FOREIGN_OPTIONS",
    "OPTIONS",
    "REGISTERED_STRATEGIES",
    "Bucketing",
    "CheckpointPolicy",
    "Flag",
    "Option",
    "OptionError",
    "Parallelism",
    "ReduceDtype",
    "RegisteredStrategy",
    "Sharding",
    "StateDictType",
    "StrategyOptions",
    "TextEnum",
    "UnknownOptionError",
    "closest_name",
    "executor_names",
    "flag_options",
    "options_for",
    "parse_options",
]


class TextEnum(str, enum.Enum):
    """An Enum whose members print as their value (``str(Sharding.ZERO3) == "ZERO3"``) and compare equal to it."""

    def __str__(self) -> str:
        return str(self.value)


class Parallelism(TextEnum):
    FSDP = "fsdp"
    DDP = "ddp"

    @property
    def strategy_name(self) -> str:
        """The class users construct: ``ThunderFSDPStrategy`` / ``ThunderDDPStrategy``."""
        return "ThunderFSDPStrategy" if self is Parallelism.FSDP else "ThunderDDPStrategy"

    @property
    def title(self) -> str:
        return self.value.upper()


class Sharding(TextEnum):
    """FSDP: what forward keeps for backward, and over which ranks parameters are sharded.

    ZERO2/ZERO3 shard over every rank (thunder's ``FSDPType`` members have these names). The hybrid members are
    torch's and Fabric's names for sharding within a group of ranks (``device_mesh=(replicas, shard_size)``, by
    default the ranks of one host) and replicating across groups: ``HYBRID_SHARD`` is ZERO3 within the group,
    ``_HYBRID_SHARD_ZERO2`` ZERO2 within it.
    """

    ZERO2 = "ZERO2"
    ZERO3 = "ZERO3"
    HYBRID_SHARD = "HYBRID_SHARD"
    HYBRID_SHARD_ZERO2 = "_HYBRID_SHARD_ZERO2"

    @property
    def hybrid(self) -> bool:
        """Sharded within a group of ranks and replicated across groups."""
        return self in (Sharding.HYBRID_SHARD, Sharding.HYBRID_SHARD_ZERO2)

    @property
    def level(self) -> Sharding:
        """ZERO2 or ZERO3: what forward keeps for backward, within the shard group for the hybrid members."""
        if self is Sharding.HYBRID_SHARD:
            return Sharding.ZERO3
        if self is Sharding.HYBRID_SHARD_ZERO2:
            return Sharding.ZERO2
        return self


class Bucketing(TextEnum):
    """FSDP: which parameters share one collective (thunder's ``FSDPBucketingStrategy`` members have these names)."""

    NONE = "NONE"
    LAYER = "LAYER"
    BLOCK = "BLOCK"


class StateDictType(TextEnum):
    FULL = "full"
    SHARDED = "sharded"


class ReduceDtype(TextEnum):
    """The dtype gradients are reduced in (``reduce_dtype``); torch's dtype names without ``torch.``."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT64 = "float64"


@dataclass(frozen=True)
class CheckpointPolicy:
    """Which modules run their forward under activation checkpointing (``activation_checkpointing_policy``).

    A module is selected when it is an instance of one of ``classes``, its class is named in ``names`` (its
    ``__name__`` or ``module.QualName``; what a notebook flag can spell), or ``predicate(module)`` is true. Plain
    data, so options cross to rank processes by pickle (``classes`` must then be importable there, and
    ``predicate`` is for in-process use: a lambda does not pickle).
    """

    classes: tuple[type, ...] = ()
    names: tuple[str, ...] = ()
    predicate: Callable[[Any], bool] | None = None

    def matches(self, module: Any) -> bool:
        cls = type(module)
        if self.classes and isinstance(module, self.classes):
            return True
        if self.names and (cls.__name__ in self.names or f"{cls.__module__}.{cls.__qualname__}" in self.names):
            return True
        return bool(self.predicate(module)) if self.predicate is not None else False

    def describe(self) -> str:
        """``{Block}``, ``{Block, MLP}`` or ``a callable``: how logs and titles name the policy."""
        named = [c.__name__ for c in self.classes] + list(self.names)
        parts = ["{" + ", ".join(named) + "}"] if named else []
        if self.predicate is not None:
            parts.append(f"callable {getattr(self.predicate, '__name__', type(self.predicate).__name__)}")
        return " or ".join(parts)


#: FSDP's default sharding: ZERO2 keeps the gathered parameters for backward, so backward needs no second gather.
DEFAULT_SHARDING = Sharding.ZERO2
#: FSDP's default bucketing, chosen by measurement (``bench/comm_overhead.py``): on a 4-block GPT (d=128, batch
#: 8x64) on 2 CPU ranks with gloo, the CPU time a step spends beyond one-process ``thunder.jit`` was about 10-12 ms
#: with BLOCK (5 all_gather + 5 reduce_scatter), 29 ms with LAYER (29 + 29) and 36-44 ms with NONE (53 + 53), and
#: torch's FSDP2 (``fully_shard`` per block, then the root) spent 21-25 ms.
DEFAULT_BUCKETING = Bucketing.BLOCK
#: DDP's gradient bucket size, as ``torch.nn.parallel.DistributedDataParallel``'s ``bucket_cap_mb``.
DEFAULT_BUCKET_SIZE_IN_MB = 25.0
#: DDP's first bucket closes at this size, as torch DDP's does, so the first all_reduce starts while most of backward
#: remains (on a 4-block GPT on 2 CPU ranks: 7-10 ms less wall time per step at the same CPU time).
FIRST_BUCKET_SIZE_IN_MB = 1.0

BOTH = frozenset(Parallelism)
FSDP_ONLY = frozenset({Parallelism.FSDP})
DDP_ONLY = frozenset({Parallelism.DDP})


class OptionError(ThundervizError, ValueError):
    """A strategy option (a constructor keyword or a magic's flag) is invalid; the message says what to use."""


class UnknownOptionError(OptionError, TypeError):
    """A keyword no strategy, Fabric or ``thunder.jit`` takes (a ``TypeError``, as for any unexpected keyword)."""


# -- converters: value as given -> the one typed value; raise OptionError naming the call and the fix -------------


def _call(strategy: str, name: str, value: Any) -> str:
    return f"You set `{strategy}({name}={value!r})`"


def _choice(
    enum_type: type[TextEnum],
    *,
    explain: Mapping[str, str] | None = None,
    elsewhere_names: Mapping[str, str] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Callable[[Any, str, str], Any]:
    """Accept a member, its value in any case, or (for FSDP's knobs) thunder's or torch's enum member of that name.

    ``explain`` describes each choice in the error; ``elsewhere_names`` maps another library's spelling of the
    same idea (torch FSDP's ``FULL_SHARD``) to ours, for the error only: we never guess silently. ``aliases`` are
    short spellings that mean exactly one member (a magic's ``--sharding hybrid``).
    """

    def convert(value: Any, strategy: str, name: str) -> Any:
        text = value.name if isinstance(value, enum.Enum) else value
        if isinstance(text, str):
            text = (aliases or {}).get(text.upper(), text)
            for member in enum_type:
                if text.upper() == member.value.upper():
                    return member
        if explain:
            listed = " or ".join(f"{m.value!r} ({explain[m.value]})" for m in enum_type)
            message = f"{_call(strategy, name, value)}; it must be {listed}."
        else:
            choices = ", ".join(repr(m.value) for m in enum_type)
            also = _THUNDER_ENUM.get(enum_type, "")
            message = f"{_call(strategy, name, value)}; choose one of {choices}{also}."
        ours = (elsewhere_names or {}).get(str(text).upper()) if isinstance(text, str) else None
        if ours:
            message += f" {text!r} is torch FSDP's name for what is {ours!r} here."
        raise OptionError(message)

    return convert


#: the other libraries' enums whose members a choice also accepts (by name), as the error says it
_THUNDER_ENUM = {
    Sharding: " (or thunder's `FSDPType` or torch's `ShardingStrategy` member of the same name)",
    Bucketing: " (or thunder's `FSDPBucketingStrategy` member of the same name)",
}


def _bool(value: Any, strategy: str, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise OptionError(f"{_call(strategy, name, value)}; it must be True or False.")


def _megabytes(value: Any, strategy: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise OptionError(
            f"{_call(strategy, name, value)}; it must be a number >= 0 (megabytes of gradients per all-reduce;"
            " 0 means one all-reduce per parameter)."
        )
    return float(value)


def _executors(value: Any, strategy: str, name: str) -> tuple[Any, ...] | None:
    """``None`` (thunder's defaults), an executor name or object, or a sequence of them; kept in order."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) or not isinstance(value, Iterable) else list(value)
    if not items:
        raise OptionError(
            f"{_call(strategy, name, value)}; give at least one executor (e.g. ['torch']) or None for thunder's"
            " defaults."
        )
    return tuple(items)


def _mesh(value: Any, strategy: str, name: str) -> tuple[int, int] | None:
    """``None`` (one shard group per host), ``(replicas, shard_size)``, or a 2-D torch ``DeviceMesh`` laid out as
    ``init_device_mesh`` lays it out (rank = replica * shard_size + shard)."""
    if value is None:
        return None
    if hasattr(value, "mesh") and hasattr(value, "ndim"):  # torch's DeviceMesh, as Fabric accepts it
        ranks = [int(r) for r in value.mesh.flatten().tolist()]
        if value.ndim != 2 or ranks != sorted(ranks) or ranks != list(range(ranks[0], ranks[0] + len(ranks))):
            raise OptionError(
                f"{_call(strategy, name, value)}; thunderviz takes a 2-D mesh laid out as `init_device_mesh(device,"
                " (replicas, shard_size))` makes it (ranks in order), or the tuple `(replicas, shard_size)`."
            )
        value = tuple(int(n) for n in value.mesh.shape)
    if isinstance(value, str):
        value = _comma_list(value.replace("x", ","))
    try:
        mesh = tuple(int(n) for n in value)
    except (TypeError, ValueError):
        mesh = ()
    if len(mesh) != 2 or min(mesh) < 1 or any(isinstance(n, bool) for n in value):
        raise OptionError(
            f"{_call(strategy, name, value)}; give `(replicas, shard_size)`: two positive integers whose product is"
            " the number of ranks (e.g. (2, 4) for 2 hosts of 4 ranks), or None to shard within each host."
        )
    return mesh  # type: ignore[return-value]


def _timeout(value: Any, strategy: str, name: str) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    raise OptionError(f"{_call(strategy, name, value)}; it must be a datetime.timedelta (or None).")


def _reduce_dtype(value: Any, strategy: str, name: str) -> ReduceDtype | None:
    """``None`` (the gradients' own dtype), a ``torch.dtype`` or its name: ``torch.float32`` / ``"float32"``."""
    if value is None:
        return None
    text = str(value).removeprefix("torch.") if not isinstance(value, bool) else ""
    for member in ReduceDtype:
        if text.lower() == member.value:
            return member
    choices = ", ".join(f"torch.{m.value}" for m in ReduceDtype)
    raise OptionError(
        f"{_call(strategy, name, value)}; it must be None (reduce gradients in their own dtype, the parameters') or"
        f" one of {choices} (or its name, e.g. 'float32')."
    )


def _checkpoint_policy(value: Any, strategy: str, name: str) -> CheckpointPolicy | None:
    """A set of module classes, class names, a callable ``module -> bool`` (or Fabric's/torch's auto-wrap form
    ``(module, recurse, nonwrapped_numel) -> bool``), torch's ``ModuleWrapPolicy``, or None."""
    if value is None or isinstance(value, CheckpointPolicy):
        return value
    if hasattr(value, "_module_classes"):  # torch's ModuleWrapPolicy, as Fabric accepts it
        value = set(value._module_classes)
    if isinstance(value, (str, type)):
        value = [value]
    if isinstance(value, Iterable) and not callable(value):
        items = list(value)
        bad = [i for i in items if not isinstance(i, (str, type))]
        if not items or bad:
            raise OptionError(
                f"{_call(strategy, name, value)}; give a set of module classes (e.g. `{{Block}}`), class names, or a"
                " callable `module -> bool`" + (f"; {bad[0]!r} is neither a class nor a name." if bad else ".")
            )
        return CheckpointPolicy(
            classes=tuple(i for i in items if isinstance(i, type)), names=tuple(i for i in items if isinstance(i, str))
        )
    if callable(value):
        return CheckpointPolicy(predicate=_one_argument(value))
    raise OptionError(
        f"{_call(strategy, name, value)}; give a set of module classes (e.g. `{{Block}}`), class names, or a callable"
        " `module -> bool`."
    )


def _one_argument(fn: Callable[..., Any]) -> Callable[[Any], bool]:
    """A policy callable as ``module -> bool``: Fabric's FSDPStrategy also takes torch's auto-wrap form."""
    import inspect

    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return fn
    if len(params) < 3:
        return fn
    return _AutoWrapPolicy(fn)


@dataclass(frozen=True)
class _AutoWrapPolicy:
    """torch's auto-wrap policy signature ``(module, recurse, nonwrapped_numel)``, asked about one module."""

    fn: Callable[..., Any]

    @property
    def __name__(self) -> str:
        return getattr(self.fn, "__name__", "policy")

    def __call__(self, module: Any) -> bool:
        numel = sum(p.numel() for p in module.parameters(recurse=True))
        return bool(self.fn(module, False, numel))


def _anything(value: Any, strategy: str, name: str) -> Any:
    return value


def _text_or_none(value: Any, strategy: str, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise OptionError(f"{_call(strategy, name, value)}; it must be a string (or None).")


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


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


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
    convert: Callable[[Any, str, str], Any] = _anything
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
        convert=_bool,
        flag=Flag("--no-jit", negates=True),
    ),
    Option(
        "executors",
        "thunder executors for the thunder.jit call the strategy makes (names or executor objects, e.g."
        " torch,python; only with jit=True). Default: thunder's own.",
        BOTH,
        default=None,
        convert=_executors,
        flag=Flag("--executors", parse=_comma_list, metavar="NAMES"),
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
        convert=_choice(
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
        convert=_mesh,
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
        convert=_choice(Bucketing),
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
        convert=_megabytes,
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
        convert=_choice(
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
        convert=_checkpoint_policy,
        flag=Flag("--activation-checkpointing", parse=_comma_list, metavar="CLASSES"),
    ),
    Option(
        "reduce_dtype",
        "the dtype gradients are reduced in (reduce_scatter for FSDP, all_reduce for DDP): each bucket is cast to it"
        " before the collective and back after, as FSDP2's MixedPrecisionPolicy(reduce_dtype=...). Default: the"
        " gradients' own dtype (the parameters').",
        BOTH,
        default=None,
        convert=_reduce_dtype,
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
        convert=_bool,
        flag=Flag("--no-compile-reuse", negates=True),
    ),
    # Lightning's own DDPStrategy arguments (both strategies are built on it): passed through unchanged. Fabric sets
    # accelerator, devices, cluster environment, checkpoint I/O and precision itself when it builds the strategy.
    Option(
        "process_group_backend",
        "Fabric: the process-group backend (default: nccl on CUDA, gloo on CPU)",
        BOTH,
        convert=_text_or_none,
        fabric=True,
    ),
    Option(
        "timeout",
        "Fabric: how long a collective may wait for its peers (a datetime.timedelta; default 30 minutes)",
        BOTH,
        default=timedelta(minutes=30),
        convert=_timeout,
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


# -- the typed result -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StrategyOptions:
    """Every option of one strategy, converted and checked: what the decision table, the strategy, the
    communication plan, the magics and the reports read. Picklable (it crosses to rank processes).

    ``jit_kwargs`` are the keywords for the strategy's own ``thunder.jit`` call (``(name, value)`` pairs, sorted);
    ``fabric_kwargs`` those passed to Lightning's ``DDPStrategy`` (only the ones given).
    """

    parallelism: Parallelism
    jit: bool = True
    executors: tuple[Any, ...] | None = None
    sharding_strategy: Sharding = DEFAULT_SHARDING
    device_mesh: tuple[int, int] | None = None
    bucketing_strategy: Bucketing = DEFAULT_BUCKETING
    bucket_size_in_mb: float = DEFAULT_BUCKET_SIZE_IN_MB
    state_dict_type: StateDictType = StateDictType.SHARDED
    activation_checkpointing_policy: CheckpointPolicy | None = None
    reduce_dtype: ReduceDtype | None = None
    compile_reuse: bool = True
    jit_kwargs: tuple[tuple[str, Any], ...] = ()
    fabric_kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def strategy_name(self) -> str:
        return self.parallelism.strategy_name

    @property
    def jit_keyword_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.jit_kwargs)

    @property
    def reshard_after_forward(self) -> bool:
        """ZERO3: backward gathers parameters again from their shards (what torch's FSDP2 calls it)."""
        return self.parallelism is Parallelism.FSDP and self.sharding_strategy.level is Sharding.ZERO3

    @property
    def hybrid(self) -> bool:
        """FSDP sharded within groups of ranks and replicated across them (``Sharding.hybrid``)."""
        return self.parallelism is Parallelism.FSDP and self.sharding_strategy.hybrid

    def settings(self) -> dict[str, Any]:
        """The options that apply to this strategy (Fabric's own excluded), by name: for logs and reports."""
        out: dict[str, Any] = {}
        for option in options_for(self.parallelism):
            if not option.fabric:
                out[option.name] = getattr(self, option.name)
        if self.jit_kwargs:
            out["thunder.jit"] = dict(self.jit_kwargs)
        return out

    def changed(self) -> dict[str, Any]:
        """The options set to something other than their default (what a title needs to name)."""
        defaults = StrategyOptions.defaults(self.parallelism).settings()
        return {k: v for k, v in self.settings().items() if defaults.get(k) != v}

    def summary(self) -> str:
        """``FSDP ZERO3 BLOCK`` / ``DDP 25 MB buckets``, plus ``no jit`` and thunder.jit keywords when set."""
        if self.parallelism is Parallelism.FSDP:
            parts = [self.parallelism.title, str(self.sharding_strategy), str(self.bucketing_strategy)]
            if self.hybrid:
                parts.insert(2, "mesh " + ("x".join(map(str, self.device_mesh)) if self.device_mesh else "per host"))
        else:
            size = f"{self.bucket_size_in_mb:g} MB buckets" if self.bucket_size_in_mb > 0 else "one all_reduce each"
            parts = [self.parallelism.title, size]
        if self.activation_checkpointing_policy is not None:
            parts.append(f"checkpointing {self.activation_checkpointing_policy.describe()}")
        if self.reduce_dtype is not None:
            parts.append(f"reduce in {self.reduce_dtype}")
        if not self.jit:
            parts.append("no jit")
        if not self.compile_reuse:
            parts.append("no compile reuse")
        if self.executors:
            parts.append("executors " + ",".join(executor_names(self.executors)))
        return " ".join(parts)

    def constructor_kwargs(self) -> dict[str, Any]:
        """Keywords that rebuild this strategy: ``strategy_class(**options.constructor_kwargs())``."""
        out = {name: getattr(self, name) for name in self.settings() if name != "thunder.jit"}
        out.update(self.fabric_kwargs)
        out.update(self.jit_kwargs)
        return out

    @classmethod
    def defaults(cls, parallelism: Parallelism) -> StrategyOptions:
        return cls(parallelism=parallelism, state_dict_type=_BY_NAME["state_dict_type"].default_for(parallelism))


def executor_names(executors: Iterable[Any]) -> tuple[str, ...]:
    """Executors as the user gave them (names or thunder executor objects) -> their names, in order."""
    return tuple(e if isinstance(e, str) else str(getattr(e, "name", e)) for e in executors)


_OWN_FIELDS = frozenset(f.name for f in fields(StrategyOptions)) - {"parallelism", "jit_kwargs", "fabric_kwargs"}


def parse_options(
    parallelism: Parallelism | str,
    given: Mapping[str, Any],
    *,
    jit_keywords: Callable[[], Collection[str]] | None = None,
) -> StrategyOptions:
    """Turn the keywords handed to a strategy (or read from a magic's flags) into ``StrategyOptions``.

    Args:
        parallelism: which strategy the keywords are for.
        given: the keywords as the user wrote them.
        jit_keywords: the keywords the installed ``thunder.jit`` reads (``thunderviz.thunder.jit.keywords``); called
            only when a keyword is none of ours. ``None``: no keyword may go to ``thunder.jit`` (the magics).

    Raises:
        OptionError: a value is invalid, an option belongs to the other strategy or to Fabric's FSDP/DDP, or jit
            keywords were given where the strategy never calls ``thunder.jit``.
        UnknownOptionError: a keyword nobody takes; the message names the closest valid one.
    """
    parallelism = Parallelism(parallelism)
    strategy = parallelism.strategy_name
    values: dict[str, Any] = {}
    fabric: dict[str, Any] = {}
    unknown: dict[str, Any] = {}
    for name, value in given.items():
        option = _BY_NAME.get(name)
        if option is not None and option.applies(parallelism):
            converted = option.convert(value, strategy, name)
            (fabric if option.fabric else values)[name] = converted
        elif option is not None:
            raise OptionError(f"You set `{strategy}({name}=...)`, " + option.elsewhere.format(name=name))
        elif name in FOREIGN_OPTIONS:
            raise OptionError(
                f"You set `{strategy}({name}=...)`, an option of Lightning's {_foreign_owner(parallelism)} that"
                f" thunderviz does not take: {FOREIGN_OPTIONS[name]}."
            )
        else:
            unknown[name] = value
    jit_kwargs = _jit_kwargs(parallelism, unknown, jit_keywords)
    options = StrategyOptions(
        parallelism=parallelism,
        **{**{f: getattr(StrategyOptions.defaults(parallelism), f) for f in _OWN_FIELDS}, **values},
        jit_kwargs=tuple(sorted(jit_kwargs.items())),
        fabric_kwargs=tuple(sorted(fabric.items())),
    )
    _check_combination(options)
    return options


def _foreign_owner(parallelism: Parallelism) -> str:
    return "FSDPStrategy (or torch's FSDP)" if parallelism is Parallelism.FSDP else "DDPStrategy (or torch's DDP)"


def _jit_kwargs(
    parallelism: Parallelism, unknown: dict[str, Any], jit_keywords: Callable[[], Collection[str]] | None
) -> dict[str, Any]:
    if not unknown:
        return {}
    accepted = frozenset(jit_keywords()) if jit_keywords is not None else frozenset()
    strategy = parallelism.strategy_name
    for name in unknown:
        if name in accepted:
            continue
        ours = [o.name for o in options_for(parallelism)]
        close = closest_name(name, [*ours, *sorted(accepted)])
        hint = f" Did you mean `{close}`?" if close else ""
        takes = ", ".join(o.name for o in options_for(parallelism) if not o.fabric)
        where = " or a keyword of `thunder.jit`" if jit_keywords is not None else ""
        raise UnknownOptionError(
            f"You set `{strategy}({name}=...)`, but `{name}` is not an option of {strategy}{where}.{hint}"
            f" {strategy} takes: {takes}" + ("; and the keywords `thunder.jit` reads." if jit_keywords else ".")
        )
    return dict(unknown)


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The known option (or flag) a mistyped name most likely meant (``nrpoc`` -> ``nproc``), or None when none is
    close: the one "did you mean" rule of the strategies' keywords and the magics' flags."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def _check_combination(options: StrategyOptions) -> None:
    strategy = options.strategy_name
    if options.device_mesh is not None and not options.hybrid:
        raise OptionError(
            f"You set `{strategy}(device_mesh={options.device_mesh}, sharding_strategy="
            f"'{options.sharding_strategy}')`, but only hybrid sharding uses a mesh: {options.sharding_strategy}"
            " shards over every rank. Set `sharding_strategy='HYBRID_SHARD'` (or '_HYBRID_SHARD_ZERO2'), or leave"
            " `device_mesh` out."
        )
    if not options.jit and options.executors is not None:
        raise OptionError(
            f"You set `{strategy}(jit=False, executors=...)`, but with `jit=False` the strategy never calls"
            " `thunder.jit`, so the executors would be silently ignored. Pass them to your own"
            " `thunder.jit(..., executors=...)` call, or set `jit=True`."
        )
    if not options.jit and options.jit_kwargs:
        names = ", ".join(f"{n}=..." for n in options.jit_keyword_names)
        raise OptionError(
            f"You set `{strategy}(jit=False, {names})`, but with `jit=False` the strategy never calls `thunder.jit`,"
            " so these thunder.jit arguments would be silently ignored. Pass them to your own `thunder.jit(...)` call,"
            " or set `jit=True`."
        )


# -- the names registered with Fabric -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredStrategy:
    """A name for ``Fabric(strategy=...)``: a strategy with some options preset."""

    parallelism: Parallelism
    preset: Mapping[str, Any] = field(default_factory=dict)

    @property
    def description(self) -> str:
        preset = StrategyOptions.defaults(self.parallelism)
        given = parse_options(self.parallelism, dict(self.preset))
        what = given.summary() if self.preset else f"{preset.parallelism.title} with thunderviz's jit decisions"
        return f"Lightning Thunder {what}"


#: ``Fabric(strategy=name)`` -> the strategy and its preset options (``strategies.registry`` registers these).
REGISTERED_STRATEGIES: dict[str, RegisteredStrategy] = {
    "thunder_fsdp": RegisteredStrategy(Parallelism.FSDP),
    "thunder_fsdp_zero3": RegisteredStrategy(Parallelism.FSDP, {"sharding_strategy": Sharding.ZERO3}),
    "thunder_ddp": RegisteredStrategy(Parallelism.DDP),
}


#: ``Fabric(strategy="thunder_auto")``: not one strategy with preset options (those are ``REGISTERED_STRATEGIES``,
#: which the notebook magics also run) but the strategy that chooses among them at ``fabric.setup`` from a memory plan
#: (``strategies.auto.ThunderAutoStrategy``); ``strategies.registry`` registers it beside them.
AUTO_STRATEGY: tuple[str, str] = (
    "thunder_auto",
    "Lightning Thunder DDP or FSDP, chosen at fabric.setup by the predicted memory and communication of each",
)
