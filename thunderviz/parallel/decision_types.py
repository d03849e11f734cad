"""The plain data of the decision table: the facts it decides from and the rows (``Decision``) it logs.

Why apart from the table (``parallel.decisions``): the facts are filled in by the thunder layer
(``thunder.jit.facts``, ``thunder.jit.executors``, ``strategies.mesh``), the rows cross to the kernel and are drawn
by ``render`` and the notebook, and the words of the log (``parallel.decision_reasons``) are built from both; none of
them needs the rules that map one to the other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.front_doors import FrontDoor, Preparation, TransformersFacts
from thunderviz.parallel.option_values import TextEnum
from thunderviz.parallel.strategy_options import StrategyOptions

__all__ = [
    "Action",
    "Case",
    "Decision",
    "ExecutorFacts",
    "MeshFacts",
    "ObjectFacts",
    "ObjectKind",
    "headline_of",
    "impossible",
    "preparations",
    "transformers_preparations",
]


class ObjectKind(str, enum.Enum):
    MODULE = "module"
    THUNDER_MODULE = "thunder module"
    JITTED_FUNCTION = "jitted function"
    #: compiled by Dynamo: ``thunderfx(model)``, or a module ``torch.compile`` wrapped (``FrontDoor`` says how)
    DYNAMO = "dynamo-compiled"
    OTHER = "other"


class Case(TextEnum):
    """Which of the design's cases an object handed to ``fabric.setup`` is (``parallel.decisions`` describes them)."""

    RAW_MODULE = "case 1: raw module"
    FUNCTION_JIT = "case 2: module used inside a jitted function"
    USER_JITTED = "case 3: module already jitted by the user"
    IMPOSSIBLE = "not possible"


class Action(TextEnum):
    JIT_AND_DISTRIBUTE = "jit, then distribute"
    DISTRIBUTE_IN_PLACE = "distribute in place"
    DISTRIBUTE_FOR_FUNCTION_JIT = "distribute for a jitted function"
    #: which executors thunder.jit compiles with (``decide_executors``); logged before the case's own row
    CHOOSE_EXECUTORS = "choose executors"
    #: hybrid sharding: which ranks share a shard group and which replicate it (``decide_mesh``)
    CHOOSE_MESH = "choose the mesh"
    #: no correct choice exists; the strategy raised ``JitDecisionError`` (its message is the reason)
    REFUSE = "error"


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
    #: modules the ``activation_checkpointing_policy`` selects (``parallel.checkpointing``); "" is the model itself
    checkpointed: tuple[str, ...] = ()
    #: the class names inside the module, for the error when a policy selects nothing
    module_classes: tuple[str, ...] = ()
    #: how it was compiled beyond thunder.jit: thunder.compile's recipe and plugins, or Dynamo (``front_doors``)
    door: FrontDoor = field(default_factory=FrontDoor)
    #: a Hugging Face transformers model (None otherwise)
    transformers: TransformersFacts | None = None


