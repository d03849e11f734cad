"""Moved to ``thunderviz.trace.diff`` (documented as ``thunderviz.core.diff.collective_changes``); re-exported."""

from thunderviz.trace.diff import TraceDiff, collective_changes, diff_traces

__all__ = ["TraceDiff", "collective_changes", "diff_traces"]
