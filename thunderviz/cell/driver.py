"""The driver: wait for one request on every rank while streaming their output, and resolve stragglers.

One pass of the loop is four named steps, repeated every ``POLL_S`` until no rank is pending:

1. ``_stream``   copy new stdout/stderr lines of every rank to the caller (prefixed by rank there);
2. ``_settle``   take every reply that arrived (ok, or a classified ``RankFailure``), and notice dead processes;
3. ``_escalate`` after a failure or Ctrl-C, move stragglers along the ladder below;
4. ``_wait``     block up to ``POLL_S`` on the first pending rank's reply.

The escalation ladder (why: a rank stuck in a gloo collective cannot be interrupted, and a process group that saw a
failure is not safe to reuse)::

    RUNNING --(a rank failed, +PEER_GRACE_S, unless stop_peers is off) or Ctrl-C--> SIGINT sent
    SIGINT sent --(+SIGINT_GRACE_S, or +INTERRUPT_GRACE_S after Ctrl-C)--> SIGKILL, pool marked for restart
    RUNNING --(a peer finished, +timeout+10 s) or (deadline)--> SIGKILL, pool marked for restart

A Ctrl-C while waiting restarts the ladder at "SIGINT now"; a second Ctrl-C just keeps waiting (the kill comes).

Every time the ladder reads comes from one clock (``drive(clock=...)``, ``time.monotonic`` unless a test passes a
fake one), and everything it does to the ranks goes through ``RankControls``, so the ladder is checked step by step
without processes (``tests/ranks/test_driver.py``) as well as on real ranks (``test_faults.py``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from thunderviz.cell.failures import FailureKind, RankFailure, classify_remote_error
from thunderviz.cell.protocol import PHASE_DATA_KEY
from thunderviz.cell.status import PUBLISHED, Phase

__all__ = [
    "INTERRUPT_GRACE_S",
    "OUTPUT_MODES",
    "PEER_GRACE_S",
    "POLL_S",
    "SIGINT_GRACE_S",
    "STRAGGLER_SLACK_S",
    "Outcome",
    "RankControls",
    "drive",
    "output_filter",
]

#: Whose output streams into the cell: every rank, rank 0 only, or none (all of it is kept in the report).
OUTPUT_MODES = ("all", "rank0", "none")

# After one rank fails: how long its peers get to finish on their own, then how long SIGINT gets before a kill.
PEER_GRACE_S = 0.3
SIGINT_GRACE_S = 1.0
# After a user interrupt (Ctrl-C): how long ranks get to stop before they are killed.
INTERRUPT_GRACE_S = 3.0
# A rank still running this long after a peer finished is past its process-group timeout: something else is wrong.
STRAGGLER_SLACK_S = 10.0
POLL_S = 0.02
# The reply can overtake the last stream messages; this long is given to them after a reply.
OUTPUT_TAIL_S = 1.0


def output_filter(mode: str) -> Callable[[int], bool]:
    """Which ranks' output an ``OUTPUT_MODES`` value streams."""
    return {"all": lambda rank: True, "rank0": lambda rank: rank == 0, "none": lambda rank: False}[mode]


class RankControls(Protocol):
    """What the driver needs from the engine: the group's timeout, phases, liveness, signals and output."""

    timeout: float

    def set_phase(self, ranks: list[int], phase: Phase) -> None: ...

    def rank_dead(self, rank: int) -> bool: ...

    def signal(self, ranks: list[int], sig: int) -> None: ...

    def emit(self, rank: int, stream: str, line: str) -> None: ...


@dataclass
class Outcome:
    """A driven request: failures by rank (empty when all succeeded), return values of the ranks that succeeded,
    and why the pool must be restarted (a rank died or was killed), if it must."""

    failures: dict[int, RankFailure] = field(default_factory=dict)
    values: dict[int, Any] = field(default_factory=dict)
    restart_reason: str | None = None
    interrupted: bool = False


