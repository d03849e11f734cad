"""Rank side: while a user cell runs, say when thunder (or inductor) is compiling, so the chip is not a bare
"running" for the 10-20 s a first compile takes (a cold start showed "running" for 12 s).

Why sample the stack rather than wrap thunder's compile: the compile is thunder's cache miss inside ``thunder.jit``'s
own closures (``acquire_initial_trace``, then ``apply_transforms_and_build_cache_entry``: interpreting, our
transforms, autodiff, fusion), which nothing outside thunder can wrap; and a compile we did not start (the user's own
``thunder.jit``, case 2) counts as much. A thread looks at the main thread's frames every ``SAMPLE_S`` and publishes
``Phase.COMPILING`` or ``Phase.RUNNING`` on the cell's data channel when that changes (the driver shows it). Cost: one
stack walk per sample, from a thread that sleeps in between; a compile shorter than a sample may go unseen, which
is fine for a status line. The watch stops in the post-cell hook before that publishes ``collecting``.

The same samples say where the compile's time went (``CellPhaseWatch.spent``: thunder's interpreter, thunder's passes
after it, ours among them, inductor): each interval between two samples goes to what the second one saw. A cell that
reused a trace still spent seconds compiling, and its report says in which part (``compile_split``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from thunderviz.cell.protocol import PHASE_DATA_KEY
from thunderviz.cell.status import Phase

__all__ = [
    "INDUCTOR",
    "INTERPRETER",
    "OURS",
    "PASSES",
    "SAMPLE_S",
    "SPLIT",
    "CellPhaseWatch",
    "compile_part",
    "compile_split",
    "compiling",
]

#: seconds between two looks at the main thread's stack
SAMPLE_S = 0.1

#: The parts of a compile, as the report names them.
INTERPRETER = "thunder's interpreter"
PASSES = "thunder's passes after its interpreter"
OURS = "thunderviz's passes among them"
INDUCTOR = "inductor compiling fusion regions"

#: (file name ending, function name or "" for any, part) of the frames that make a stack "compiling"
_COMPILE_FRAMES = (
    ("thunder/__init__.py", "acquire_initial_trace", INTERPRETER),  # thunder's interpreter (or our compile reuse)
    ("thunder/__init__.py", "apply_transforms_and_build_cache_entry", PASSES),  # transforms, autodiff, executors
    # our communication pass, every module of it (gathers, reductions, zero3_saves, ops, bucket_code, and the
    # re-fusion): thunder calls them only through CommTransform's methods in comm_pass.py, and the whole stack is read
    ("thunderviz/thunder/comm/comm_pass.py", "", OURS),
    ("torch/_inductor/compile_fx.py", "compile_fx", INDUCTOR),  # a torch.compile region (thunder's torchcompile)
)
#: How the line saying where a rank's seconds went begins (``compile_split``).
SPLIT = "of this rank's "
#: When a stack is in several parts, the one it is counted in: the innermost kind of work wins over what called it.
_PRECEDENCE = (INDUCTOR, OURS, INTERPRETER, PASSES)


def compile_part(frame: FrameType | None) -> str | None:
    """Which part of a thunder or inductor compile a stack, from ``frame`` outwards, is in (None: not compiling)."""
    seen: set[str] = set()
    while frame is not None:
        code = frame.f_code
        for filename, name, part in _COMPILE_FRAMES:
            if (not name or code.co_name == name) and code.co_filename.replace("\\", "/").endswith(filename):
                seen.add(part)
        frame = frame.f_back
    if OURS in seen and PASSES not in seen:
        seen.discard(OURS)  # our pass's code called outside thunder's compile (a capture, a test) is no compile
    return next((p for p in _PRECEDENCE if p in seen), None)


def compiling(frame: FrameType | None) -> bool:
    """Whether a stack, from ``frame`` outwards, is inside a thunder or inductor compile."""
    return compile_part(frame) is not None


def compile_split(
    spent: dict[str, float], *, captured_s: float = 0.0, total_s: float | None = None, reused: bool = False
) -> str:
    """``of this rank's 8.7 s: thunder's passes after its interpreter 4.1 s (thunderviz's passes among them 0.3 s),
    capturing the traces for this report 1.5 s, the rest (the cell's own code and steps) 3.1 s``: where a cell's
    seconds went on a rank, the parts under 0.05 s left out (a compile shorter than a sample may go unseen); without
    ``total_s``, "" when no compile was seen. ``reused``: the interpreter's part was finding the trace to reuse
    (computing its key), and is named so."""
    if total_s is None and not any(spent.get(p, 0.0) >= 0.05 for p in _PRECEDENCE):
        return ""
    passes = spent.get(PASSES, 0.0) + spent.get(OURS, 0.0)
    parts = []
    if spent.get(INTERPRETER, 0.0) >= 0.05:
        parts.append(f"{'finding the trace to reuse' if reused else INTERPRETER} {spent[INTERPRETER]:.1f} s")
    if passes >= 0.05:
        ours = f" ({OURS} {spent[OURS]:.1f} s)" if spent.get(OURS, 0.0) >= 0.05 else ""
        parts.append(f"{PASSES} {passes:.1f} s{ours}")
    if spent.get(INDUCTOR, 0.0) >= 0.05:
        parts.append(f"{INDUCTOR} {spent[INDUCTOR]:.1f} s")
    if captured_s >= 0.05:
        parts.append(f"capturing the traces for this report {captured_s:.1f} s")
    if total_s is not None:
        rest = total_s - sum(spent.get(p, 0.0) for p in _PRECEDENCE) - captured_s
        if rest >= 0.05:
            parts.append(f"the rest (the cell's own code and steps) {rest:.1f} s")
        return f"{SPLIT}{total_s:.1f} s: " + ", ".join(parts)
    return ", ".join(parts)


class CellPhaseWatch:
    """Publishes ``compiling`` / ``running`` for one thread (the main thread: where a cell runs) while started."""

    def __init__(
        self,
        publish: Callable[[dict[str, Any]], None],
        *,
        thread_id: int | None = None,
        sample_s: float = SAMPLE_S,
    ) -> None:
        self._publish = publish
        self._thread_id = thread_id if thread_id is not None else threading.main_thread().ident
        self._sample_s = sample_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.said: Phase = Phase.RUNNING
        #: seconds per compile part (``compile_part``) since ``start``, as the samples saw them
        self.spent: dict[str, float] = {}
        self.started_at = 0.0
        self._last = 0.0

    def start(self) -> None:
        self._stop.clear()
        self.said = Phase.RUNNING
        self.spent = {}
        self.started_at = self._last = time.perf_counter()
        self._thread = threading.Thread(target=self._watch, name="thunderviz-cell-phase", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling; when the last word was ``compiling``, say ``running`` again (the cell's compile ended)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        self._say(Phase.RUNNING)

    def _watch(self) -> None:
        while not self._stop.wait(self._sample_s):
            frame = sys._current_frames().get(self._thread_id)
            part = compile_part(frame)
            del frame
            now = time.perf_counter()
            if part is not None:
                self.spent[part] = self.spent.get(part, 0.0) + (now - self._last)
            self._last = now
            self._say(Phase.COMPILING if part is not None else Phase.RUNNING)

    def _say(self, phase: Phase) -> None:
        if phase is self.said:
            return
        self.said = phase
        with contextlib.suppress(Exception):  # a status line must never fail a cell
            self._publish({PHASE_DATA_KEY: phase})
