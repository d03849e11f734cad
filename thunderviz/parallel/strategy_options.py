"""Parsing the keywords handed to a strategy into ``StrategyOptions``, the one typed result every layer reads.

Why apart from the table (``parallel.options``): the table says what each option is; this module says what a
keyword can be and in which order it is checked, and holds the result the decision table, the strategy, the
communication plan, the magics and the reports read. Plain Python: no torch, no thunder, no lightning.

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
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from thunderviz.parallel.option_values import (
    DEFAULT_BUCKET_SIZE_IN_MB,
    DEFAULT_BUCKETING,
    DEFAULT_SHARDING,
    Bucketing,
    CheckpointPolicy,
    OptionError,
    Parallelism,
    ReduceDtype,
    Sharding,
    StateDictType,
    UnknownOptionError,
)
from thunderviz.parallel.options import FOREIGN_OPTIONS, option_named, options_for

__all__ = [
    "AUTO_STRATEGY",
    "REGISTERED_STRATEGIES",
    "RegisteredStrategy",
    "StrategyOptions",
    "closest_name",
    "executor_names",
    "parse_options",
]


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
        return cls(parallelism=parallelism, state_dict_type=option_named("state_dict_type").default_for(parallelism))


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
        option = option_named(name)
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
