"""The protocol between the kernel and a rank: what a cell sends, what comes back, and what a rank's namespace holds.

Everything that crosses between ``engine.py`` (kernel side) and the rank side (``rank.calls`` names its entry
points) is defined here, so one cell's path can be read hop by hop. Three delivery mechanisms, each for one kind of
thing:

1. **The user's cell** goes by ipyparallel ``execute``: it runs as a real IPython cell in the rank (magics,
   tracebacks, the shell's ``post_run_cell`` event), and its stdout/stderr stream back while it runs.
2. **Our own calls** go by ipyparallel ``apply`` of a plain function named in ``rank.calls`` (pickled by
   reference), with this module's dataclasses as arguments; the result comes back in the reply:
   ``identify(engine_id, controller_host, controller_port)`` -> ``topology.EngineIdentity``,
   ``bind_rendezvous(address)`` -> port (rank 0 only), ``set_up(RankSetup)``, ``prepare_cell(CellConfig)``,
   ``check_process_group(seconds)`` -> ``bool``, ``reset()`` (an in-place restart) and ``warm_up()``. No code
   strings: a static reader can follow every call.
3. **The report data** comes back on the user cell's own data channel (``ipyparallel.datapub``): the rank's
   ``post_run_cell`` hook publishes a ``ReportData`` under ``REPORT_DATA_KEY`` before the cell's reply, so a warm
   cell costs one message per rank instead of a second round trip. While the hook captures traces it first
   publishes ``{PHASE_DATA_KEY: Phase.COLLECTING}``, so the kernel can show that phase.

A cell therefore sends: its source (1), preceded by a ``CellConfig`` (2) only when the strategy, the collect flag
or the timeline flags changed, or after a failure. It gets back: the reply (ok, or a ``RemoteError``), the output,
and a ``ReportData``.

The rank's namespace holds ``NAMESPACE_NAMES`` (the names a user's cell can rely on) and nothing else of ours: the
rank's bookkeeping (set-up info, the strategy spec in use, call counts before the cell) lives in
``rank.state.STATE``, not in ``_thunderviz_*`` variables a user could see, clobber or ``%reset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from thunderviz.cell.failures import RankUsageError
from thunderviz.parallel.decisions import Decision
from thunderviz.parallel.option_values import OptionError
from thunderviz.parallel.strategy_options import REGISTERED_STRATEGIES, StrategyOptions, parse_options
from thunderviz.trace.memory import StepMemory
from thunderviz.trace.workload import Workload

if TYPE_CHECKING:
    from thunderviz.timeline.model import RankTimeline
    from thunderviz.trace.ledger import Ledger
    from thunderviz.trace.model import TraceBundle

__all__ = [
    "DEFAULT_TIMELINE_STEPS",
    "FABRIC_STRATEGY_KIND",
    "NAMESPACE_NAMES",
    "PHASE_DATA_KEY",
    "REPORT_DATA_KEY",
    "CellConfig",
    "MemoryReading",
    "RankSetup",
    "ReportData",
    "StrategySpec",
    "TimelinePart",
    "missing_report",
]

#: The names every rank's namespace has after set-up; ``fabric`` is ``None`` until a cell asks for a strategy.
NAMESPACE_NAMES = ("torch", "thunder", "rank", "local_rank", "world_size", "device", "fabric")
#: Key of the ``ReportData`` a rank publishes on a user cell's data channel.
REPORT_DATA_KEY = "thunderviz_collected"
#: Key of the phase a rank publishes while its hook runs (``status.Phase.COLLECTING``: capturing traces for the
#: report).
PHASE_DATA_KEY = "thunderviz_phase"
#: ``StrategySpec.kind`` for one of Fabric's own strategies by name (``StrategySpec("fabric", {"name": "ddp"})``).
FABRIC_STRATEGY_KIND = "fabric"


@dataclass(frozen=True, init=False)
class StrategySpec:
    """Which Fabric strategy every rank builds: a thunderviz name
    (``parallel.strategy_options.REGISTERED_STRATEGIES``, e.g. ``thunder_fsdp``) with its options parsed here, in the
    kernel, or ``fabric`` with ``{"name": "ddp"}`` for one of Fabric's own strategies.

    Parsing in the kernel is the point: a bad option fails before any rank is touched, and the rank receives
    ``StrategyOptions`` it only has to hand to the strategy (``strategy_class.from_options``). Options from a spec
    never go to ``thunder.jit``: in a notebook, jit your module yourself to pass thunder.jit keywords.
    """

    kind: str
    options: StrategyOptions | None
    fabric_name: str | None

    def __init__(self, kind: str, options: Mapping[str, Any] | StrategyOptions | None = None) -> None:
        given = options or {}
        if kind == FABRIC_STRATEGY_KIND:
            parsed, fabric_name = None, str(dict(given).get("name", "ddp"))  # type: ignore[arg-type]
        elif kind in REGISTERED_STRATEGIES:
            entry = REGISTERED_STRATEGIES[kind]
            if isinstance(given, StrategyOptions):
                parsed = given
            else:
                try:
                    parsed = parse_options(entry.parallelism, {**entry.preset, **given})
                except OptionError as exc:
                    raise RankUsageError(str(exc)) from None
            fabric_name = None
        else:
            known = ", ".join([*REGISTERED_STRATEGIES, FABRIC_STRATEGY_KIND])
            raise RankUsageError(f"StrategySpec(kind={kind!r}): use one of {known}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "options", parsed)
        object.__setattr__(self, "fabric_name", fabric_name)

    def describe(self) -> str:
        """``thunder_fsdp (FSDP ZERO3 BLOCK)``, ``fabric ddp``: what the report's title says was run."""
        if self.options is None:
            return f"{self.kind} {self.fabric_name}"
        return f"{self.kind} ({self.options.summary()})"


