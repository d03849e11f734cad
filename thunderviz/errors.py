"""One exception hierarchy for thunderviz.

    ThundervizError
    ├── JitDecisionError      a strategy cannot decide safely what to do with the object handed to ``fabric.setup``
    │   └── UntraceableModelError  thunder could not trace a model a strategy set up (names module, line, op, fix)
    ├── UnsupportedThunderError  the installed lightning-thunder is not one our thunder hooks were tested with
    ├── RankError             a rank process raised, died or hung (carries the rank and its traceback)
    ├── TraceFormatError      a saved trace file cannot be read
    ├── TraceCaptureError     `capture` got an object that is not jitted or has not run yet
    └── PlanError             a memory plan cannot be made, or no candidate fits the memory budget

Every message names the call that failed and the fix, because users meet these in a notebook cell where the
surrounding code is theirs, not ours.
"""

from __future__ import annotations

__all__ = [
    "JitDecisionError",
    "PlanError",
    "RankError",
    "ThundervizError",
    "TraceCaptureError",
    "TraceFormatError",
    "UnsupportedThunderError",
    "UntraceableModelError",
]


class ThundervizError(Exception):
    """Base class: catch this to handle anything thunderviz raises on purpose."""


class JitDecisionError(ThundervizError, ValueError):
    """The strategy cannot apply FSDP/DDP to this object without giving wrong results."""


class UntraceableModelError(JitDecisionError):
    """thunder's interpreter could not trace a model our strategies set up; ``failure`` locates it
    (``thunder.jit.untraceable.TraceFailure``: module, line, op). The interpreter's own error is its ``__cause__``."""

    def __init__(self, message: str, *, failure: object = None) -> None:
        super().__init__(message)
        self.failure = failure


class UnsupportedThunderError(ThundervizError, RuntimeError):
    """Our hooks into thunder internals were not tested with the installed version."""


class RankError(ThundervizError, RuntimeError):
    """A rank process failed; ``rank`` and ``remote_traceback`` say which and where."""

    def __init__(self, message: str, *, rank: int | None = None, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


class TraceFormatError(ThundervizError, ValueError):
    """A saved trace file is not one thunderviz wrote, or was written by an incompatible version."""


class TraceCaptureError(ThundervizError, ValueError):
    """``capture`` was handed something it cannot read traces from (not jitted, or not run yet)."""


class PlanError(ThundervizError, ValueError):
    """``thunderviz.plan`` (or the auto strategy) cannot plan this model, or no candidate fits the memory budget."""
