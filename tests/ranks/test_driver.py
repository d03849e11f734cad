"""The driver's escalation ladder, step by step, on fake rank controls and a fake clock.

Why fakes here: the ladder is a set of deadlines (a failed rank's peers get ``PEER_GRACE_S``, then SIGINT gets
``SIGINT_GRACE_S``; a Ctrl-C gives ``INTERRUPT_GRACE_S``; a straggler gets the group's timeout plus
``STRAGGLER_SLACK_S``), and on real processes under load the only way to check one is a wall-clock bound. Here time
is a number the test moves: ``FakeRanks`` implements the driver's ``RankControls`` (phases, liveness, signals,
output) and hands out requests that answer ``ready``/``get``/``wait``/``metadata`` as an ipyparallel
``AsyncResult`` does, following a script per rank; ``wait(POLL_S)`` moves the clock. Every assertion is about what
the driver did and when, in fake seconds. The same ladder on real ranks and a real gloo group is in
``test_faults.py``; the replies here are real ipyparallel ``RemoteError`` objects, classified by the real
``classify_remote_error``.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

import pytest
from ipyparallel.error import RemoteError

from thunderviz.cell.driver import (
    INTERRUPT_GRACE_S,
    PEER_GRACE_S,
    POLL_S,
    SIGINT_GRACE_S,
    STRAGGLER_SLACK_S,
    Outcome,
    drive,
)
from thunderviz.cell.failures import FailureKind
from thunderviz.cell.protocol import PHASE_DATA_KEY
from thunderviz.cell.status import Phase

#: one driver pass moves the fake clock by POLL_S: an event is seen on the first pass after it, and the step of the
#: ladder it starts is taken on the first pass past that step's deadline, so at most two passes late
LATE = 2 * POLL_S + 1e-9
#: how long a rank that honours SIGINT takes to raise KeyboardInterrupt and reply
SIGINT_LATENCY_S = 0.05


@dataclass
class Script:
    """What one fake rank does, in fake seconds: reply ok, raise, or exit at a time (``None``: never), and whether
    a SIGINT stops it (a rank in Python: yes; a rank stuck in a gloo collective: no)."""

    finishes_at: float | None = None
    raises_at: float | None = None
    dies_at: float | None = None
    stops_on_sigint: bool = True
    collecting_at: float | None = None
    #: (when, phase) the rank publishes during the cell, e.g. compiling then running again
    published: tuple[tuple[float, Phase], ...] = ()
    value: Any = "ok"


@dataclass
class FakeRanks:
    """The driver's ``RankControls`` over scripted ranks, with the clock they all share."""

    scripts: dict[int, Script]
    timeout: float = 5.0
    ctrl_c_at: list[float] = field(default_factory=list)
    now: float = 0.0
    signals: list[tuple[float, tuple[int, ...], int]] = field(default_factory=list)
    phases: list[tuple[float, int, Phase]] = field(default_factory=list)
    emitted: list[tuple[int, str, str]] = field(default_factory=list)
    sigint_at: dict[int, float] = field(default_factory=dict)
    killed: set[int] = field(default_factory=set)

    # -- RankControls

    def set_phase(self, ranks: list[int], phase: Phase) -> None:
        assert isinstance(phase, Phase)
        self.phases.extend((self.now, rank, phase) for rank in ranks)

    def rank_dead(self, rank: int) -> bool:
        dies_at = self.scripts[rank].dies_at
        return rank in self.killed or (dies_at is not None and self.now >= dies_at)

    def signal(self, ranks: list[int], sig: int) -> None:
        self.signals.append((self.now, tuple(ranks), sig))
        for rank in ranks:
            if sig == signal.SIGKILL:
                self.killed.add(rank)
            elif sig == signal.SIGINT:
                self.sigint_at.setdefault(rank, self.now)

    def emit(self, rank: int, stream: str, line: str) -> None:
        self.emitted.append((rank, stream, line))

    # -- the clock and the requests

    def clock(self) -> float:
        return self.now

    def requests(self) -> dict[int, FakeRequest]:
        return {rank: FakeRequest(self, rank) for rank in self.scripts}

    def reply(self, rank: int) -> tuple[str, Any] | None:
        """The rank's reply by now: ``("ok", value)`` or ``("error", RemoteError)``; ``None`` while it runs."""
        if rank in self.killed or self.rank_dead(rank):
            return None
        script = self.scripts[rank]
        events: list[tuple[float, tuple[str, Any]]] = []
        if script.finishes_at is not None:
            events.append((script.finishes_at, ("ok", script.value)))
        if script.raises_at is not None:
            events.append((script.raises_at, ("error", RemoteError("ValueError", f"bad batch on rank {rank}", "tb"))))
        if script.stops_on_sigint and rank in self.sigint_at:
            interrupt = RemoteError("KeyboardInterrupt", "", "Traceback...\nKeyboardInterrupt")
            events.append((self.sigint_at[rank] + SIGINT_LATENCY_S, ("error", interrupt)))
        due = [event for event in events if event[0] <= self.now]
        return min(due, key=lambda event: event[0])[1] if due else None

    def advance(self, seconds: float) -> None:
        """Time passes; a Ctrl-C due meanwhile interrupts the wait, as SIGINT interrupts the kernel's main thread."""
        until = self.now + seconds
        due = [t for t in self.ctrl_c_at if t <= until]
        if due:
            self.ctrl_c_at.remove(due[0])
            self.now = max(self.now, due[0])
            raise KeyboardInterrupt
        self.now = until

    def times(self, sig: int) -> list[float]:
        return [t for t, _, s in self.signals if s == sig]

    def phase_of(self, rank: int) -> Phase:
        return [phase for _, r, phase in self.phases if r == rank][-1]


