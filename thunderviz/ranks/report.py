"""``RunReport``: what one cell did on every rank, as a picklable object with a static HTML view.

Why static HTML: the report must read the same in JupyterLab, in nbconvert output and on GitHub, none of which
run our JavaScript. The trace model (``thunderviz.core``) and renderer (``thunderviz.render.html``) are built
elsewhere; this module only gathers per-rank data into one place and asks them to draw it. When they are not
importable the report says so in its HTML instead of pretending.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunReport"]


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


@dataclass
class RunReport:
    """One cell's results. ``bundles`` are rank 0's trace bundles by object name; ``ledgers[name][rank]`` every
    rank's collectives ledger; ``mismatches[name]`` the cross-rank disagreements found in them."""

    world_size: int
    backend: str
    strategy: dict[str, Any] | None
    seconds: float
    decisions: list[dict[str, Any]] = field(default_factory=list)
    bundles: dict[str, Any] = field(default_factory=dict)
    bundles_by_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    ledgers: dict[str, dict[int, Any]] = field(default_factory=dict)
    mismatches: dict[str, list[Any]] = field(default_factory=dict)
    memory: dict[int, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[int, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def from_ranks(
        cls,
        collected: dict[int, dict[str, Any]],
        *,
        outputs: dict[int, str],
        world_size: int,
        backend: str,
        strategy: dict[str, Any] | None,
        seconds: float,
    ) -> RunReport:
        """Merge what ``bootstrap.collect`` returned on each rank."""
        report = cls(world_size=world_size, backend=backend, strategy=strategy, seconds=seconds, outputs=outputs)
        if not collected:
            return report
        rank0 = collected.get(0, {})
        report.decisions = list(rank0.get("decisions", []))
        report.bundles = dict(rank0.get("bundles", {}))
        for rank in sorted(collected):
            data = collected[rank]
            report.memory[rank] = dict(data.get("memory", {}))
            if data.get("bundles"):
                report.bundles_by_rank[rank] = dict(data["bundles"])
            for name, ledger in data.get("ledgers", {}).items():
                report.ledgers.setdefault(name, {})[rank] = ledger
            report.problems.extend(f"rank {rank}: {p}" for p in data.get("problems", []))
        report.problems = sorted(set(report.problems), key=report.problems.index)
        report.mismatches = _mismatches(report.ledgers, report.problems)
        return report

    # ----------------------------------------------------------------- display

    def __repr__(self) -> str:
        kind = (self.strategy or {}).get("kind", "no strategy")
        return (f"<RunReport {kind} on {self.world_size} ranks ({self.backend}), {len(self.decisions)} decisions, "
                f"{len(self.bundles)} traced objects, "
                f"{sum(len(m) for m in self.mismatches.values())} collective mismatches>")

    def _repr_html_(self) -> str:
        return self.to_html(standalone=False)

    def to_html(self, *, standalone: bool = True) -> str:
        """The report as self-contained HTML (no scripts, no network): a page when ``standalone``."""
        parts = [f"<div class='thunderviz-report'><h3>{html.escape(self._title())}</h3>"]
        traces = _traces_html(self.bundles_by_rank, self.ledgers, self.decisions)
        if traces is None or not self.bundles_by_rank:
            parts.append(_decisions_html(self.decisions))  # otherwise the trace report carries the decisions
        parts.append(_memory_html(self.memory))
        parts.append(traces or "")
        if self.problems:
            items = "".join(f"<li><pre>{html.escape(p)}</pre></li>" for p in self.problems)
            parts.append(f"<h4>Not shown</h4><ul>{items}</ul>")
        parts.append("</div>")
        body = "\n".join(parts)
        if not standalone:
            return body
        return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>thunderviz report</title></head>"
                f"<body>{body}</body></html>")

    def _title(self) -> str:
        spec = self.strategy or {}
        options = ", ".join(f"{k}={v}" for k, v in sorted((spec.get("options") or {}).items()))
        kind = spec.get("kind", "no strategy")
        return f"{kind}({options}) on {self.world_size} ranks, {self.backend}: {self.seconds:.2f} s"


def _mismatches(ledgers: dict[str, dict[int, Any]], problems: list[str]) -> dict[str, list[Any]]:
    if not ledgers:
        return {}
    try:
        from thunderviz.core.collectives import find_mismatches
    except ImportError as exc:
        problems.append(f"cross-rank mismatch check unavailable ({exc})")
        return {}
    return {name: list(find_mismatches(per_rank)) for name, per_rank in ledgers.items()}


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _decisions_html(decisions: list[dict[str, Any]]) -> str:
    if not decisions:
        return "<h4>Decisions</h4><p>No decisions were recorded (no object went through a thunderviz strategy).</p>"
    rows = [[d.get("target", ""), d.get("case", ""), d.get("action", ""), d.get("reason", "")] for d in decisions]
    return "<h4>Decisions</h4>" + _table(["target", "case", "action", "reason"], rows)


def _memory_html(memory: dict[int, dict[str, Any]]) -> str:
    if not memory:
        return ""
    rows = [[str(rank), _mib(m.get("rss_bytes")), _mib(m.get("cuda_max_allocated_bytes"))]
            for rank, m in sorted(memory.items())]
    return "<h4>Memory per rank</h4>" + _table(["rank", "process RSS", "CUDA peak allocated"], rows)


def _traces_html(bundles_by_rank: dict[int, dict[str, Any]], ledgers: dict[str, dict[int, Any]],
                 decisions: list[dict[str, Any]]) -> str | None:
    """The trace section from ``thunderviz.render.html`` (graphs, per-rank ledgers, mismatches flagged)."""
    if not bundles_by_rank:
        if ledgers:
            return None
        return "<h4>Traces</h4><p>No thunder-compiled object ran in this cell.</p>"
    try:
        from thunderviz.render.html import Report
    except ImportError as exc:
        return (f"<h4>Traces</h4><p>Traces were captured, but the renderer is not available in this build "
                f"({html.escape(str(exc))}).</p>")
    bundles = [b for rank in sorted(bundles_by_rank) for b in bundles_by_rank[rank].values()]
    # Report's notebook form is static (inline style, SVG or DOT text, no script): it survives nbconvert/GitHub.
    return Report(bundles, decisions=decisions or None, title="traces")._repr_html_()
