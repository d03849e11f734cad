"""The failure model: what can go wrong on a rank, how a remote error is classified, and the one message a failed
cell shows.

    ThundervizError
    ├── RankUsageError (also ValueError)   bad arguments to the engine or the magics: nothing was started
    └── RankError                           thunderviz.errors
        ├── RankConnectionError             (raised inside a rank) it could not join the process group
        └── CellError                       a cell failed on one or more ranks; ``failures`` tells every rank's story
            └── RanksInterrupted            the user interrupted the cell (Ctrl-C)

A ``RankFailure`` is one rank's story; its ``kind`` is a ``FailureKind``. The driver (``driver.py``) decides
the kind from what the rank returned or how it stopped; ``cell_error`` turns a cell's failures into one message that
names every rank, the collective a stuck rank waited in, and whether the pool will be restarted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from thunderviz.cell.tracebacks import compact, same_text
from thunderviz.errors import RankError, ThundervizError
from thunderviz.parallel.option_values import TextEnum

__all__ = [
    "CellError",
    "FailureKind",
    "RankConnectionError",
    "RankFailure",
    "RankUsageError",
    "RanksInterrupted",
    "cell_error",
    "classify_remote_error",
    "find_collective",
    "is_collective_timeout",
    "remote_traceback",
]


class FailureKind(TextEnum):
    """How one rank failed (prints as its word: ``str(FailureKind.DIED) == "died"``)."""

    #: the cell raised on that rank
    RAISED = "raised"
    #: the rank process exited
    DIED = "died"
    #: a collective timed out (the process group's ``--timeout``)
    TIMEOUT = "timeout"
    #: we had to kill it (it did not stop after a peer failed, or passed a deadline)
    KILLED = "killed"
    #: the user's Ctrl-C stopped it (or it was killed after not stopping in time)
    INTERRUPTED = "interrupted"
    #: during set-up it could not connect to the rendezvous or to its peers
    UNREACHABLE = "unreachable"


_COLLECTIVES = (
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "monitored_barrier",
    "barrier",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "wait",
)
# Frame headers in a traceback ("..., in all_reduce(tensor, op" / "in torch_all_reduce_prim_impl(") say which
# collective a rank was in; the gloo message itself only says "recv".
_COLLECTIVE_RE = re.compile(r"\bin (?:torch_)?(" + "|".join(_COLLECTIVES) + r")(?:_prim_impl)?\(")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


class RankUsageError(ThundervizError, ValueError):
    """Bad arguments to the engine (or the magics): nothing was started."""


@dataclass
class RankFailure:
    """What went wrong on one rank (``kind``), in one line (``summary``), with its traceback and the collective it
    waited in, when known."""

    rank: int
    kind: FailureKind
    summary: str
    traceback: str = ""
    collective: str | None = None

    def __post_init__(self) -> None:
        self.kind = FailureKind(self.kind)  # a word from a serialised failure becomes its kind; a wrong one raises

    @property
    def was_stopped_by_us(self) -> bool:
        """Killed or interrupted: the rank failed because we stopped it, not on its own."""
        return self.kind in (FailureKind.KILLED, FailureKind.INTERRUPTED)


def _cause_first(f: RankFailure) -> tuple[bool, int]:
    """Sort key: ranks that failed on their own before ranks we stopped, each in rank order."""
    return (f.was_stopped_by_us, f.rank)


def _no_frames(traceback: str) -> bool:
    """Whether a rank's traceback is only ipyparallel's "No traceback available" placeholder."""
    return "No traceback available" in traceback and "line " not in traceback


class RankConnectionError(RankError):
    """Raised inside a rank whose set-up could not connect; the message names the address, the interface and the
    fix (it reaches the kernel as the rank's error text)."""


class CellError(RankError):
    """A cell failed on one or more ranks; ``failures`` has every rank's story, ``rank`` the first to fail.

    ``partial_report``: for a ``--timeline`` cell, a ``RunReport`` of what the ranks that returned sent (their
    recordings up to the failure); ``None`` otherwise.
    """

    partial_report: Any = None

    def __init__(self, message: str, failures: dict[int, RankFailure], *, restarted: bool) -> None:
        first = min(failures.values(), key=_cause_first)
        super().__init__(message, rank=first.rank, remote_traceback=first.traceback)
        self.failures = failures
        self.pool_restart_pending = restarted

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of the kernel-side stack, which says nothing about the ranks: each distinct
        traceback once, for every rank that raised it, the user's frames first and library frames folded
        (``tracebacks.compact``); ``full_traceback()`` (``%thunder_ranks traceback``) has every rank's in full."""
        lines = [f"{type(self).__name__}: {self}"]
        failures = [f for f in sorted(self.failures.values(), key=_cause_first) if f.traceback]
        on_their_own = [f for f in failures if not f.was_stopped_by_us]
        shown = on_their_own or failures  # a rank we stopped because another failed has nothing to add
        groups: dict[str, list[RankFailure]] = {}
        for f in sorted(shown, key=lambda f: _no_frames(f.traceback)):  # placeholders last: they look for a twin
            if _no_frames(f.traceback):
                # ipyparallel's placeholder for a traceback that did not arrive (seen under load): the rank joins a
                # rank that raised the same error instead of showing an empty traceback of its own
                twin = next((k for k, g in groups.items() if g[0].summary == f.summary), None)
                if twin is not None:
                    groups[twin].append(f)
                    continue
            groups.setdefault(same_text(f.traceback), []).append(f)
        for same in groups.values():
            who = _ranks(sorted(f.rank for f in same)) + (" (the same traceback)" if len(same) > 1 else "")
            died = same[0].kind is FailureKind.DIED  # its log's end, already cut to what matters: shown whole
            lines.append(f"--- {who}: {'the end of its process log' if died else 'traceback'} ---")
            text = same[0].traceback.rstrip().splitlines() if died else compact(same[0].traceback)
            lines.extend(f"  {line}" for line in text)
        stopped = [f for f in sorted(self.failures.values(), key=_cause_first) if f.was_stopped_by_us]
        left_out = [f for f in stopped if on_their_own]  # we stopped them because another rank failed
        if left_out:
            where = "; where it was is in the full output" if any(f.traceback for f in left_out) else ""
            lines.append(f"({_ranks([f.rank for f in left_out])}: stopped by us after that failure{where})")
        if failures:
            lines.append("Every rank's full traceback: %thunder_ranks traceback (or CellError.full_traceback()).")
        return lines

    def full_traceback(self) -> str:
        """Every rank's traceback in full, each line tagged with its rank (what the cell printed before tracebacks
        were shortened)."""
        lines: list[str] = []
        for rank in sorted(self.failures):
            failure = self.failures[rank]
            if failure.traceback:
                what = "the end of its process log" if failure.kind is FailureKind.DIED else "traceback"
                if failure.was_stopped_by_us:
                    # its traceback shows where our stop found it (often still formatting its own error), not a cause
                    what += f" (stopped by us: {failure.kind})"
                lines.append(f"--- rank {rank} {what} ---")
                lines.extend(f"[rank {rank}] {line}" for line in failure.traceback.rstrip().splitlines())
        return "\n".join(lines)


class RanksInterrupted(CellError):
    """The user interrupted the cell; ranks that did not stop in time were killed."""


def remote_traceback(exc: BaseException) -> str:
    """The rank-side traceback of an ipyparallel ``RemoteError`` as plain text (no ANSI colours)."""
    lines = getattr(exc, "traceback", None)
    if isinstance(lines, str) and lines:
        return _ANSI_RE.sub("", lines)
    if isinstance(lines, list) and lines:
        return _ANSI_RE.sub("", "\n".join(lines))
    render = getattr(exc, "render_traceback", None)
    if callable(render):
        try:
            return _ANSI_RE.sub("", "\n".join(render()))
        except Exception:
            pass
    return f"{type(exc).__name__}: {exc}"


def find_collective(text: str) -> str | None:
    """The collective a traceback was in (the innermost meaningful one), or None."""
    matches = _COLLECTIVE_RE.findall(text)
    meaningful = [m for m in matches if m not in ("wait", "send", "recv")]
    return (meaningful or matches or [None])[-1]


def is_collective_timeout(text: str) -> bool:
    """Whether an error text is a process-group timeout (gloo, NCCL or the c10d store)."""
    lowered = text.lower()
    timed_out = "timed out" in lowered or "timeout" in lowered
    return timed_out and ("gloo" in lowered or "nccl" in lowered or "c10d" in lowered)


def classify_remote_error(rank: int, exc: Any, *, interrupt_sent: bool) -> RankFailure:
    """One rank's failure from the ipyparallel ``RemoteError`` its request returned.

    Args:
        rank: the rank that returned ``exc``.
        exc: a ``RemoteError`` (``ename``, ``evalue``, ``traceback``).
        interrupt_sent: whether we sent SIGINT to the ranks (so a ``KeyboardInterrupt`` is ours, not the cell's).
    """
    tb = remote_traceback(exc)
    if exc.ename == "EngineError":  # the controller reports a vanished engine as a remote EngineError
        return RankFailure(rank, FailureKind.DIED, f"the rank process exited ({exc.evalue})")
    if exc.ename == RankConnectionError.__name__:
        return RankFailure(rank, FailureKind.UNREACHABLE, str(exc.evalue), tb)
    if exc.ename == "KeyboardInterrupt" and interrupt_sent:
        return RankFailure(rank, FailureKind.INTERRUPTED, "stopped by KeyboardInterrupt", tb)
    if is_collective_timeout(f"{exc.evalue}\n{tb}"):
        return RankFailure(rank, FailureKind.TIMEOUT, f"{exc.ename}: {exc.evalue}", tb, find_collective(tb))
    return RankFailure(rank, FailureKind.RAISED, f"{exc.ename}: {exc.evalue}", tb)


def _describe(failure: RankFailure, timeout_s: float, who: str = "") -> str:
    """One rank's story (``who`` names it: ``rank 1``, or ``ranks 0, 1`` for several with the same story)."""
    who = who or f"rank {failure.rank}"
    if failure.kind is FailureKind.RAISED:
        return f"{who} raised {failure.summary}"
    if failure.kind is FailureKind.DIED:
        return f"{who} died: {failure.summary}"
    if failure.kind is FailureKind.TIMEOUT:
        where = f" in {failure.collective}" if failure.collective else " in a collective"
        return f"{who} is stuck: it waited {timeout_s:.0f} s (--timeout){where} that not every rank entered"
    if failure.kind is FailureKind.INTERRUPTED:
        return f"{who} interrupted ({failure.summary})"
    if failure.kind is FailureKind.UNREACHABLE:
        return f"{who} could not connect: {failure.summary}"
    return f"{who} {failure.summary}"  # killed: the summary says why


def _stories(failures: list[RankFailure], timeout_s: float) -> list[str]:
    """Each distinct story once, naming every rank that told it (``ranks 0, 1 raised ValueError: ...``)."""
    groups: dict[tuple[FailureKind, str, str | None], list[RankFailure]] = {}
    for f in failures:
        groups.setdefault((f.kind, f.summary, f.collective), []).append(f)
    return [_describe(same[0], timeout_s, _ranks([f.rank for f in same])) for same in groups.values()]


def _ranks(ranks: list[int]) -> str:
    """``rank 1`` or ``ranks 0, 1``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def cell_error(
    failures: dict[int, RankFailure],
    *,
    ranks: list[int],
    timeout_s: float,
    restart_pending: bool,
    what: str = "The cell",
) -> CellError:
    """The error a failed request raises: every rank's story in one message, ``RanksInterrupted`` when the user
    stopped it.

    Args:
        failures: by rank, from the driver.
        ranks: every rank of the pool (the ones not in ``failures`` finished).
        timeout_s: the process group's timeout, quoted for a stuck rank.
        restart_pending: whether the pool will be restarted before the next cell (the message says so).
        what: what failed, e.g. "The cell" or "Setting up the ranks".
    """
    # The rank that failed on its own leads (a ValueError on rank 1), then those we stopped because of it (rank 0,
    # killed while it waited for rank 1): read in rank order, the message began with the consequence.
    parts = _stories(sorted(failures.values(), key=_cause_first), timeout_s)
    finished = [r for r in ranks if r not in failures]
    if finished and any(f.kind is FailureKind.TIMEOUT for f in failures.values()):
        parts.append(f"rank(s) {', '.join(map(str, finished))} finished the cell without entering it")
    message = f"{what} failed on {len(failures)} of {len(ranks)} ranks: " + "; ".join(parts) + "."
    if restart_pending:
        message += " The ranks will be restarted before the next cell (their state is lost)."
    if all(f.kind is FailureKind.INTERRUPTED for f in failures.values()):
        return RanksInterrupted(message, failures, restarted=restart_pending)
    return CellError(message, failures, restarted=restart_pending)