class FakeRequest:
    """One rank's pending request, as the driver uses an ipyparallel ``AsyncResult``."""

    def __init__(self, ranks: FakeRanks, rank: int) -> None:
        self.ranks = ranks
        self.rank = rank
        self._metadata: dict[str, Any] = {"stdout": "", "stderr": "", "data": {}}

    @property
    def metadata(self) -> dict[str, Any]:
        script = self.ranks.scripts[self.rank]
        published = [*script.published, *([(script.collecting_at, Phase.COLLECTING)] if script.collecting_at else [])]
        due = [(t, phase) for t, phase in published if self.ranks.now >= t]
        if due:  # ipyparallel keeps the latest value a key was published with
            self._metadata["data"] = {PHASE_DATA_KEY: max(due, key=lambda e: e[0])[1]}
        return self._metadata

    def ready(self) -> bool:
        return self.ranks.reply(self.rank) is not None

    def get(self, timeout: float = 0) -> Any:
        reply = self.ranks.reply(self.rank)
        assert reply is not None, "the driver asked for a reply that is not ready"
        status, value = reply
        if status == "error":
            raise value
        return value

    def wait(self, timeout: float) -> None:
        if not self.ready():
            self.ranks.advance(timeout)

    def wait_for_output(self, timeout: float = 0) -> bool:
        return True


def _drive(ranks: FakeRanks, **kwargs: Any) -> Outcome:
    return drive(ranks.requests(), ranks, clock=ranks.clock, **kwargs)


def _on_time(actual: float, expected: float) -> bool:
    """The driver acts on a pass at or past a deadline: never before it, and at most two passes after."""
    return expected - 1e-9 <= actual <= expected + LATE


# -- a rank fails: its peers


def test_a_peer_that_stops_on_sigint_gets_it_after_the_peer_grace_and_is_not_killed() -> None:
    ranks = FakeRanks({0: Script(raises_at=1.0), 1: Script(stops_on_sigint=True)})
    outcome = _drive(ranks)
    assert [(ranks_, sig) for _, ranks_, sig in ranks.signals] == [((1,), signal.SIGINT)]
    assert _on_time(ranks.times(signal.SIGINT)[0], 1.0 + PEER_GRACE_S)
    assert outcome.failures[0].kind is FailureKind.RAISED and "bad batch on rank 0" in outcome.failures[0].summary
    assert outcome.failures[1].kind is FailureKind.INTERRUPTED  # its KeyboardInterrupt is ours: we sent SIGINT
    assert outcome.restart_reason is None and not outcome.interrupted
    assert (ranks.phase_of(0), ranks.phase_of(1)) == (Phase.FAILED, Phase.INTERRUPTED)


def test_a_peer_stuck_in_a_collective_is_killed_after_the_sigint_grace() -> None:
    ranks = FakeRanks({0: Script(raises_at=1.0), 1: Script(stops_on_sigint=False)})
    outcome = _drive(ranks)
    assert [(ranks_, sig) for _, ranks_, sig in ranks.signals] == [((1,), signal.SIGINT), ((1,), signal.SIGKILL)]
    sigint, sigkill = ranks.times(signal.SIGINT)[0], ranks.times(signal.SIGKILL)[0]
    assert _on_time(sigint, 1.0 + PEER_GRACE_S)
    assert _on_time(sigkill, sigint + SIGINT_GRACE_S)
    failure = outcome.failures[1]
    assert failure.kind is FailureKind.KILLED and "did not stop on SIGINT" in failure.summary
    assert outcome.restart_reason == "rank(s) 1 had to be killed"
    assert ranks.phase_of(1) is Phase.FAILED


