"""``RunReport``: what one cell did on every rank, as a picklable object that shows itself as static HTML.

This module gathers each rank's data (decisions, traces, ledgers, memory, problems) into one object; drawing it is
``thunderviz.render.run_report``'s job (static HTML, so it reads the same in JupyterLab, nbconvert and GitHub).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thunderviz.cell.protocol import MemoryReading, ReportData, StrategySpec
from thunderviz.parallel.decisions import Decision
from thunderviz.rank.cell_phase import SPLIT
from thunderviz.trace.ledger import find_mismatches
from thunderviz.trace.memory import MemoryComparison, MemoryEstimate, StepMemory, compare, largest_peak
from thunderviz.trace.workload import Workload

__all__ = ["RunReport"]


@dataclass
class RunReport:
    """One cell's results. ``bundles`` are rank 0's trace bundles by object name; ``ledgers[name][rank]`` every
    rank's collectives ledger; ``mismatches[name]`` the cross-rank disagreements found in them. With
    ``--timeline``, ``timeline`` is the measured per-rank ``timeline.model.Timeline`` (see there).
    ``step_memory[rank]`` is the measured peak of the cell's steady-state steps (``trace.memory.StepMemory``);
    with ``--plan``, ``prediction`` is the plan's estimate for this strategy and world size (``prediction_name``
    names the candidate) and ``memory_comparison()`` sets the two side by side."""

    world_size: int
    backend: str
    strategy: StrategySpec | None
    #: from the moment the ranks were ready for the cell (configuring ``fabric``, the cell, the report's capture)
    seconds: float
    decisions: list[Decision] = field(default_factory=list)
    bundles: dict[str, Any] = field(default_factory=dict)
    bundles_by_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    ledgers: dict[str, dict[int, Any]] = field(default_factory=dict)
    mismatches: dict[str, list[Any]] = field(default_factory=dict)
    memory: dict[int, MemoryReading] = field(default_factory=dict)
    step_memory: dict[int, StepMemory] = field(default_factory=dict)
    #: per rank, what each compile of the cell did (``thunder.reuse.compile_reuse``): reused a trace, or interpreted
    compiles: dict[int, list[str]] = field(default_factory=dict)
    prediction: MemoryEstimate | None = None
    prediction_name: str = ""
    #: with ``--plan``, the whole ``thunderviz.plan(...)`` the prediction came from: the report draws every candidate
    #: against its budget with this run's ranks under its own (why the others were not run, e.g. DDP does not fit)
    plan: Any = field(default=None, repr=False)
    outputs: dict[int, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    timeline_requested: bool = False
    timeline_data: Any = field(default=None, repr=False)
    #: the cell's name (``--name zero2``), which every view of the report leads with ("" when unnamed)
    name: str = ""
    #: what the cell spent before ``seconds`` began: starting (or restarting) the rank pool it runs on, importing
    #: torch and thunder there, joining the process group. The header and the status chips say both (once
    #: the chips said 20.1 s, the header 13.61 s, for one cell)
    start_seconds: float = 0.0
    #: the host each rank ran on (what the rank pool knows): ``traffic()`` splits communication by it
    rank_hosts: dict[int, str] = field(default_factory=dict)
    #: what the cell trained (model, one rank's batch, optimizer, ranks): the runs it is compared with share it
    workload: Workload | None = None

    @property
    def timeline(self) -> Any:
        """The cell's measured timeline (``timeline.model.Timeline``): ``report.timeline.analysis()``,
        ``report.timeline.save_chrome_trace(path)``, ``TimelineView(report.timeline)``.

        Raises:
            NoTimelineError: the cell ran without ``--timeline``, or no rank returned a recording (why is in
                ``problems``).
        """
        if self.timeline_data is None:
            from thunderviz.timeline.model import NoTimelineError

            if not self.timeline_requested:
                raise NoTimelineError(
                    "RunReport.timeline: this cell ran without --timeline; run it as %%thunder_fsdp --timeline "
                    "[--steps N] (or engine.run(..., timeline=True)) to record one"
                )
            why = "; ".join(p for p in self.problems if "timeline" in p) or "no rank returned a recording"
            raise NoTimelineError(f"RunReport.timeline: no timeline was recorded: {why}")
        return self.timeline_data

    @classmethod
    def from_ranks(
        cls,
        collected: dict[int, ReportData],
        *,
        outputs: dict[int, str],
        world_size: int,
        backend: str,
        strategy: StrategySpec | None,
        seconds: float,
        timeline: bool = False,
        failed_ranks: dict[int, str] | None = None,
    ) -> RunReport:
        """Merge what ``collect.collect`` returned on each rank (and, with ``timeline``, each rank's recording;
        ``failed_ranks`` names the ranks that died while recording)."""
        report = cls(world_size=world_size, backend=backend, strategy=strategy, seconds=seconds, outputs=outputs)
        if timeline:
            _merge_timeline(report, collected, failed_ranks or {})
        if not collected:
            return report
        rank0 = collected.get(0, {})
        report.decisions = list(rank0.get("decisions", []))
        report.bundles = dict(rank0.get("bundles", {}))
        report.workload = rank0.get("workload")
        for rank in sorted(collected):
            data = collected[rank]
            report.memory[rank] = MemoryReading(**data.get("memory", {}))
            if data.get("step_memory") is not None:
                report.step_memory[rank] = data["step_memory"]
            if data.get("compile"):
                report.compiles[rank] = list(data["compile"])
            if data.get("bundles"):
                report.bundles_by_rank[rank] = dict(data["bundles"])
            for name, ledger in data.get("ledgers", {}).items():
                report.ledgers.setdefault(name, {})[rank] = ledger
            report.problems.extend(f"rank {rank}: {p}" for p in data.get("problems", []))
        report.problems = sorted(set(report.problems), key=report.problems.index)
        report.mismatches = _mismatches(report.ledgers)
        return report

    # -- the run's facts, computed here once and read by every view ---------------------------------------------

    def sent_per_step(self) -> int | None:
        """Bytes the busiest rank puts on the wire per step (``trace.wire``: every traced object's collectives, ring
        algorithms); None without ledgers. What the verdicts, the ledgers and the "which strategy?" table say."""
        per_rank: dict[int, int] = {}
        for by_rank in self.ledgers.values():
            for rank, ledger in by_rank.items():
                per_rank[rank] = per_rank.get(rank, 0) + ledger.sent_bytes()
        return max(per_rank.values()) if per_rank else None

    def step_peak(self) -> tuple[int, StepMemory] | None:
        """The largest rank's measured step peak, ``(rank, StepMemory)`` (ties: the lowest rank); None when no rank
        measured one. The run's peak wherever one number stands for the run."""
        return largest_peak(self.step_memory)

    def step_time(self) -> tuple[float, tuple[int, ...], bool] | None:
        """The run's step time from its timeline, ``(milliseconds, step numbers, unprofiled)``: the median over
        those steps of the slowest rank's step, timed with the profiler stopped when ``unprofiled``
        (``TimelineAnalysis.step_time``); None without a timeline."""
        if self.timeline_data is None:
            return None
        analysis = self.timeline_data.analysis()
        us = analysis.step_time()
        return None if us is None else (us / 1000.0, *analysis.timed_steps())

    def traffic(self) -> Any:
        """What the run sent per step within hosts and between them (``reports.traffic.HostTraffic``; None without
        ledgers or hosts): under hybrid sharding, how much stayed off the inter-host link."""
        from thunderviz.reports.traffic import host_traffic

        return host_traffic(self.ledgers, self.rank_hosts)

    @property
    def compile_story(self) -> str:
        """What the cell's compiles did, in one line (``compile_summary``); empty when nothing was compiled."""
        return compile_summary(self.compiles)

    def memory_comparison(self) -> dict[int, MemoryComparison]:
        """Per rank: the plan's prediction against the measured step peak (empty without ``--plan`` or without a
        measured step)."""
        if self.prediction is None:
            return {}
        out = {}
        for rank, measured in sorted(self.step_memory.items()):
            cmp = compare(self.prediction, measured)
            if cmp is not None:
                out[rank] = cmp
        return out

    # ----------------------------------------------------------------- display

    def __repr__(self) -> str:
        kind = self.strategy.describe() if self.strategy is not None else "no strategy"
        name = f"{self.name}: " if self.name else ""
        decided = "; ".join(d.headline for d in self.decisions) or "no decisions"
        compiled = f"compile: {self.compile_story}; " if self.compiles else ""
        return (
            f"<RunReport {name}{kind} on {self.world_size} ranks ({self.backend}): {decided}; {compiled}"
            f"{len(self.bundles)} traced objects, "
            f"{sum(len(m) for m in self.mismatches.values())} collective mismatches>"
        )

    def _repr_html_(self) -> str:
        return self.to_html(standalone=False)

    def to_html(self, *, standalone: bool = True) -> str:
        """The report as self-contained HTML (no scripts, no network): a page when ``standalone``."""
        from thunderviz.render.run_report import run_report_html  # the rank engine itself never needs render

        return run_report_html(self, standalone=standalone)


