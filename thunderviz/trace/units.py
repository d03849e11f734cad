"""Byte counts and durations as people read them: the one formatter for every size and every short duration
thunderviz prints (graphs, reports, diffs, timelines).

Here, in the plain-data layer, so trace, timeline, render and notebook code all reach it without importing each
other. (The widgets' JavaScript formats the sizes it draws itself.)
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["format_bytes", "format_count", "format_us", "steps_text"]

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def format_bytes(n: int | None, *, unknown: str = "n/a") -> str:
    """``192 B``, ``774.5 KiB``, ``3.0 GiB``: binary units, one decimal; ``unknown`` when ``n`` is None.

    Integer arithmetic (halves round up), so no size from a file is too large to print or printed wrong by float
    rounding.
    """
    if n is None:
        return unknown
    if n < 1024:
        return f"{n} B"
    i, scale = 0, 1024
    while i < len(_UNITS) - 1 and n >= scale * 1024:
        i, scale = i + 1, scale * 1024
    tenths = (n * 10 + scale // 2) // scale
    return f"{tenths // 10}.{tenths % 10} {_UNITS[i]}"


def format_us(us: float) -> str:
    """A duration given in microseconds, always in ms: ``8.6 ms``, ``0.16 ms`` (a clock bound read "±163 us" on the
    timeline and "+/- 0.16 ms" in the straggler text before; one unit lets the two be compared at a glance)."""
    ms = us / 1000
    return f"{ms:.1f} ms" if abs(ms) >= 1 else f"{ms:.2f} ms"


def format_count(n: int) -> str:
    """``812``, ``53.1k``, ``6.7M``, ``7.0B``: a count of things (parameters) as people read it."""
    for scale, unit in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def steps_text(steps: Iterable[int]) -> str:
    """``step 6``, ``steps 2-5``, ``steps 2, 4`` (empty for none): which steps of a run a number was measured on."""
    ordered = sorted(steps)
    if not ordered:
        return ""
    if len(ordered) == 1:
        return f"step {ordered[0]}"
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"steps {ordered[0]}-{ordered[-1]}"
    return "steps " + ", ".join(map(str, ordered))