def test_a_death_stays_the_restart_reason_when_its_peer_must_be_killed_too() -> None:
    ranks = FakeRanks({0: Script(dies_at=1.0), 1: Script(stops_on_sigint=False)})
    outcome = _drive(ranks)
    assert {r: f.kind for r, f in outcome.failures.items()} == {0: FailureKind.DIED, 1: FailureKind.KILLED}
    assert outcome.restart_reason == "rank 0 died; rank(s) 1 had to be killed"


def test_a_peer_that_finishes_within_the_grace_is_left_alone() -> None:
    ranks = FakeRanks({0: Script(raises_at=1.0), 1: Script(finishes_at=1.0 + PEER_GRACE_S / 2, value=41)})
    outcome = _drive(ranks, done_phase=Phase.DONE)
    assert ranks.signals == []
    assert outcome.values == {1: 41} and sorted(outcome.failures) == [0] and outcome.restart_reason is None
    assert (ranks.phase_of(0), ranks.phase_of(1)) == (Phase.FAILED, Phase.DONE)


def test_peers_are_killed_together_and_the_restart_names_them() -> None:
    ranks = FakeRanks({0: Script(raises_at=1.0), 1: Script(stops_on_sigint=False), 2: Script(stops_on_sigint=False)})
    outcome = _drive(ranks)
    assert [(ranks_, sig) for _, ranks_, sig in ranks.signals] == [
        ((1, 2), signal.SIGINT),
        ((1, 2), signal.SIGKILL),
    ]
    assert {r: f.kind for r, f in outcome.failures.items()} == {
        0: FailureKind.RAISED,
        1: FailureKind.KILLED,
        2: FailureKind.KILLED,
    }
    assert outcome.restart_reason == "rank(s) 1, 2 had to be killed"


def test_set_up_does_not_stop_peers_that_are_still_connecting() -> None:
    ranks = FakeRanks({0: Script(raises_at=1.0), 1: Script(finishes_at=8.0, stops_on_sigint=False)})
    outcome = _drive(ranks, stop_peers=False, done_phase=Phase.WAITING)
    assert ranks.signals == []
    assert outcome.values == {1: "ok"} and outcome.failures[0].kind is FailureKind.RAISED
    assert ranks.now >= 8.0 and ranks.phase_of(1) is Phase.WAITING


def test_a_rank_whose_process_exits_is_a_death_and_its_peer_is_stopped() -> None:
    ranks = FakeRanks({0: Script(stops_on_sigint=True), 1: Script(dies_at=0.5)})
    outcome = _drive(ranks)
    died = outcome.failures[1]
    assert died.kind is FailureKind.DIED and died.summary == "the rank process exited while running the cell"
    assert outcome.restart_reason == "rank 1 died"
    assert [(ranks_, sig) for _, ranks_, sig in ranks.signals] == [((0,), signal.SIGINT)]
    assert _on_time(ranks.times(signal.SIGINT)[0], 0.5 + PEER_GRACE_S)
    assert outcome.failures[0].kind is FailureKind.INTERRUPTED


# -- the user's Ctrl-C


def test_ctrl_c_sends_sigint_at_once_and_kills_who_did_not_stop_after_the_interrupt_grace() -> None:
    ranks = FakeRanks({0: Script(stops_on_sigint=True), 1: Script(stops_on_sigint=False)}, ctrl_c_at=[2.0, 3.0])
    outcome = _drive(ranks)
    assert [(ranks_, sig) for _, ranks_, sig in ranks.signals] == [((0, 1), signal.SIGINT), ((1,), signal.SIGKILL)]
    assert ranks.times(signal.SIGINT) == [2.0]
    # the second Ctrl-C (at 3.0) does not restart the grace: the kill comes INTERRUPT_GRACE_S after the first
    assert _on_time(ranks.times(signal.SIGKILL)[0], 2.0 + INTERRUPT_GRACE_S)
    assert outcome.interrupted
    assert outcome.failures[0].kind is FailureKind.INTERRUPTED
    assert outcome.failures[0].summary == "stopped by KeyboardInterrupt"
    assert outcome.failures[1].kind is FailureKind.INTERRUPTED
    assert outcome.failures[1].summary == f"killed: it did not stop within {INTERRUPT_GRACE_S:.0f} s of the interrupt"
    assert outcome.restart_reason == "rank(s) 1 had to be killed"
    assert ranks.phase_of(0) is Phase.INTERRUPTED and ranks.phase_of(1) is Phase.INTERRUPTED


