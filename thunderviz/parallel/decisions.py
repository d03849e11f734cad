"""The one decision table: what a thunder strategy does with the object handed to ``fabric.setup``.

Both strategies, the notebook and the docs read this table; nothing else decides. ``thunder.facts.inspect_object``
turns a live object into plain facts, ``decide`` maps facts + options to a ``Decision`` (pure, so every row is
unit-testable without processes or thunder), and the strategy carries the decision out.

Cases, as the design names them:
- case 1: a raw ``nn.Module`` and ``jit=True``: we ``thunder.jit`` it, then distribute it.
- case 2: a raw ``nn.Module`` and ``jit=False``: the user jits a *function* that takes the model; we distribute the
  module's parameters and thunder inserts the collectives when that function is traced.
- case 3: a module the user already jitted: distribute it in place and hand back the user's own object.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

from thunderviz.errors import JitDecisionError

__all__ = [
    "BUCKETING_STRATEGIES",
    "DEFAULT_BUCKETING_STRATEGY",
    "SHARDING_STRATEGIES",
    "Action",
    "Decision",
    "ObjectFacts",
    "ObjectKind",
    "StrategyOptions",
    "communication_plan",
    "decide",
    "validate_options",
]


#: The FSDP knobs' accepted names (thunder's ``FSDPType`` / ``FSDPBucketingStrategy`` members), here so the
#: strategies and the notebook flags read one list without importing thunder.
SHARDING_STRATEGIES = ("ZERO2", "ZERO3")
BUCKETING_STRATEGIES = ("NONE", "LAYER", "BLOCK")

#: FSDP's default bucketing, chosen by measurement (``bench/comm_overhead.py``): on a 4-block GPT (d=128, batch
#: 8x64) on 2 CPU ranks with gloo, the CPU time a step spends beyond one-process ``thunder.jit`` was about 10-12 ms
#: with BLOCK (5 all_gather + 5 reduce_scatter), 29 ms with LAYER (29 + 29) and 36-44 ms with NONE (53 + 53), and
#: torch's FSDP2 (``fully_shard`` per block, then the root) spent 21-25 ms.
DEFAULT_BUCKETING_STRATEGY = "BLOCK"
_BLOCK_MEASURED = (
    "BLOCK is the default because it measured cheapest: on a 4-block GPT on 2 CPU ranks, about 10-12 ms of CPU per"
    " step beyond one-process thunder.jit, against 29 ms for LAYER, 36-44 ms for NONE and 21-25 ms for torch's FSDP2"
)


class ObjectKind(str, enum.Enum):
    MODULE = "module"
    THUNDER_MODULE = "thunder module"
    JITTED_FUNCTION = "jitted function"
    OTHER = "other"


class Action(str, enum.Enum):
    JIT_AND_DISTRIBUTE = "jit, then distribute"
    DISTRIBUTE_IN_PLACE = "distribute in place"
    DISTRIBUTE_FOR_FUNCTION_JIT = "distribute for a jitted function"


@dataclass(frozen=True)
class ObjectFacts:
    """What matters about the object handed to ``fabric.setup``, as plain data."""

    kind: ObjectKind
    type_name: str
    has_run: bool = False
    cached_traces: int = 0
    distributed_by_thunder: str | None = None  # "fsdp" / "ddp" when thunder's own fsdp()/ddp() was applied
    distributed_by_us: bool = False
    blocks: tuple[str, ...] = ()  # the module's blocks (``parallel.buckets.find_blocks``), for FSDP's BLOCK buckets


@dataclass(frozen=True)
class StrategyOptions:
    """The strategy's knobs that the decision depends on."""

    parallelism: str  # "fsdp" or "ddp"
    jit: bool = True
    executors: tuple[str, ...] | None = None
    sharding_strategy: str = "ZERO2"
    bucketing_strategy: str = DEFAULT_BUCKETING_STRATEGY
    jit_kwargs: tuple[str, ...] = ()  # names of the keyword arguments meant for the strategy's thunder.jit call
    bucket_size_in_mb: float = 25.0  # DDP's gradient buckets

    @property
    def strategy_name(self) -> str:
        return "ThunderFSDPStrategy" if self.parallelism == "fsdp" else "ThunderDDPStrategy"


