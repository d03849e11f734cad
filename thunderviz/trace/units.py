"""Byte counts and durations as people read them: the one formatter for every size and every short duration
thunderviz prints (graphs, reports, diffs, timelines).

Here, in the plain-data layer, so trace, timeline, render and notebook code all reach it without importing each
other. (The widgets' JavaScript formats the sizes it draws itself.)
"""

from __future__ import annotations

__all__ = ["format_bytes", "format_us"]

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
