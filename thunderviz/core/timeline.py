"""Moved to ``thunderviz.timeline`` (documented as ``thunderviz.core.timeline.load``); re-exported."""

from thunderviz.timeline import NoTimelineError, RankTimeline, Timeline, load, save

__all__ = ["NoTimelineError", "RankTimeline", "Timeline", "load", "save"]