@dataclass(frozen=True)
class Decision:
    """One row of the decision log: what was set up, which case it is, what we did, and why."""

    target: str
    case: str
    action: str
    reason: str
    clear_cache: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate_options(options: StrategyOptions) -> list[str]:
    """Reject contradictory knobs at construction time; return the notes to add to every decision's reason."""
    if options.parallelism not in ("fsdp", "ddp"):
        raise ValueError(f"parallelism must be 'fsdp' or 'ddp', got {options.parallelism!r}")
    if not options.jit and options.executors is not None:
        raise ValueError(
            f"You set `{options.strategy_name}(jit=False, executors=...)`, but with `jit=False` the strategy never"
            " calls `thunder.jit`, so the executors would be silently ignored. Pass them to your own"
            " `thunder.jit(..., executors=...)` call, or set `jit=True`."
        )
    if not options.jit and options.jit_kwargs:
        raise ValueError(
            f"You set `{options.strategy_name}(jit=False, {_kwargs(options.jit_kwargs)})`, but with `jit=False` the"
            " strategy never calls `thunder.jit`, so these thunder.jit arguments would be silently ignored. Pass"
            " them to your own `thunder.jit(...)` call, or set `jit=True`."
        )
    if options.parallelism == "fsdp" and (
        options.sharding_strategy not in SHARDING_STRATEGIES or options.bucketing_strategy not in BUCKETING_STRATEGIES
    ):
        raise ValueError(
            f"sharding_strategy must be one of {SHARDING_STRATEGIES} and bucketing_strategy one of"
            f" {BUCKETING_STRATEGIES}; got {options.sharding_strategy!r} and {options.bucketing_strategy!r}"
        )
    return []


def communication_plan(options: StrategyOptions, facts: ObjectFacts | None = None) -> str:
    """What the strategy does with the collectives (``thunder.comm_setup``), in the words of the decision log."""
    if options.parallelism == "ddp":
        if options.bucket_size_in_mb <= 0:
            return (
                "communication: one all_reduce per gradient (bucket_size_in_mb=0), each issued as soon as its"
                " gradient exists and waited for just before backward returns"
            )
        first = min(options.bucket_size_in_mb, 1.0)
        return (
            f"communication: gradients packed, in the order backward produces them, into buckets of"
            f" {options.bucket_size_in_mb:g} MB (the first one {first:g} MB, as torch DDP does, so the first"
            " all_reduce starts early); one all_reduce per bucket, issued as soon as its last gradient exists and"
            " waited for just before backward returns, so it overlaps the rest of backward"
        )
    blocks = facts.blocks if facts is not None else ()
    bucketing = options.bucketing_strategy
    if bucketing == "BLOCK":
        if blocks:
            span = blocks[0] if len(blocks) == 1 else f"{blocks[0]} ... {blocks[-1]}"
            what = (
                f"one bucket per block ({len(blocks)}: {span}, the children of the model's repeated"
                " ModuleList/Sequential) and one root bucket for the parameters outside them"
            )
        else:
            what = (
                "one root bucket holding every parameter (no repeated ModuleList/Sequential of blocks was found;"
                " LAYER gives one bucket per layer instead)"
            )
    elif bucketing == "LAYER":
        what = "one bucket per module that owns parameters (a Linear's weight and bias)"
    else:
        what = "one bucket per parameter"
    if options.sharding_strategy == "ZERO3":
        sharding = (
            "ZERO3: backward gathers each bucket again from its shards, so forward releases the unsharded weights"
            " after their last use and saves shards, not unsharded weights, for backward"
        )
    else:
        sharding = "ZERO2: the unsharded parameters gathered in forward are kept for backward"
    default = f"; {_BLOCK_MEASURED}" if bucketing == DEFAULT_BUCKETING_STRATEGY else ""
    return (
        f"communication: {bucketing} bucketing, {what}; one all_gather per bucket in forward, issued one bucket"
        " ahead of its first use and waited for right before it, and one reduce_scatter per bucket in backward,"
        f" issued as soon as its last gradient exists and waited for just before backward returns; {sharding}"
        f"{default}"
    )


def _kwargs(names: tuple[str, ...]) -> str:
    return ", ".join(f"{n}=..." for n in names)


def _verb(options: StrategyOptions) -> str:
    return "shard its parameters (FSDP)" if options.parallelism == "fsdp" else "replicate its parameters (DDP)"


