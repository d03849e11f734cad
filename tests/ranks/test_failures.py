"""The failure model on its own: classifying a rank's remote error, and the one message a failed cell shows.

The remote errors here are real ipyparallel ``RemoteError`` objects built as the client builds them from a reply;
the end-to-end path (real ranks raising, dying, hanging) is in ``test_faults.py``.
"""

from __future__ import annotations

import pytest
from ipyparallel.error import RemoteError

from thunderviz.cell.failures import (
    CellError,
    FailureKind,
    RankFailure,
    RanksInterrupted,
    cell_error,
    classify_remote_error,
    find_collective,
)

# IPython's traceback format on the engine: frame headers carry the call's arguments.
GLOO_TIMEOUT_TB = """---------------------------------------------------------------------------
RuntimeError                              Traceback (most recent call last)
Cell In[3], line 2
----> 2     torch.distributed.all_reduce(torch.ones(4))
File .../torch/distributed/distributed_c10d.py:2806, in all_reduce(tensor, op, group, async_op)
-> 2806     work.wait()
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:1234: Connection reset
"""


def _remote(ename: str, evalue: str, tb: str = "") -> RemoteError:
    return RemoteError(ename, evalue, tb)


def test_a_raise_is_raised_with_its_traceback() -> None:
    failure = classify_remote_error(
        1, _remote("ValueError", "bad batch", "Traceback...\nValueError: bad batch"), interrupt_sent=False
    )
    assert (failure.rank, failure.kind, failure.summary) == (1, FailureKind.RAISED, "ValueError: bad batch")
    assert "ValueError: bad batch" in failure.traceback


def test_a_gloo_timeout_names_the_collective() -> None:
    failure = classify_remote_error(
        0, _remote("RuntimeError", "gloo: Timed out waiting 5000ms", GLOO_TIMEOUT_TB), interrupt_sent=False
    )
    assert failure.kind is FailureKind.TIMEOUT and failure.collective == "all_reduce"
    assert find_collective("  File 'x', line 1, in torch_reduce_scatter_prim_impl(\n") == "reduce_scatter"


def test_keyboard_interrupt_is_ours_only_after_we_sent_sigint() -> None:
    exc = _remote("KeyboardInterrupt", "", "KeyboardInterrupt")
    assert classify_remote_error(0, exc, interrupt_sent=True).kind is FailureKind.INTERRUPTED
    assert classify_remote_error(0, exc, interrupt_sent=False).kind is FailureKind.RAISED  # the cell raised it


def test_a_vanished_engine_is_a_death() -> None:
    failure = classify_remote_error(2, _remote("EngineError", "Engine 3 died"), interrupt_sent=False)
    assert failure.kind is FailureKind.DIED


def test_a_failure_kind_prints_as_its_word_and_an_unknown_word_is_refused() -> None:
    assert [str(k) for k in FailureKind] == ["raised", "died", "timeout", "killed", "interrupted", "unreachable"]
    assert RankFailure(0, "died", "gone").kind is FailureKind.DIED  # a serialised failure reads back typed
    assert f"{RankFailure(0, FailureKind.KILLED, 'x').kind}" == "killed"
    with pytest.raises(ValueError, match="'vanished' is not a valid FailureKind"):
        RankFailure(0, "vanished", "?")


def test_the_message_names_every_rank_and_the_restart() -> None:
    failures = {
        0: RankFailure(0, FailureKind.TIMEOUT, "RuntimeError: timed out", "tb0", "all_reduce"),
        2: RankFailure(2, FailureKind.KILLED, "killed: it did not finish", "KeyboardInterrupt"),
    }
    err = cell_error(failures, ranks=[0, 1, 2], timeout_s=5, restart_pending=True)
    assert isinstance(err, CellError) and not isinstance(err, RanksInterrupted)
    text = str(err)
    assert text.startswith("The cell failed on 2 of 3 ranks: ")
    assert "rank 0 is stuck: it waited 5 s (--timeout) in all_reduce that not every rank entered" in text
    assert "rank 2 killed: it did not finish" in text
    assert "rank(s) 1 finished the cell without entering it" in text
    assert text.endswith("The ranks will be restarted before the next cell (their state is lost).")
    assert err.rank == 0 and err.remote_traceback == "tb0" and err.pool_restart_pending
    assert "--- rank 0: traceback ---" in err._render_traceback_() and "  tb0" in err._render_traceback_()
    assert "[rank 0] tb0" in err.full_traceback()
    # where our stop found rank 2 is labelled as such, not read as a second cause
    assert "--- rank 0 traceback ---" in err.full_traceback()
    assert "--- rank 2 traceback (stopped by us: killed) ---\n[rank 2] KeyboardInterrupt" in err.full_traceback()


