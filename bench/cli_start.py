"""Start-up of ``thunderviz render FILE`` against a bare ``python -c pass``, side by side in one run.

``thunderviz render`` only needs the trace model, its file format and the HTML renderer; importing lightning (as
``import thunderviz`` once did, to register the strategy names) cost 2-4 s before it did anything. Target: at most
0.5 s more than the bare interpreter. A third row, ``python -c "import lightning"``, shows what is being avoided.

The commands run interleaved (round 1: each command once, round 2: each once, ...) so machine noise hits all of
them alike; the median of the rounds is reported. The file is two ranks' small FSDP traces
(``tests/helpers/small_traces.py``), rendered with ``--no-svg`` so that Graphviz's ``dot`` (a separate program,
only run when installed) does not blur what is measured: Python start-up, imports, load, render, write.

Run: ``.venv/bin/python bench/cli_start.py [--rounds 9]``. Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_S = 0.5


def _thunderviz_command() -> list[str]:
    """The console script next to this interpreter (what a user runs), else ``python -m thunderviz.cli``."""
    script = Path(sys.executable).parent / "thunderviz"
    return [str(script)] if script.exists() else [sys.executable, "-m", "thunderviz.cli"]


def _time_once(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds; the median is reported")
    args = parser.parse_args()

    from tests.helpers.small_traces import write_rank_files

    folder = Path(tempfile.mkdtemp(prefix="thunderviz-cli-start-"))
    try:
        files = [str(f) for f in write_rank_files(folder)]
        render = [*_thunderviz_command(), "render", *files, "--out", str(folder / "report.html"), "--no-svg"]
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "thunderviz render 2 small files": render,
            'python -c "import lightning"': [sys.executable, "-W", "ignore", "-c", "import lightning"],
        }
        for cmd in commands.values():  # warm the file system cache and the .pyc files once, untimed
            _time_once(cmd)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, cmd in commands.items():
                times[name].append(_time_once(cmd))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    base = statistics.median(times["python -c pass"])
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"thunderviz render start-up, {args.rounds} interleaved rounds, load average {load[0]:.2f}")
    print(f"{'command':<34}{'median s':>10}{'min s':>9}{'max s':>9}{'- python':>11}")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"{name:<34}{med:>10.3f}{min(samples):>9.3f}{max(samples):>9.3f}{med - base:>+11.3f}")
    extra = statistics.median(times["thunderviz render 2 small files"]) - base
    verdict = "within" if extra <= TARGET_S else "OVER"
    print(f"render costs {extra:.3f} s more than a bare interpreter: {verdict} the {TARGET_S} s target")


if __name__ == "__main__":
    main()
