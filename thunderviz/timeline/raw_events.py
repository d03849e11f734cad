"""The raw material of one rank's timeline: what the recorder (``timeline.record``) hands the builder
(``timeline.build``).

Profiler events in microseconds on the rank's clock, the prefix of our own ``record_function`` labels, what each
collective call sent (seen by the recorder's wrappers while the step ran) and what each watched module's traces say
(its ledger, and the module group and name of every trace op). Plain data, so the builder's rules can be tested on
hand-made events without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["MARK", "CollectiveMeta", "ModuleInfo", "RawEvent"]

#: The prefix of every label the recorder places (``thunderviz.step#3``, ``thunderviz.collective#12``, ...).
MARK = "thunderviz."


@dataclass(frozen=True)
class RawEvent:
    """One profiler event, in microseconds on the rank's clock. ``device`` is ``cpu`` or ``cuda``."""

    name: str
    tid: int
    start: float
    end: float
    device: str = "cpu"


@dataclass(frozen=True)
class CollectiveMeta:
    """What our wrapper saw when collective K was issued."""

    kind: str
    sync: bool
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int | None = None
    group_size: int | None = None


@dataclass
class ModuleInfo:
    """A watched (jitted) module: its name, ledger entries (``LedgerEntry.to_dict()`` rows) and, per trace, the
    module group of every op (None for bookkeeping ops) and its name (``linear``, ``torch_prims_reshape_impl``;
    empty for bookkeeping ops), from its captured traces."""

    name: str
    ledger: list[dict[str, Any]] = field(default_factory=list)
    op_groups: dict[str, list[str | None]] = field(default_factory=dict)
    op_names: dict[str, list[str]] = field(default_factory=dict)
    problem: str = ""