class _OutputPump:
    """Turns the live stdout/stderr text of each request (filled by ipyparallel's IO thread) into whole lines."""

    def __init__(self, captured: dict[int, list[str]], emit: Callable[[int, str, str], None] | None) -> None:
        self.captured = captured
        self.emit = emit
        self._cursors: dict[tuple[int, str], int] = {}
        self._partial: dict[tuple[int, str], str] = {}

    def pump(self, requests: dict[int, Any], *, final: bool = False) -> None:
        for rank, request in requests.items():
            metadata = request.metadata  # a live dict
            for name in ("stdout", "stderr"):
                text = metadata.get(name) or ""
                key = (rank, name)
                start = self._cursors.get(key, 0)
                if len(text) <= start and not (final and self._partial.get(key)):
                    continue
                self._cursors[key] = len(text)
                *lines, rest = (self._partial.get(key, "") + text[start:]).split("\n")
                if final and rest:
                    lines.append(rest)
                    rest = ""
                self._partial[key] = rest
                for line in lines:
                    self.captured.setdefault(rank, []).append(line)
                    if self.emit is not None:
                        self.emit(rank, name, line + "\n")


class _Driver:
    def __init__(
        self,
        requests: dict[int, Any],
        controls: RankControls,
        *,
        deadline_s: float | None,
        pump: _OutputPump,
        done_phase: Phase | None,
        flush_partial_lines: bool,
        stop_peers: bool,
        clock: Callable[[], float],
    ) -> None:
        self.requests = requests
        self.controls = controls
        self.deadline_s = deadline_s
        self.pump = pump
        self.done_phase = done_phase
        self.flush_partial_lines = flush_partial_lines
        self.stop_peers = stop_peers
        self.clock = clock
        self.outcome = Outcome()
        self.settled: set[int] = set()
        self.passes = 0
        self.started = clock()
        self.first_failure_at: float | None = None
        self.first_success_at: float | None = None
        self.sigint_at: float | None = None
        self.interrupted_at: float | None = None

    # ------------------------------------------------------------------ the loop

    def run(self) -> Outcome:
        while self._pending():
            try:
                self._stream()
                self._settle()
                if self._pending():
                    self._escalate()
                if self._pending():
                    self._wait()
            except KeyboardInterrupt:
                self._on_ctrl_c()
        self._finish()
        return self.outcome

    def _pending(self) -> list[int]:
        return [rank for rank in self.requests if rank not in self.settled]

    # ------------------------------------------------------------------ steps

    def _stream(self) -> None:
        self.pump.pump(self.requests)

    def _settle(self) -> None:
        from ipyparallel.error import EngineError, RemoteError

        self.passes += 1
        for rank in self._pending():
            request = self.requests[rank]
            ready = request.ready()
            if ready:  # what the rank published travels on iopub, which can trail the reply (a missed "collecting")
                request.wait_for_output(timeout=OUTPUT_TAIL_S)
            published = (request.metadata.get("data") or {}).get(PHASE_DATA_KEY)
            if published in PUBLISHED:  # compiling, collecting: shown even when the reply is already in
                self.controls.set_phase([rank], Phase(published))
            if ready:
                try:
                    value = request.get(0)
                except RemoteError as exc:
                    self._fail(classify_remote_error(rank, exc, interrupt_sent=self._interrupt_sent()))
                except EngineError as exc:
                    self._fail(RankFailure(rank, FailureKind.DIED, f"the rank process exited ({exc})"))
                else:
                    self._succeed(rank, value)
            elif self.passes > 1 and self.controls.rank_dead(rank):  # not before a reply could have come
                self._fail(RankFailure(rank, FailureKind.DIED, "the rank process exited while running the cell"))

    def _escalate(self) -> None:
        now = self.clock()
        if self.outcome.failures and self.first_failure_at is None and self.stop_peers:
            self.first_failure_at = now
        stop_from = self.interrupted_at
        if stop_from is None and self.first_failure_at is not None:
            stop_from = self.first_failure_at + PEER_GRACE_S
        if stop_from is not None and self.sigint_at is None and now >= stop_from:
            # Peers of a failed rank usually wait for it in a collective: try to stop them politely first.
            self.controls.signal(self._pending(), signal.SIGINT)
            self.sigint_at = now
        reason = self._kill_reason(now)
        if reason is not None:
            self._kill_pending(reason)

    def _wait(self) -> None:
        # returns as soon as that rank's reply is in; the other ranks are checked on the next pass
        self.requests[self._pending()[0]].wait(POLL_S)

    def _on_ctrl_c(self) -> None:
        if self.interrupted_at is None:
            self.interrupted_at = self.clock()
            self.sigint_at = None  # SIGINT every pending rank on the next pass, then the interrupt grace
        # a second Ctrl-C during the grace keeps waiting: the kill comes anyway

    def _finish(self) -> None:
        for rank, request in self.requests.items():
            failure = self.outcome.failures.get(rank)
            if failure is None or failure.kind in (FailureKind.RAISED, FailureKind.TIMEOUT, FailureKind.INTERRUPTED):
                request.wait_for_output(timeout=OUTPUT_TAIL_S)
        # A half line at the end of a cell is the cell's last output; during set-up it is C++ output still on its
        # way (gloo's banner), better dropped than cut in two.
        self.pump.pump(self.requests, final=self.flush_partial_lines)
        if self.interrupted_at is not None:
            self.outcome.interrupted = True
            for rank in self.requests:
                self.outcome.failures.setdefault(
                    rank, RankFailure(rank, FailureKind.INTERRUPTED, "finished before the interrupt arrived")
                )

    # ------------------------------------------------------------------ helpers

    def _interrupt_sent(self) -> bool:
        return self.interrupted_at is not None or self.sigint_at is not None

    def _succeed(self, rank: int, value: Any) -> None:
        self.settled.add(rank)
        self.outcome.values[rank] = value
        if self.done_phase:
            self.controls.set_phase([rank], self.done_phase)
        if self.first_success_at is None:
            self.first_success_at = self.clock()

    def _fail(self, failure: RankFailure) -> None:
        self.settled.add(failure.rank)
        self.outcome.failures[failure.rank] = failure
        if failure.kind is FailureKind.DIED:
            self.outcome.restart_reason = f"rank {failure.rank} died"
        interrupted = failure.kind is FailureKind.INTERRUPTED
        self.controls.set_phase([failure.rank], Phase.INTERRUPTED if interrupted else Phase.FAILED)

    def _kill_reason(self, now: float) -> str | None:
        if self.sigint_at is not None:
            grace = INTERRUPT_GRACE_S if self.interrupted_at is not None else SIGINT_GRACE_S
            if now - self.sigint_at > grace:
                if self.interrupted_at is not None:
                    return f"did not stop within {grace:.0f} s of the interrupt"
                return (
                    "was still running after another rank failed (most likely waiting for it in a collective) "
                    "and did not stop on SIGINT"
                )
            return None
        slack = self.controls.timeout + STRAGGLER_SLACK_S
        if self.first_success_at is not None and now - self.first_success_at > slack:
            return (
                f"was still running {slack:.0f} s after another rank finished the cell; the process-group "
                "timeout should have released it"
            )
        if self.deadline_s is not None and now - self.started > self.deadline_s:
            return f"did not finish within {self.deadline_s:.0f} s"
        return None

    def _kill_pending(self, reason: str) -> None:
        pending = self._pending()
        self.controls.signal(pending, signal.SIGKILL)
        kind = FailureKind.INTERRUPTED if self.interrupted_at is not None else FailureKind.KILLED
        for rank in pending:
            self._fail(RankFailure(rank, kind, f"killed: it {reason}"))
        killed = f"rank(s) {', '.join(map(str, pending))} had to be killed"
        # a death that made the peers stuck stays the reason given first: it is the cause, the kill its consequence
        before = self.outcome.restart_reason
        self.outcome.restart_reason = f"{before}; {killed}" if before else killed