def test_the_message_leads_with_the_rank_that_failed_not_the_one_we_stopped() -> None:
    failures = {
        0: RankFailure(0, FailureKind.KILLED, "killed after a peer failed"),
        1: RankFailure(1, FailureKind.RAISED, "ValueError: a bad batch on rank 1", "tb1"),
    }
    text = str(cell_error(failures, ranks=[0, 1], timeout_s=60, restart_pending=True))
    assert text.startswith("The cell failed on 2 of 2 ranks: rank 1 raised ValueError: a bad batch on rank 1; rank 0")


def test_all_interrupted_is_ranks_interrupted() -> None:
    failures = {r: RankFailure(r, FailureKind.INTERRUPTED, "stopped by KeyboardInterrupt") for r in (0, 1)}
    err = cell_error(failures, ranks=[0, 1], timeout_s=60, restart_pending=False, what="Configuring fabric")
    assert isinstance(err, RanksInterrupted)
    assert str(err).startswith("Configuring fabric failed on 2 of 2 ranks: ranks 0, 1 interrupted")


def _ipython_traceback() -> str:
    """A real IPython traceback, as a rank's shell formats it: this file's frame calls into the standard library."""
    import json

    from IPython.core.ultratb import AutoFormattedTB

    def load_config(text: str) -> object:
        return json.loads(text)  # raises inside the standard library

    try:
        load_config("{not json")
    except ValueError:
        import sys

        lines = AutoFormattedTB(mode="Context", theme_name="nocolor").structured_traceback(*sys.exc_info())
    return "\n".join(lines)


def test_identical_tracebacks_show_once_with_the_users_frame_first_and_library_frames_folded() -> None:
    tb = _ipython_traceback()
    failures = {r: RankFailure(r, FailureKind.RAISED, "JSONDecodeError: Expecting property name", tb) for r in (0, 1)}
    err = cell_error(failures, ranks=[0, 1], timeout_s=60, restart_pending=False)
    assert str(err).startswith("The cell failed on 2 of 2 ranks: ranks 0, 1 raised JSONDecodeError")
    shown = err._render_traceback_()
    assert shown[1] == "--- ranks 0, 1 (the same traceback): traceback ---"
    assert shown[2].startswith("  JSONDecodeError: Expecting property name")
    assert "load_config" in shown[3] and "json.loads(text)" in shown[5], shown  # the user's frame, its arrow line
    folded = next(line for line in shown if "library frames folded" in line)
    assert "the standard library" in folded and "raised in " in shown[shown.index(folded) + 1]
    assert sum("decoder.py" in line for line in shown) == 1  # only where it was raised
    assert shown[-1].startswith("Every rank's full traceback: %thunder_ranks traceback")
    assert err.full_traceback().count("decoder.py") >= 2 and "[rank 1] " in err.full_traceback()
    # another traceback on one rank is shown on its own
    failures[1] = RankFailure(1, FailureKind.RAISED, "ValueError: other", "ValueError: other")
    shown = cell_error(failures, ranks=[0, 1], timeout_s=60, restart_pending=False)._render_traceback_()
    assert "--- rank 0: traceback ---" in shown and "--- rank 1: traceback ---" in shown


def test_a_rank_whose_traceback_did_not_arrive_joins_the_rank_that_raised_the_same_error() -> None:
    """Under load ipyparallel can hand back "No traceback available" for one of two ranks that raised the same
    error: the message said "ranks 0, 1 raised" over an empty traceback for rank 0 and rank 1's own."""
    real = "Traceback (most recent call last):\n  Cell In[4], line 10, in forward\nRuntimeError: bad shapes"
    failures = {
        0: RankFailure(0, FailureKind.RAISED, "RuntimeError: bad shapes", "[0:execute]\nNo traceback available"),
        1: RankFailure(1, FailureKind.RAISED, "RuntimeError: bad shapes", real),
    }
    lines = CellError("ranks 0, 1 raised RuntimeError: bad shapes", failures, restarted=False)._render_traceback_()
    assert "--- ranks 0, 1 (the same traceback): traceback ---" in lines, lines
    assert not any("No traceback available" in line for line in lines), lines
    # a different error keeps its own block, placeholder or not
    failures[0] = RankFailure(0, FailureKind.RAISED, "ValueError: other", "[0:execute]\nNo traceback available")
    lines = CellError("ranks 0, 1 raised", failures, restarted=False)._render_traceback_()
    assert "--- rank 0: traceback ---" in lines and "--- rank 1: traceback ---" in lines, lines
