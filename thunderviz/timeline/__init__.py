"""Measured per-rank timelines: what happened, in time, on every rank (the trace model says what thunder planned).

Modules, one job each: ``model`` (the dataclasses), ``clock`` (one clock for all ranks), ``raw_events`` (what the
recorder hands the builder), ``build`` (profiler events -> a ``RankTimeline``), ``attribution`` (collectives named
from the ledger, compute given to module groups), ``analysis`` (breakdown and stragglers), ``chrome`` (Trace Event
Format for Perfetto), ``file`` (reading saved timelines, hardened), ``record`` (torch.profiler on a rank) and
``instrumentation`` (its hooks and wrappers): the only modules here that import torch. Open and analyse a saved
timeline anywhere: ``thunderviz.timeline.load("timeline-rank0.json", ...)``.
"""

from thunderviz.timeline.file import load
from thunderviz.timeline.model import NoTimelineError, RankTimeline, Timeline, save

__all__ = ["NoTimelineError", "RankTimeline", "Timeline", "load", "save"]
