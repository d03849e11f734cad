"""Which jitted object a trace view shows, on every rank: ``Subject``, and every accepted input turned into one.

A widget accepts a saved trace file, a list of per-rank ``TraceBundle`` objects, one bundle, one ``TraceSnapshot``, a
``render.html.Report`` or the rank engine's ``RunReport``; ``subject_of`` turns each into the one shape the views
read (``notebook.viewdata``, ``notebook.memory_tab``), with the run's name, its strategy and its measured memory
when the input knows them. The trace menu's choices and names (``trace_choices``, ``trace_names``) are read here
too. No IPython, no ipywidgets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from thunderviz.parallel.decisions import Decision
from thunderviz.trace.file import bundle_from_dict, load
from thunderviz.trace.ledger import Ledger, find_mismatches, ledger_from_bundle
from thunderviz.trace.memory import MemoryEstimate, StepMemory
from thunderviz.trace.model import TraceBundle, TraceSnapshot

__all__ = ["Subject", "distinct_labels", "snapshot_of", "subject_of", "trace_choices", "trace_names"]


@dataclass
class Subject:
    """One jitted object as seen on every rank: what a trace view or one side of a comparison shows.

    ``title`` is the jitted object's name (``TinyGPT``); ``run`` the cell's name (``--name zero2``) and ``config``
    the strategy configuration (``FSDP ZERO2 BLOCK``) when known, which ``label`` puts first so that two runs of
    one model read apart. ``bundles`` maps rank -> bundle (the lowest rank is drawn); ``ledgers`` rank ->
    collectives ledger; ``decisions`` are the strategies' jit decisions (``parallel.decisions.Decision``) when
    known; ``memory`` rank -> extra measured memory (the rank engine's RSS/CUDA numbers) when known;
    ``step_memory`` rank -> the measured step peak and ``prediction`` the plan's estimate a run report carries
    (``--plan``).
    """

    title: str
    bundles: dict[int, TraceBundle]
    ledgers: dict[int, Ledger] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    memory: dict[int, dict[str, Any]] = field(default_factory=dict)
    run: str = ""
    config: str = ""
    step_memory: dict[int, StepMemory] = field(default_factory=dict)
    prediction: MemoryEstimate | None = None
    prediction_name: str = ""

    @property
    def primary(self) -> TraceBundle:
        return self.bundles[min(self.bundles)]

    @property
    def label(self) -> str:
        """What a view calls this run: ``zero2: FSDP ZERO2 BLOCK``; the object's name when nothing else is known."""
        config = self.config or next((d.strategy for d in self.decisions if d.strategy), "")
        if self.run and config:
            return f"{self.run}: {config}"
        return self.run or config or self.title

    @property
    def heading(self) -> str:
        """``zero2: FSDP ZERO2 BLOCK · TinyGPT``: the run and the object (just the object when they coincide)."""
        return self.title if self.label == self.title else f"{self.label} \u00b7 {self.title}"

    def mismatches(self) -> list[str]:
        """Cross-rank disagreement messages (empty when the ranks agree or only one rank is known)."""
        if len(self.ledgers) < 2:
            return []
        return [m.message for m in find_mismatches(self.ledgers)]


def _pick(named: Mapping[str, Any], name: str | None, what: str) -> str:
    if name is not None:
        if name not in named:
            raise ValueError(f"{what}: no traced object named {name!r}; it has {sorted(named)!r}")
        return name
    if len(named) != 1:
        raise ValueError(f"{what} holds {len(named)} traced objects ({sorted(named)!r}); pass name=... to pick one")
    return next(iter(named))


def _from_bundles(bundles: Sequence[TraceBundle], name: str | None, what: str) -> Subject:
    by_name: dict[str, list[TraceBundle]] = {}
    for b in bundles:
        if not isinstance(b, TraceBundle):
            raise TypeError(f"{what}: expected TraceBundle objects (capture() or load()), got {type(b).__name__}")
        by_name.setdefault(b.name, []).append(b)
    if not by_name:
        raise ValueError(f"{what}: no traces in it")
    chosen = _pick(by_name, name, what)
    per_rank = {b.rank: b for b in by_name[chosen]}
    return Subject(title=chosen, bundles=per_rank, ledgers={r: ledger_from_bundle(b) for r, b in per_rank.items()})


def subject_of(obj: Any, name: str | None = None) -> Subject:
    """Turn anything the widgets accept into a ``Subject``.

    Accepts a ``Subject``, a ``TraceBundle``, a ``TraceSnapshot``, a path to a file written by
    ``trace.file.save``, a list of bundles and/or paths (one per rank is usual), ``render.html.Report`` and the
    rank engine's ``RunReport`` (anything with ``bundles``; a ``RunReport`` also brings its decisions, every
    rank's ledger and memory). ``name`` picks one jitted object when the input holds several.
    """
    what = f"{type(obj).__name__} input"
    if isinstance(obj, Subject):
        return obj
    if isinstance(obj, TraceSnapshot):
        bundle = TraceBundle(name=obj.label or "trace", rank=0, world_size=1, forward=obj)
        return Subject(title=bundle.name, bundles={0: bundle}, ledgers={0: ledger_from_bundle(bundle)})
    if isinstance(obj, TraceBundle):
        return _from_bundles([obj], name, what)
    if isinstance(obj, (str, os.PathLike)):
        return _from_bundles(load(obj), name, f"trace file {os.fspath(obj)!r}")
    if isinstance(obj, (list, tuple)):
        flat: list[TraceBundle] = []
        for item in obj:
            flat.extend(load(item) if isinstance(item, (str, os.PathLike)) else [item])
        return _from_bundles(flat, name, "list input")
    bundles = getattr(obj, "bundles", None)
    if isinstance(bundles, Mapping):  # the rank engine's RunReport: rank 0's bundles by name + per-rank ledgers
        chosen = _pick(bundles, name, what)
        b = bundles[chosen]
        b = b if isinstance(b, TraceBundle) else bundle_from_dict(b, path=f"bundles[{chosen!r}]")
        per_rank = {b.rank: b}
        for rank, objs in (getattr(obj, "bundles_by_rank", None) or {}).items():  # every rank's, for its memory
            other = objs.get(chosen)
            if other is not None:
                other = other if isinstance(other, TraceBundle) else bundle_from_dict(other, path=f"rank {rank}")
                per_rank.setdefault(int(rank), other)
        raw_ledgers = (getattr(obj, "ledgers", None) or {}).get(chosen, {})
        ledgers = {int(r): (lg if isinstance(lg, Ledger) else Ledger.from_dict(lg)) for r, lg in raw_ledgers.items()}
        ledgers = ledgers or {b.rank: ledger_from_bundle(b)}
        decisions = list(getattr(obj, "decisions", None) or [])
        memory = {int(r): dict(m) for r, m in (getattr(obj, "memory", None) or {}).items()}
        return Subject(
            title=chosen,
            bundles=dict(sorted(per_rank.items())),
            ledgers=ledgers,
            decisions=decisions,
            memory=memory,
            run=str(getattr(obj, "name", "") or ""),
            config=_config_of(getattr(obj, "strategy", None)),
            step_memory={int(r): m for r, m in (getattr(obj, "step_memory", None) or {}).items()},
            prediction=getattr(obj, "prediction", None),
            prediction_name=getattr(obj, "prediction_name", ""),
        )
    if isinstance(bundles, Sequence):  # render.html.Report
        subj = _from_bundles(list(bundles), name, what)
        subj.decisions = list(getattr(obj, "decisions", None) or [])
        return subj
    raise TypeError(
        f"thunderviz widgets show traces; got {type(obj).__name__}. Pass a TraceBundle (thunderviz.capture(jitted)),"
        " a list of them (one per rank), a saved trace file's path, or a run report."
    )


def _config_of(strategy: Any) -> str:
    """``FSDP ZERO2 BLOCK`` from a run report's ``StrategySpec`` (its options' summary), else its description."""
    if strategy is None:
        return ""
    options = getattr(strategy, "options", None)
    if options is not None:
        return options.summary()
    describe = getattr(strategy, "describe", None)
    return describe() if callable(describe) else str(strategy)


def distinct_labels(a: Subject, b: Subject) -> tuple[str, str]:
    """The two sides' labels, told apart by ``(left)``/``(right)`` when they read the same."""
    la, lb = a.label, b.label
    return (f"{la} (left)", f"{lb} (right)") if la == lb else (la, lb)


def _stage_keys(bundle: TraceBundle) -> dict[str, int]:
    """Each captured stage's menu key -> its index: its label, with `` (2)``, `` (3)`` for a label thunder used
    before (it runs "Delete Last Used" twice; keyed by label alone, the menu skipped the last pass)."""
    keys: dict[str, int] = {}
    seen: dict[str, int] = {}
    for i, s in enumerate(bundle.stages):
        seen[s.label] = seen.get(s.label, 0) + 1
        key = s.label if seen[s.label] == 1 else f"{s.label} ({seen[s.label]})"
        if key not in keys and key not in ("forward", "backward"):
            keys[key] = i
    return keys


def trace_choices(bundle: TraceBundle) -> list[str]:
    """Labels a view can switch between: ``forward``, ``backward``, then each captured stage."""
    return [*bundle.traces(), *_stage_keys(bundle)]


def trace_names(bundle: TraceBundle) -> dict[str, str]:
    """What the trace menu shows for each label: the traces that run, then thunder's forward passes in order, by
    number and name (``forward pass 4 of 7: Dead Code Elimination``) rather than bare pass names."""
    names = {"forward": "forward (the trace that runs)", "backward": "backward (the trace that runs)"}
    n = len(bundle.stages)
    for key, i in _stage_keys(bundle).items():
        names[key] = f"forward pass {i + 1} of {n}: {bundle.stages[i].label}"
    return {c: names[c] for c in trace_choices(bundle)}


def snapshot_of(bundle: TraceBundle, label: str) -> TraceSnapshot:
    traces = bundle.traces()
    if label in traces:
        return traces[label]
    i = _stage_keys(bundle).get(label)
    if i is not None:
        return bundle.stages[i]
    raise ValueError(f"no trace {label!r} in {bundle.name!r}; choose from {trace_choices(bundle)!r}")