@dataclass(frozen=True)
class Decision:
    """One row of the decision log: what was set up, which case it is, what we did, why, and with which options.

    Crosses to the kernel as is (pickled); ``to_dict`` is its serialised form (plain strings) for files and HTML.
    """

    target: str
    case: Case
    action: Action
    reason: str
    clear_cache: bool = False
    options: StrategyOptions | None = None
    #: the decision in one line (``case 1: jit once, then shard - ZERO3, 4 block buckets + root``); ``reason`` is
    #: the full reasoning (mechanism, why this default, measured numbers). Filled in from case and action when empty.
    headline: str = ""
    #: the options' summary when they are known only as text (a decision log read back from a file)
    strategy_summary: str = ""
    #: ``CHOOSE_EXECUTORS``: the executor names the strategy's own ``thunder.jit`` gets, in order (empty: the
    #: strategy does not call thunder.jit, the user's own call chose them)
    executors: tuple[str, ...] = ()
    #: something the user must hear now (``warnings.warn``), e.g. an executor left out because it is not installed
    warning: str = ""
    #: ``CHOOSE_MESH``: ``(replicas, shard_size)``; rank r is in shard group r // shard_size
    mesh: tuple[int, int] | None = None
    #: what the strategy registers or sets before thunder traces the model (a transformers model's masks, its cache)
    prepare: tuple[Preparation, ...] = ()
    #: Fabric compiles what setup returns with torch.compile again: the jitted module's forward is hidden from Dynamo
    dynamo_passthrough: bool = False

    def __post_init__(self) -> None:
        if not self.headline:
            object.__setattr__(self, "headline", headline_of(self.case, self.action, self.reason))

    @property
    def strategy(self) -> str:
        """``FSDP ZERO3 BLOCK``: the options the decision was made with, in one phrase (empty when unknown)."""
        return self.options.summary() if self.options is not None else self.strategy_summary

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        """The inverse of ``to_dict`` for a decision log saved as JSON (its options are known only as text then)."""
        return cls(
            target=str(d["target"]),
            case=Case(d["case"]),
            action=Action(d["action"]),
            reason=str(d["reason"]),
            clear_cache=bool(d.get("clear_cache", False)),
            headline=str(d.get("headline", "")),
            strategy_summary=str(d.get("strategy", "")),
            executors=tuple(str(e) for e in d.get("executors", ())),
            warning=str(d.get("warning", "")),
            mesh=tuple(d["mesh"]) if d.get("mesh") else None,  # type: ignore[arg-type]
            prepare=tuple(Preparation(p) for p in d.get("prepare", ())),
            dynamo_passthrough=bool(d.get("dynamo_passthrough", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain strings and a bool (Enums by value, the options as their ``summary()``)."""
        out: dict[str, Any] = {
            "target": self.target,
            "case": str(self.case),
            "action": str(self.action),
            "reason": self.reason,
            "clear_cache": self.clear_cache,
            "strategy": self.strategy,
            "headline": self.headline,
        }
        if self.action is Action.CHOOSE_EXECUTORS:
            out["executors"] = list(self.executors)
        if self.warning:
            out["warning"] = self.warning
        if self.mesh is not None:
            out["mesh"] = list(self.mesh)
        if self.prepare:
            out["prepare"] = [str(p) for p in self.prepare]
        if self.dynamo_passthrough:
            out["dynamo_passthrough"] = True
        return out


def impossible(target: str, error: JitDecisionError, options: StrategyOptions | None = None) -> Decision:
    """The log row of a decision that could not be made (the strategy raises ``error`` right after logging it)."""
    return Decision(target=target, case=Case.IMPOSSIBLE, action=Action.REFUSE, reason=str(error), options=options)


def headline_of(case: Case, action: Action, reason: str = "", plan: str = "") -> str:
    """One line a person reads first: ``case 1: jit once, then shard - ZERO3, 4 block buckets + root``.

    Why a separate line: the reason is a paragraph (mechanism, why this default, measured numbers), and repeated in
    every cell's output it hid the decision itself. ``plan`` is ``plan_headline``; without it (a decision log read
    back from a file) the headline is the case and the action.
    """
    number = str(case).split(":", 1)[0]
    if case is Case.IMPOSSIBLE:
        first = reason.split(". ", 1)[0].rstrip(".")
        return f"error: {first}" if first else "error"
    what = {
        Action.JIT_AND_DISTRIBUTE: "jit once, then distribute",
        Action.DISTRIBUTE_IN_PLACE: "distribute your jitted module in place",
        Action.DISTRIBUTE_FOR_FUNCTION_JIT: "distribute in place for your jitted function",
    }.get(action, str(action))
    return f"{number}: {what}" + (f" - {plan}" if plan else "")


def preparations(facts: ObjectFacts, options: StrategyOptions) -> tuple[Preparation, ...]:
    """What must be registered or set before thunder traces this object (a transformers model's masks and cache, and
    in case 2 Fabric's walk over its output)."""
    function_jit = facts.kind is ObjectKind.MODULE and not options.jit
    return transformers_preparations(facts.transformers, function_jit)


def transformers_preparations(hf: TransformersFacts | None, function_jit: bool = False) -> tuple[Preparation, ...]:
    """``preparations`` of a transformers model from its facts alone (``function_jit``: case 2, the user's jitted
    function calls Fabric's wrapper): what the plan's rehearsal, which traces a copy of the model outside any
    strategy, must do as the strategy would."""
    if hf is None:
        return ()
    steps = []
    if hf.masks_by_vmap:
        steps.append(Preparation.MASKS_BY_BROADCASTING)
    if hf.use_cache:
        steps.append(Preparation.NO_GENERATION_CACHE)
    if function_jit:
        steps.append(Preparation.OUTPUT_HOOKS_BY_LEAVES)
    return tuple(steps)


@dataclass(frozen=True)
class ExecutorFacts:
    """What the executor rule needs to know about this process, as plain data (``thunder.executors`` reads it)."""

    device: str  # "cpu" or "cuda": where the strategy's ranks compute
    installed: tuple[str, ...]  # executor names registered with the installed thunder (nvFuser only if importable)
    defaults: tuple[str, ...]  # thunder's default executors here (``thunder.get_default_executors()``)
    #: torch.compile's inductor can build kernels on ``device`` (a C++ compiler on CPU, triton on CUDA)
    inductor_ok: bool = True
    inductor_problem: str = ""  # why not, in words (empty when ``inductor_ok``)
    #: case 3: the executors of the user's own thunder.jit call, read from its compile data
    user_jitted: tuple[str, ...] = ()
    #: case 3: the call that made the module when it was not thunder.jit (``thunder.compile(model, recipe=...)``)
    user_call: str = ""


@dataclass(frozen=True)
class MeshFacts:
    """Where the ranks are: ``hosts[r]`` is rank r's host name (what the ranks told each other at set-up)."""

    hosts: tuple[str, ...]

    @property
    def world(self) -> int:
        return len(self.hosts)

    def host_blocks(self) -> list[tuple[str, int]] | None:
        """``[(host, ranks)]`` in rank order when each host's ranks are consecutive, else None."""
        blocks: list[tuple[str, int]] = []
        for host in self.hosts:
            if blocks and blocks[-1][0] == host:
                blocks[-1] = (host, blocks[-1][1] + 1)
            elif any(h == host for h, _ in blocks):
                return None
            else:
                blocks.append((host, 1))
        return blocks
