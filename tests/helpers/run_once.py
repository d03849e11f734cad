"""``@once_per_run``: a test helper's expensive result (real rank runs that write traces or timelines) made once per
``pytest`` run, not once per pytest-xdist worker.

Why: ``./run test`` runs two workers, each with its own session, so a helper cached with ``functools.cache`` ran
once in *each* worker whose files used it: the timeline recording, the bucketed traces and the GPT traces are used
by files that land on both workers, a minute or two of 2-rank compiles apiece, paid twice on two shared cores. Here
the first worker to ask computes while holding a lock; the other waits (its cores go to the one computing), then
loads the pickled result. The result's files live in their own temporary folders, which outlast the run as before.

Without xdist it is ``functools.cache``. A result that failed is not stored: the next caller computes again and
gets its own error. The folder of pickles is removed by the controller when the run ends (``tests/conftest.py``).
"""

from __future__ import annotations

import fcntl
import functools
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["once_per_run", "shared_folder"]

T = TypeVar("T")


def shared_folder(session: str) -> Path:
    """The folder the workers of the run tagged ``session`` (``THUNDERVIZ_TEST_SESSION``) share."""
    return Path(tempfile.gettempdir()) / f"thunderviz-tests-{session}"


def once_per_run(fn: Callable[..., T]) -> Callable[..., T]:
    """Cache ``fn``'s result per arguments across the run's workers (arguments must have a stable ``repr``)."""

    @functools.cache
    def cached(*args: Any) -> T:
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return fn(*args)
        folder = shared_folder(os.environ["THUNDERVIZ_TEST_SESSION"])  # set by tests/conftest.py in the controller
        folder.mkdir(exist_ok=True)
        stem = f"{fn.__module__}.{fn.__qualname__}{args!r}".replace("/", "_")
        done = folder / f"{stem}.pkl"
        with open(folder / f"{stem}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
            if done.exists():
                return pickle.loads(done.read_bytes())
            result = fn(*args)
            partial = done.with_suffix(".partial")
            partial.write_bytes(pickle.dumps(result))
            partial.replace(done)
            return result

    return functools.wraps(fn)(cached)