@dataclass(frozen=True)
class RankSetup:
    """What set-up sends each rank: its place in the world, the rendezvous, the backend and the group's timeout.

    ``master_addr:master_port`` is the socket rank 0 already listens on (``bind_rendezvous``); ``socket_ifname`` is
    the interface this rank reaches the controller through, used for ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``
    unless the engine's environment sets them.
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    backend: str
    timeout_s: float
    threads: int
    socket_ifname: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: How many steps ``--timeline`` records after the first when ``--steps`` is not given.
DEFAULT_TIMELINE_STEPS = 5


@dataclass(frozen=True)
class CellConfig:
    """What a cell sends before its source when something changed: the strategy (``None`` to keep the current
    ``fabric``), whether the report data is collected after the cell, and whether each cell is recorded as a
    timeline of ``steps`` training steps (``--timeline --steps N``).

    The rank keeps the config until the next one arrives, so a warm cell with unchanged flags sends none.
    """

    strategy: StrategySpec | None
    collect: bool = True
    timeline: bool = False
    steps: int = DEFAULT_TIMELINE_STEPS

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise RankUsageError(
                f"CellConfig(steps={self.steps!r}): a timeline records a whole number >= 1 of training steps after "
                f"the first; e.g. --timeline --steps {DEFAULT_TIMELINE_STEPS}"
            )


class MemoryReading(TypedDict, total=False):
    """One rank's memory after a cell: process RSS always, CUDA's allocator statistics with NCCL."""

    rss_bytes: int
    cuda_max_allocated_bytes: int
    cuda_allocated_bytes: int


class TimelinePart(TypedDict, total=False):
    """With ``--timeline``, what a rank adds to its ``ReportData`` (``rank.timeline.finish_cell_recording``):
    ``timeline``, this rank's recording (absent when nothing was recorded), and ``timeline_problems``, why it is
    missing or partial, in words."""

    timeline: RankTimeline
    timeline_problems: list[str]


class ReportData(TimelinePart, total=False):
    """What one rank sends back after a user cell (picklable; ``RunReport.from_ranks`` merges them).

    ``rank`` and ``host``: who sent it; ``decisions``: this cell's entries of the strategy's decision log;
    ``bundles``: trace bundles by object name; ``ledgers``: collectives ledgers by object name; ``memory``: see
    ``MemoryReading``; ``step_memory``: the measured peak of the cell's steady-state training steps
    (``thunder.memory.meter``); ``problems``: what could not be gathered, in words. With ``--timeline``, the fields
    of ``TimelinePart`` too (sent also when the cell raised: what ran before the error).
    """

    rank: int
    host: str
    memory: MemoryReading
    step_memory: StepMemory
    decisions: list[Decision]
    bundles: dict[str, TraceBundle]
    ledgers: dict[str, Ledger]
    problems: list[str]
    #: what each compile of the cell did: ``reused an earlier set-up's trace (...)`` / ``interpreted in 9.1 s``
    compile: list[str]
    #: what the cell trained (model, batch, optimizer, world): which runs the "which strategy?" table compares
    workload: Workload | None


def missing_report(rank: int, why: str) -> ReportData:
    """The stand-in for a rank whose report data did not arrive, or could not be gathered (the report says why
    instead of failing)."""
    return ReportData(rank=rank, problems=[why])
