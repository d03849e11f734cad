"""Rank side: what a cell ran, told from what had run before it.

Before a cell, ``snapshot`` records the call count of every jitted object the namespace or the strategy holds, and
where the strategy's decision log ends (``CellSnapshot``). After it, ``cell_targets`` lists the objects that ran
or were set up in the cell: those are the ones the report captures. ``forget_unreachable_modules`` lets go of
modules the strategy alone still lists. Importing this module is cheap: thunder loads inside the functions.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CellSnapshot", "cell_targets", "forget_unreachable_modules", "snapshot", "strategy_of"]


@dataclass(frozen=True)
class CellSnapshot:
    """What had run when a cell started: call counts of jitted objects by ``id`` (ids, so the snapshot keeps
    nothing alive), and the length of the strategy's decision log then."""

    calls: dict[int, int] = field(default_factory=dict)
    decisions: int = 0


def strategy_of(ns: dict[str, Any]) -> Any:
    """The strategy of the namespace's ``fabric`` (``None`` without one)."""
    fabric = ns.get("fabric")
    return getattr(fabric, "strategy", None) if fabric is not None else None


def snapshot(ns: dict[str, Any]) -> CellSnapshot:
    """Call counts of every jitted object (namespace and strategy), and where the strategy's decision log ends, so
    the report can tell what ran in the next cell."""
    counts = {id(obj): _calls(obj) for obj in _jitted_objects(ns).values()}
    for _, module in _strategy_modules(ns):
        counts[id(module)] = _calls(module)
    return CellSnapshot(calls=counts, decisions=len(getattr(strategy_of(ns), "decisions", None) or []))


def cell_targets(ns: dict[str, Any], before: CellSnapshot) -> list[tuple[str, Any]]:
    """What this cell set up through the strategy (cases 1 and 3) or called (those, and case 2's jitted
    functions), by name; objects from earlier cells that did not run again are not re-captured.

    Objects are told apart by their compile data: Fabric's wrapper forwards attribute lookups to the
    ThunderModule inside, so ``model`` and the strategy's module are one compiled object, captured once.
    """
    from thunderviz.thunder.compile_state import compile_key as key
    from thunderviz.thunder.compile_state import has_traces

    targets: list[tuple[str, Any]] = []
    seen: set[int] = set()

    for name, module in _strategy_modules(ns):
        if key(module) in seen:
            continue
        if id(module) not in before.calls or _calls(module) > before.calls[id(module)]:
            seen.add(key(module))
            targets.append((name, module))
    for name, obj in _jitted_objects(ns).items():
        if key(obj) in seen:
            continue
        if not has_traces(obj):
            continue
        if _calls(obj) > before.calls.get(id(obj), 0):
            seen.add(key(obj))
            targets.append((name, obj))
    return targets


def forget_unreachable_modules(ns: dict[str, Any]) -> int:
    """Drop the strategy's entries for modules nothing else holds any more; returns how many.

    Why: the strategy lists every module set up through it (``thunder_modules``), so a notebook that runs
    ``model = fabric.setup(Model())`` in each cell kept every earlier model, its compiled traces and caches alive
    (measured: 17-18 MB per cell per rank). A module whose only reference is that list can never be called again,
    so no later report needs it. Runs after the report data was gathered, so a module set up and dropped within
    one cell is still reported.
    """
    modules = getattr(strategy_of(ns), "thunder_modules", None)
    if not modules:
        return 0
    # a module only the list holds has two references here: the entry's tuple, and getrefcount's argument
    keep = [entry for entry in modules if sys.getrefcount(entry[1]) > 2]
    dropped = len(modules) - len(keep)
    if dropped:
        modules[:] = keep
    return dropped


def _jitted_objects(ns: dict[str, Any]) -> dict[str, Any]:
    """The namespace's jitted objects by name; what ``fabric.setup`` returned counts by the ThunderModule inside
    Fabric's wrapper (a model set up by an earlier cell's strategy, used again under a new ``fabric``, is still the
    model that ran)."""
    from thunderviz.thunder.compile_state import is_jitted
    from thunderviz.thunder.modules import unwrap_fabric

    found = {}
    for name, obj in list(ns.items()):
        if name.startswith("_") or isinstance(obj, (int, float, str, bytes, type(None))):
            continue
        try:
            inner = unwrap_fabric(obj)
            if is_jitted(inner):
                found[name] = inner
        except Exception:
            continue
    return found


def _strategy_modules(ns: dict[str, Any]) -> list[tuple[str, Any]]:
    return list(getattr(strategy_of(ns), "thunder_modules", None) or [])


def _calls(obj: Any) -> int:
    from thunderviz.thunder.compile_state import call_count

    return call_count(obj)
