"""Trace files for a test session: written fresh into a temporary folder, or reused from a folder an environment
variable names (while working on the views, to skip minutes of 2-rank runs; CI never sets one)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


def trace_files(
    variable: str, runs: Iterable[str], write: Callable[[str], dict[str, list[str]]], prefix: str
) -> dict[str, list[str]]:
    """``{run: [rank-0 file, rank-1 file]}``: from the folder in ``$variable`` when set (each file must be there),
    else what ``write(folder)`` returns for a fresh temporary folder named ``prefix...``."""
    reuse = os.environ.get(variable)
    if not reuse:
        return write(tempfile.mkdtemp(prefix=prefix))
    files = {run: [str(Path(reuse) / f"{run}-rank{r}.json") for r in range(2)] for run in runs}
    missing = [f for fs in files.values() for f in fs if not Path(f).exists()]
    if missing:
        raise FileNotFoundError(f"{variable}={reuse!r}: missing {missing}")
    return files