def compile_summary(compiles: dict[int, list[str]]) -> str:
    """``reused an earlier set-up's trace (interpreting it took 9.1 s) (rank 0; every rank alike)`` once when every
    rank did the same, else per rank."""
    if not compiles:
        return ""
    import re

    stories = {rank: "; ".join(events) for rank, events in sorted(compiles.items())}
    first, story = next(iter(stories.items()))
    if len(stories) == 1:
        return story
    # ranks that did the same, in seconds that differ a little: one line with the first rank's numbers (where their
    # seconds went is sampled, and a part under 0.05 s on one rank may be missing on another: it does not count)
    done = {
        re.sub(r"\d+(\.\d+)?", "N", "; ".join(e for e in ev if not e.startswith(SPLIT))) for ev in compiles.values()
    }
    if len(done) == 1:
        return f"{story} (rank {first}; every rank alike)"
    return "; ".join(f"rank {rank}: {story}" for rank, story in stories.items())


def _merge_timeline(report: RunReport, collected: dict[int, ReportData], failed: dict[int, str]) -> None:
    from thunderviz.rank.timeline import merge_rank_timelines

    kind = report.strategy.kind if report.strategy is not None else ""
    report.timeline_requested = True
    report.timeline_data, problems = merge_rank_timelines(
        collected, world_size=report.world_size, name=kind, failed=failed
    )
    report.problems.extend(problems)


def _mismatches(ledgers: dict[str, dict[int, Any]]) -> dict[str, list[Any]]:
    return {name: list(find_mismatches(per_rank)) for name, per_rank in ledgers.items()}
