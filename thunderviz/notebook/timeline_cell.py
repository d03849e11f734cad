"""The kernel side of ``--timeline [--steps N]``: argument checks and turning the ranks' recordings into one
``Timeline`` with plain-language problems (a rank that died, a cell that ran no step).

Kept apart from ``magics.py`` so the magics only add two flags and two calls.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from thunderviz.core.timeline import RankTimeline, Timeline

__all__ = ["DEFAULT_STEPS", "STEPS_HELP", "steps_arg", "timeline_from_collected"]

DEFAULT_STEPS = 5
STEPS_HELP = (
    f"with --timeline: record N training steps after the first one (default {DEFAULT_STEPS}); a step "
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
            f"for example --timeline --steps {DEFAULT_STEPS}"
        )
    return n


def timeline_from_collected(
    collected: Mapping[int, Mapping[str, Any]], *, world_size: int, name: str = ""
) -> tuple[Timeline | None, list[str]]:
    """Merge what each rank's ``finish_cell_recording`` returned; ``(None, problems)`` when nothing usable came."""
    problems: list[str] = []
    recs: list[RankTimeline] = []
    for rank in range(world_size):
        data = collected.get(rank)
        if data is None:
            continue  # Timeline.from_ranks names the missing ranks in the timeline's own problems
        problems.extend(f"rank {rank}: {p}" for p in data.get("timeline_problems", ()))
        t = data.get("timeline")
        if isinstance(t, RankTimeline):
            recs.append(t)
    if not recs:
        return None, problems or ["--timeline: no rank returned a timeline (they died or did not finish the cell)"]
    if not any(t.steps for t in recs):
        problems.append(
            "--timeline: the cell ran no training step while recording: no optimizer step(), no call of a jitted "
            "module (a step ends when an optimizer's step() returns; a cell without an optimizer counts calls of "
            "the module fabric.setup returned)"
        )
    return Timeline.from_ranks(recs, name=name), problems