def drive(
    requests: dict[int, Any],
    controls: RankControls,
    *,
    deadline_s: float | None = None,
    captured: dict[int, list[str]] | None = None,
    stream: bool = True,
    done_phase: Phase | None = None,
    flush_partial_lines: bool = False,
    stop_peers: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Wait for every rank's reply to ``requests`` (ipyparallel ``AsyncResult`` by rank) while streaming output.

    Args:
        requests: one pending request per rank.
        controls: the engine (phases, liveness, signals, output).
        deadline_s: kill ranks still running after this long (set-up); ``None``: bounded only by failures.
        captured: receives every rank's output lines (kept for the report even when not streamed).
        stream: pass output lines to ``controls.emit``.
        done_phase: the phase a rank enters when its reply is ok.
        flush_partial_lines: emit a last line without a newline (end of a user cell), else drop it.
        stop_peers: after one rank fails, interrupt (then kill) the others. Off for set-up: peers still connecting
            fail on their own within the group's timeout, and killing them would cost an attached cluster its
            engines over a network problem.
        clock: seconds, monotonic; every time the ladder compares comes from it (a fake one in tests).
    """
    pump = _OutputPump({} if captured is None else captured, controls.emit if stream else None)
    driver = _Driver(
        requests,
        controls,
        deadline_s=deadline_s,
        pump=pump,
        done_phase=done_phase,
        flush_partial_lines=flush_partial_lines,
        stop_peers=stop_peers,
        clock=clock,
    )
    return driver.run()
