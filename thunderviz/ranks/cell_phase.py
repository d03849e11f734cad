"""Rank side: while a user cell runs, say when thunder (or inductor) is compiling, so the chip is not a bare
"running" for the 10-20 s a first compile takes (issue 30: a cold start showed "running" for 12 s).

Why sample the stack rather than wrap thunder's compile: the compile is thunder's cache miss inside ``thunder.jit``'s
own closures (``acquire_initial_trace``, then ``apply_transforms_and_build_cache_entry``: interpreting, our
transforms, autodiff, fusion), which nothing outside thunder can wrap; and a compile we did not start (the user's own
``thunder.jit``, case 2) counts as much. A thread looks at the main thread's frames every ``SAMPLE_S`` and publishes
``Phase.COMPILING`` or ``Phase.RUNNING`` on the cell's data channel when that changes (the driver shows it). Cost: one
stack walk per sample, from a thread that sleeps in between; a compile shorter than a sample may go unseen, which
is fine for a status line. The watch stops in the post-cell hook before that publishes ``collecting``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from thunderviz.ranks.protocol import PHASE_DATA_KEY
from thunderviz.ranks.status import Phase

__all__ = ["SAMPLE_S", "CellPhaseWatch", "compiling"]

#: seconds between two looks at the main thread's stack
SAMPLE_S = 0.1

#: (file name ending, function name) of the frames that make a stack "compiling"
_COMPILE_FRAMES = (
    ("thunder/__init__.py", "acquire_initial_trace"),  # thunder's interpreter (or our compile reuse)
    ("thunder/__init__.py", "apply_transforms_and_build_cache_entry"),  # transforms, autodiff, executors, fusion
    ("torch/_inductor/compile_fx.py", "compile_fx"),  # a torch.compile region (thunder's torchcompile executor)
)


def compiling(frame: FrameType | None) -> bool:
    """Whether a stack, from ``frame`` outwards, is inside a thunder or inductor compile."""
    while frame is not None:
        code = frame.f_code
        for filename, name in _COMPILE_FRAMES:
            if code.co_name == name and code.co_filename.replace("\\", "/").endswith(filename):
                return True
        frame = frame.f_back
    return False


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

    def start(self) -> None:
        self._stop.clear()
        self.said = Phase.RUNNING
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
            self._say(Phase.COMPILING if compiling(frame) else Phase.RUNNING)
            del frame

    def _say(self, phase: Phase) -> None:
        if phase is self.said:
            return
        self.said = phase
        with contextlib.suppress(Exception):  # a status line must never fail a cell
            self._publish({PHASE_DATA_KEY: phase})