def decide(facts: ObjectFacts, options: StrategyOptions, notes: list[str] | None = None) -> Decision:
    """The decision table. Raises ``JitDecisionError`` where no choice would be correct."""
    name = options.strategy_name
    tail = "".join(f"; {n}" for n in [*(notes or []), communication_plan(options, facts)])

    if facts.kind is ObjectKind.JITTED_FUNCTION:
        raise JitDecisionError(
            f"`fabric.setup` received the jitted function {facts.type_name!r}, but {name} distributes modules. Set up"
            f" the model instead (`{name}(jit=False)`, then `model = fabric.setup(model)`) and call your jitted"
            " function with it: thunder inserts the collectives when the function is traced."
        )
    if facts.kind is ObjectKind.OTHER:
        raise JitDecisionError(
            f"`fabric.setup` received a {facts.type_name!r}, but {name} can only set up a `torch.nn.Module` or a"
            " module returned by `thunder.jit(module)`."
        )
    if facts.distributed_by_us:
        raise JitDecisionError(
            f"This {facts.type_name} was already set up by a thunderviz strategy: its parameters are already"
            " distributed. Call `fabric.setup` once per model and keep using the object it returned."
        )
    if facts.distributed_by_thunder:
        fn = f"thunder.distributed.{facts.distributed_by_thunder}"
        raise JitDecisionError(
            f"This ThunderModule was already distributed with `{fn}(...)`, so {name} would distribute it a second"
            f" time. Either hand `fabric.setup` the module before calling `{fn}`, or drop the strategy and keep"
            f" using `{fn}` yourself."
        )

    if facts.kind is ObjectKind.MODULE:
        if options.jit:
            given = ([f"executors={list(options.executors)}"] if options.executors else []) + (
                [_kwargs(options.jit_kwargs)] if options.jit_kwargs else []
            )
            executors = f" with {', '.join(given)}" if given else ""
            return Decision(
                target=facts.type_name,
                case="case 1: raw module",
                action=Action.JIT_AND_DISTRIBUTE.value,
                reason=f"a plain nn.Module and jit=True: call thunder.jit{executors} once, then {_verb(options)} in"
                f" place so model.parameters() are what the optimizer must update{tail}",
            )
        return Decision(
            target=facts.type_name,
            case="case 2: module used inside a jitted function",
            action=Action.DISTRIBUTE_FOR_FUNCTION_JIT.value,
            reason=f"jit=False: the module is not jitted here; {_verb(options)} in place and tag them, so thunder"
            " inserts the collectives when the user's jitted function is traced; cached traces of jitted functions"
            f" that already ran are cleared so none runs without collectives{tail}",
            clear_cache=True,
        )

    # A ThunderModule the user made.
    if options.executors is not None:
        raise JitDecisionError(
            f"You passed `executors=` to {name}, but the {facts.type_name} you set up is already jitted, and jitting"
            " it a second time is never right. Pass the executors to your own `thunder.jit(model, executors=...)`"
            " call, or hand `fabric.setup` the plain module."
        )
    if options.jit_kwargs:
        raise JitDecisionError(
            f"You passed thunder.jit arguments ({_kwargs(options.jit_kwargs)}) to {name}, but the"
            f" {facts.type_name} you set up is already jitted, so the strategy never calls `thunder.jit` and they"
            " would be silently ignored. Pass them to your own `thunder.jit(model, ...)` call, or hand"
            " `fabric.setup` the plain module."
        )
    jit_note = "; jit=False changes nothing here: the module is already jitted" if not options.jit else ""
    if facts.has_run:
        return Decision(
            target=facts.type_name,
            case="case 3: module already jitted by the user",
            action=Action.DISTRIBUTE_IN_PLACE.value,
            reason=f"already jitted (not jitting twice) and already run: {_verb(options)} in place and clear its"
            f" {facts.cached_traces} cached trace(s), which were made without collectives and could still pass"
            f" thunder's checks; the next call retraces{jit_note}{tail}",
            clear_cache=True,
        )
    return Decision(
        target=facts.type_name,
        case="case 3: module already jitted by the user",
        action=Action.DISTRIBUTE_IN_PLACE.value,
        reason=f"already jitted (not jitting twice): {_verb(options)} in place and return the user's own"
        f" ThunderModule, so no undistributed handle is left behind{jit_note}{tail}",
    )
