"""The values a strategy option takes, and how what a user passed becomes one.

Why its own module: the option table (``parallel.options``), the typed result (``parallel.strategy_options``), the
decision table, the strategies and the thunder layer all name these types (``Parallelism``, ``Sharding``,
``CheckpointPolicy``, ...), and the converters are the one place a value as given (a string in any case, thunder's or
torch's enum, a ``DeviceMesh``, a set of classes) turns into one of them, or into an ``OptionError`` that names the
call and the fix. Plain Python: no torch, no thunder, no lightning.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from thunderviz.errors import ThundervizError

__all__ = [
    "DEFAULT_BUCKETING",
    "DEFAULT_BUCKET_SIZE_IN_MB",
    "DEFAULT_SHARDING",
    "FIRST_BUCKET_SIZE_IN_MB",
    "Bucketing",
    "CheckpointPolicy",
    "OptionError",
    "Parallelism",
    "ReduceDtype",
    "Sharding",
    "StateDictType",
    "TextEnum",
    "UnknownOptionError",
    "as_bool",
    "as_checkpoint_policy",
    "as_choice",
    "as_executors",
    "as_given",
    "as_megabytes",
    "as_mesh",
    "as_reduce_dtype",
    "as_text_or_none",
    "as_timeout",
    "comma_list",
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


class OptionError(ThundervizError, ValueError):
    """A strategy option (a constructor keyword or a magic's flag) is invalid; the message says what to use."""


class UnknownOptionError(OptionError, TypeError):
    """A keyword no strategy, Fabric or ``thunder.jit`` takes (a ``TypeError``, as for any unexpected keyword)."""


# -- converters: value as given -> the one typed value; raise OptionError naming the call and the fix -------------


def _call(strategy: str, name: str, value: Any) -> str:
    return f"You set `{strategy}({name}={value!r})`"


def as_choice(
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


def as_bool(value: Any, strategy: str, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise OptionError(f"{_call(strategy, name, value)}; it must be True or False.")


def as_megabytes(value: Any, strategy: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise OptionError(
            f"{_call(strategy, name, value)}; it must be a number >= 0 (megabytes of gradients per all-reduce;"
            " 0 means one all-reduce per parameter)."
        )
    return float(value)


def as_executors(value: Any, strategy: str, name: str) -> tuple[Any, ...] | None:
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


def as_mesh(value: Any, strategy: str, name: str) -> tuple[int, int] | None:
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
        value = comma_list(value.replace("x", ","))
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


def as_timeout(value: Any, strategy: str, name: str) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    raise OptionError(f"{_call(strategy, name, value)}; it must be a datetime.timedelta (or None).")


def as_reduce_dtype(value: Any, strategy: str, name: str) -> ReduceDtype | None:
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


def as_checkpoint_policy(value: Any, strategy: str, name: str) -> CheckpointPolicy | None:
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


def as_given(value: Any, strategy: str, name: str) -> Any:
    return value


def as_text_or_none(value: Any, strategy: str, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise OptionError(f"{_call(strategy, name, value)}; it must be a string (or None).")


def comma_list(text: str) -> list[str]:
    """``"torch, python"`` -> ``["torch", "python"]``: how a flag (or a mesh written ``2,4``) lists its values."""
    return [part.strip() for part in text.split(",") if part.strip()]