def test_ctrl_c_after_one_rank_finished_counts_it_interrupted_too() -> None:
    ranks = FakeRanks({0: Script(finishes_at=1.0), 1: Script(stops_on_sigint=True)}, ctrl_c_at=[2.0])
    outcome = _drive(ranks, done_phase=Phase.DONE)
    assert ranks.signals == [(2.0, (1,), signal.SIGINT)]
    assert outcome.interrupted and outcome.restart_reason is None
    assert outcome.values == {0: "ok"}
    assert outcome.failures[0].kind is FailureKind.INTERRUPTED
    assert outcome.failures[0].summary == "finished before the interrupt arrived"
    assert outcome.failures[1].kind is FailureKind.INTERRUPTED


# -- stragglers and deadlines


def test_a_straggler_is_killed_the_group_timeout_and_the_slack_after_a_peer_finished() -> None:
    ranks = FakeRanks({0: Script(finishes_at=1.0), 1: Script(stops_on_sigint=False)}, timeout=5.0)
    outcome = _drive(ranks)
    assert [(ranks_, sig) for _, ranks_, sig in ranks.signals] == [((1,), signal.SIGKILL)]  # no SIGINT first
    assert _on_time(ranks.times(signal.SIGKILL)[0], 1.0 + 5.0 + STRAGGLER_SLACK_S)
    failure = outcome.failures[1]
    assert failure.kind is FailureKind.KILLED
    assert f"was still running {5.0 + STRAGGLER_SLACK_S:.0f} s after another rank finished" in failure.summary
    assert outcome.values == {0: "ok"} and outcome.restart_reason == "rank(s) 1 had to be killed"


def test_a_deadline_kills_every_rank_still_running() -> None:
    ranks = FakeRanks({0: Script(), 1: Script()})
    outcome = _drive(ranks, deadline_s=4.0)
    assert [(ranks_, sig) for _, ranks_, sig in ranks.signals] == [((0, 1), signal.SIGKILL)]
    assert _on_time(ranks.times(signal.SIGKILL)[0], 4.0)
    assert all(
        f.kind is FailureKind.KILLED and "did not finish within 4 s" in f.summary for f in outcome.failures.values()
    )


def test_without_a_deadline_a_long_cell_is_never_escalated() -> None:
    ranks = FakeRanks({0: Script(finishes_at=100.0), 1: Script(finishes_at=100.0 + STRAGGLER_SLACK_S)}, timeout=60)
    outcome = _drive(ranks, done_phase=Phase.DONE)
    assert ranks.signals == [] and outcome.failures == {} and outcome.values == {0: "ok", 1: "ok"}


# -- phases and output


def test_the_collecting_phase_a_rank_publishes_is_shown_before_done() -> None:
    ranks = FakeRanks({0: Script(collecting_at=0.5, finishes_at=1.0), 1: Script(finishes_at=0.2)})
    _drive(ranks, done_phase=Phase.DONE)
    rank0 = [(t, phase) for t, r, phase in ranks.phases if r == 0]
    assert rank0[-1][1] is Phase.DONE and {phase for _, phase in rank0[:-1]} == {Phase.COLLECTING}
    assert rank0[0][0] >= 0.5  # not before the rank said so
    assert [phase for _, r, phase in ranks.phases if r == 1] == [Phase.DONE]


def test_a_compile_the_rank_publishes_is_shown_while_it_lasts() -> None:
    """A first compile showed as a bare "running" for 12 s; the rank now says when it compiles."""
    published = ((0.3, Phase.COMPILING), (1.5, Phase.RUNNING), (1.8, Phase.COLLECTING))
    ranks = FakeRanks({0: Script(published=published, finishes_at=2.0), 1: Script(finishes_at=0.2)})
    _drive(ranks, done_phase=Phase.DONE)
    seen = [(t, phase) for t, r, phase in ranks.phases if r == 0]
    rank0 = [e for i, e in enumerate(seen) if i == 0 or seen[i - 1][1] != e[1]]  # changes (the engine keeps those)
    assert [phase for _, phase in rank0] == [Phase.COMPILING, Phase.RUNNING, Phase.COLLECTING, Phase.DONE]
    assert [_on_time(t, when) for (t, _), (when, _) in zip(rank0, published, strict=False)] == [True] * 3


@pytest.mark.parametrize(("flush", "last"), [(True, [(0, "stdout", "partial\n")]), (False, [])])
def test_output_streams_as_whole_lines_and_a_last_half_line_only_when_asked(flush: bool, last: list) -> None:
    ranks = FakeRanks({0: Script(finishes_at=0.1)})
    requests = ranks.requests()
    requests[0]._metadata["stdout"] = "one\ntwo\npartial"
    captured: dict[int, list[str]] = {}
    drive(requests, ranks, clock=ranks.clock, captured=captured, flush_partial_lines=flush)
    assert ranks.emitted == [(0, "stdout", "one\n"), (0, "stdout", "two\n"), *last]
    assert captured == {0: ["one", "two", *(["partial"] if flush else [])]}
