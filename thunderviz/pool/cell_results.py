"""What a cell's ranks hand back to the kernel, read after the cell: each rank's report data (or why it is missing),
a failed ``--timeline`` cell's report from the ranks that returned, and for a rank that died, the end of its process
log as its traceback.

``RankEngine.run`` (``pool.engine``) drives the cell; these read what it left behind. The report data travels on the
cell's own data channel (``protocol.REPORT_DATA_KEY``), sent by each rank's post-cell hook before the reply.
"""

from __future__ import annotations

from typing import Any

from thunderviz.cell.driver import Outcome
from thunderviz.cell.failures import FailureKind
from thunderviz.cell.protocol import REPORT_DATA_KEY, ReportData, StrategySpec, missing_report
from thunderviz.pool.cluster import LocalCluster, RankCluster, memory_note

__all__ = ["REPORT_DATA_WAIT_S", "explain_deaths", "partial_report", "published_report", "report_data"]

#: How long a finished cell's report data may lag behind its reply.
REPORT_DATA_WAIT_S = 10.0


def published_report(request: Any) -> ReportData | None:
    """The ``ReportData`` a rank's post-cell hook published on the cell's data channel, if it arrived."""
    return (request.metadata.get("data") or {}).get(REPORT_DATA_KEY)


def report_data(rank: int, request: Any) -> ReportData:
    """``rank``'s report data for the cell it ran (``request``), waiting up to ``REPORT_DATA_WAIT_S`` for it; a
    ``missing_report`` that says so when it does not come."""
    if request.wait_for_output(timeout=REPORT_DATA_WAIT_S):
        data = published_report(request)
        if data is not None:
            return data
    return missing_report(rank, f"sent no report data (its output did not complete within {REPORT_DATA_WAIT_S:.0f} s)")


def partial_report(
    cell: dict[int, Any],
    outcome: Outcome,
    captured: dict[int, list[str]],
    spec: StrategySpec | None,
    elapsed: float,
    *,
    world_size: int,
    backend: str,
) -> Any:
    """A failed ``--timeline`` cell's report from the ranks that returned (a rank that raised still sends what
    it recorded before the error), the ranks that died or were killed named in its problems; None when no
    rank returned anything."""
    from thunderviz.reports.run_report import RunReport

    collected: dict[int, ReportData] = {}
    lost: dict[int, str] = {}
    for rank, request in cell.items():
        failure = outcome.failures.get(rank)
        if failure is not None and failure.kind is FailureKind.DIED:
            lost[rank] = "died"
            continue
        if failure is not None and failure.kind is FailureKind.KILLED:
            lost[rank] = "was killed after a peer failed"
            continue
        data = published_report(request)
        if data is not None:
            collected[rank] = data
    if not collected:
        return None  # the error already names every rank; a report of nothing would only repeat it
    return RunReport.from_ranks(
        collected,
        outputs={r: "\n".join(lines) for r, lines in captured.items()},
        world_size=world_size,
        backend=backend,
        strategy=spec,
        seconds=elapsed,
        timeline=True,
        failed_ranks=lost,
    )


def explain_deaths(cluster: RankCluster, rank_pids: dict[int, int], outcome: Outcome) -> None:
    """A rank that died gets the end of its process log as its traceback (read now: a restart replaces it).

    Why: "the process exited" alone leaves a user (and CI) guessing between a segfault, an abort, ipyparallel
    shutting the engine down, and the out-of-memory killer; the log tells the first three apart, and a log
    with nothing after start-up points at a SIGKILL."""
    if not isinstance(cluster, LocalCluster):
        return
    for rank, failure in outcome.failures.items():
        pid = rank_pids.get(rank)
        if failure.kind is not FailureKind.DIED or failure.traceback or pid is None:
            continue
        words = cluster.last_words(pid)
        fatal = next((line for line in words.splitlines() if line.startswith("Fatal Python error")), None)
        if fatal:
            failure.summary += f" ({fatal}; its stacks are below)"
        else:
            failure.summary += (
                " with no fatal error in its log (a SIGKILL, such as the out-of-memory killer's, leaves none; "
                f"{memory_note()})" + ("; the end of its log is below" if words.strip() else "")
            )
        failure.traceback = words
