"""The ``--timeline [--steps N]`` flags of ``%%thunder_fsdp`` / ``%%thunder_ddp``: their definitions and checks.

Kept apart from ``magics.py`` so the magics add two ``argument`` lines and one call. The ranks do the recording
(``rank.timeline``) and the report merges it (``RunReport.timeline``).
"""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError

from thunderviz.cell.protocol import DEFAULT_TIMELINE_STEPS

__all__ = ["STEPS_HELP", "TIMELINE_HELP", "steps_arg", "timeline_options"]

TIMELINE_HELP = (
    "record every rank with torch.profiler while the cell runs: compute, collectives, who waited for whom; the "
    "report shows it (report.timeline, report.timeline.save_chrome_trace(path))"
)
STEPS_HELP = (
    f"with --timeline: record N training steps after the first one (default {DEFAULT_TIMELINE_STEPS}); a step "
    "ends when an optimizer's step() returns"
)


def steps_arg(text: str) -> int:
    """``--steps`` value: a whole number >= 1, with a message that says what a step is."""
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or n < 1:
        raise argparse.ArgumentTypeError(
            f"--steps {text}: need a whole number >= 1 (how many training steps to record after the first); "
            f"for example --timeline --steps {DEFAULT_TIMELINE_STEPS}"
        )
    return n


def timeline_options(args: argparse.Namespace) -> dict[str, object]:
    """``RankEngine.run`` keywords for the parsed flags; ``--steps`` without ``--timeline`` is a usage error
    (it would otherwise be ignored without a word)."""
    if args.steps is not None and not args.timeline:
        raise UsageError(
            f"--steps {args.steps} counts the steps of a timeline; add --timeline (e.g. --timeline --steps "
            f"{args.steps}) or drop --steps"
        )
    steps = DEFAULT_TIMELINE_STEPS if args.steps is None else args.steps
    return {"timeline": bool(args.timeline), "steps": steps}
