"""What the trace widgets show, computed from plain trace objects: no IPython, no ipywidgets, no browser.

The widgets are thin: every number, label, search hit, diff mark and ledger row a person sees is computed here
from the trace model (``thunderviz.trace``) and the DOT renderer (``thunderviz.render.graph``), so it can be tested
in plain Python and reused by the static (nbconvert/GitHub) view. The browser only lays out the DOT and handles
zoom, pan and clicks.

``Subject`` is the one shape every accepted input is turned into: a saved trace file, a list of per-rank
``TraceBundle`` objects, one bundle, one ``TraceSnapshot``, a ``render.html.Report`` or the rank engine's
``RunReport``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from thunderviz.parallel.decisions import Decision
from thunderviz.render.graph import graph_view, group_holding, inner_node, op_summary, short_op_name
from thunderviz.render.memory_view import PEAK_NOTE, plan_bars, plan_predicted, plan_run_bars, run_bars
from thunderviz.trace.diff import GroupChange, TraceDiff, diff_traces, group_changes, memory_changes, verdict
from thunderviz.trace.file import bundle_from_dict, load
from thunderviz.trace.ledger import Ledger, find_mismatches, ledger_from_bundle
from thunderviz.trace.memory import MemoryEstimate, StepMemory, compare, largest_peak
from thunderviz.trace.model import TraceBundle, TraceSnapshot
from thunderviz.trace.saved import TRACE_SAVED, TRACE_SAVED_NOTE, SavedComparison, saved_by_group, saved_by_line

__all__ = [
    "MEMORY_COLUMNS",
    "DecisionRow",
    "LedgerPanel",
    "MemoryColumn",
    "MemoryPanel",
    "MemoryView",
    "NodeMark",
    "PaneData",
    "Panels",
    "SearchHit",
    "Subject",
    "changes_for",
    "compare_verdict",
    "diff_marks",
    "memory_panel",
    "memory_rows",
    "memory_view",
    "pane_data",
    "run_names",
    "search_ops",
    "subject_of",
    "trace_choices",
    "trace_names",
]

#: Search results sent to the browser; more would only slow the list down, the count is reported in full.
MAX_MATCHES = 200


# -- what goes to the browser (the widgets' synced traits): JSON, typed here so both ends read one shape -----------


class GroupRow(TypedDict):
    id: str
    name: str
    n_ops: int
    expanded: bool
    #: the modules its fusion regions run when they span several (``blocks.3 -> lm_head``: blocks.3, ln_f, lm_head)
    spans: list[str]


#: A node's outline in a comparison: ``status`` (``added``: only the second run has what it draws, ``removed``: only
#: the first, ``changed``: both, with other ops) and how many of its ops the diff tagged ``+``, ``-`` and ``~``.
NodeMark = TypedDict("NodeMark", {"status": str, "+": int, "-": int, "~": int})


class PaneData(TypedDict):
    """One graph pane (``pane_data``): the DOT, per-node details, groups and diff marks."""

    title: str
    prefix: str
    dot: str
    nodes: dict[str, dict[str, Any]]
    groups: list[GroupRow]
    marks: dict[str, NodeMark]
    n_ops: int
    n_collectives: int
    n_waits: int
    #: each module a fusion region spans -> the group it is drawn in (``ln_f`` -> ``blocks.3 -> lm_head``)
    holding: dict[str, str]


class SearchHit(TypedDict):
    index: int
    node: str
    group: str
    op: str
    label: str
    kind: str


class DecisionRow(TypedDict):
    """``Decision.to_dict()``: a decision as the browser shows it."""

    target: str
    case: str
    action: str
    reason: str
    clear_cache: bool
    strategy: str
    headline: str


class LedgerPanel(TypedDict):
    """Every rank's collectives side by side (``ledger_table``)."""

    ranks: list[int]
    rows: list[list[dict[str, Any] | None]]
    bad: list[int]
    mismatches: list[str]
    counts: dict[int, dict[str, int]]
    bytes: dict[int, int]


class DiffPanel(TypedDict):
    rows: list[dict[str, str]]
    total: int
    delta: dict[str, int]
    unchanged: int


class MemoryColumn(TypedDict):
    """One column of the memory panel: the row key it reads, the title a person reads, its unit (``bytes`` are
    formatted as KiB/MiB, ``count`` as a number) and where the number comes from (``estimated`` by thunder from
    the trace, ``measured`` on the rank). A later view (say, predicted vs measured peaks) adds columns, or draws the
    same rows as bars, without the front end learning new keys."""

    key: str
    title: str
    unit: str
    source: str


class MemoryPanel(TypedDict):
    """Per rank (and, in a comparison, per run): every column known for any rank, in ``columns`` order; a value
    missing on a rank is ``None`` (shown as "-"), never a silently short row."""

    columns: list[MemoryColumn]
    rows: list[dict[str, Any]]
    note: str


class MemoryView(TypedDict):
    """The Memory tab's picture (``memory_view``): stacked bars (``render.memory_view.MemoryBar.to_dict()``: each
    plan candidate predicted, each rank measured) against the budget, what forward saves for backward per group and
    per source line, and thunder against eager (``eager``: ``None`` unless a comparison was given)."""

    bars: list[dict[str, Any]]
    budget: int | None
    comparison: list[str]
    saved_by_group: list[dict[str, Any]]
    saved_by_line: list[dict[str, Any]]
    eager: dict[str, Any] | None


class Panels(TypedDict, total=False):
    """The side panels: a trace view has ledger, decisions and memory (per-rank rows, and ``memory_view``); a
    comparison has diff and memory."""

    ledger: LedgerPanel
    decisions: list[DecisionRow]
    memory: MemoryPanel
    memory_view: MemoryView
    diff: DiffPanel


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


def _ledger_rows(ledger: Ledger | None, label: str) -> dict[int, dict[str, Any]]:
    if ledger is None:
        return {}
    return {e.op_index: e.to_dict() for e in ledger.entries if e.trace == label}


def _attach_ledger(meta: dict[str, Any], rows: Mapping[int, dict[str, Any]]) -> None:
    if meta.get("kind") in ("collective", "wait") and meta.get("index") in rows:
        meta["ledger"] = rows[meta["index"]]
    for sub in meta.get("ops", ()):
        _attach_ledger(sub, rows)


def pane_data(
    snapshot: TraceSnapshot,
    *,
    expanded: Iterable[str] = (),
    ledger: Ledger | None = None,
    title: str = "",
    id_prefix: str = "",
    marks: Mapping[int, str] | None = None,
    changes: Mapping[str, GroupChange] | None = None,
    runs: tuple[str, str] = ("", ""),
) -> PaneData:
    """Everything one graph pane needs, as JSON: DOT, per-node details (with ledger rows), groups, diff marks.

    ``expanded`` holds group *names* (not ids) so one list can open the same block in both panes of a
    comparison; names this trace lacks are ignored. In a comparison, ``marks`` maps op index -> diff tag (``+``,
    ``-``, ``~``) and ``changes`` group name -> ``trace.diff.GroupChange``: a node is outlined by what it draws (an op
    by its tag, a block, bucket or open block's frame by its group's status, a collectives node by its group's
    communication), and its details carry the group's change with ``runs`` (the two runs' names) to say it in.
    """
    gv0 = graph_view(snapshot, title=title or snapshot.label, id_prefix=id_prefix)
    names = {g.name for g in gv0.groups}
    opened = [n for n in expanded if n in names]
    gv = graph_view(snapshot, opened, title=title or snapshot.label, id_prefix=id_prefix) if opened else gv0
    rows = _ledger_rows(ledger, snapshot.label)
    nodes = dict(gv.nodes)
    for g in gv.groups:
        if g.id in gv.expanded:  # the open block's frame: clicking it offers to collapse it again
            nodes[g.id] = {
                "kind": "cluster",
                "id": g.id,
                "name": g.name,
                "n_ops": len(g.ops) - len(g.compute) + len(g.work),
                "n_compute": len(g.work),  # a fusion region counts the ops it runs
            }
    for meta in nodes.values():
        _attach_ledger(meta, rows)
    node_marks: dict[str, NodeMark] = {}
    tags = {"+": "added", "-": "removed", "~": "changed"}
    for idx, tag in (marks or {}).items():
        nid = gv.node_of.get(idx)
        if nid is not None:
            mark = node_marks.setdefault(nid, NodeMark(status="", **{"+": 0, "-": 0, "~": 0}))
            mark[tag] += 1  # type: ignore[literal-required]
            if nid.startswith("op"):
                mark["status"] = tags[tag]
    for g in gv.groups:
        ch = (changes or {}).get(g.name)
        if ch is None:
            continue
        change = {**ch.to_dict(), "runs": list(runs)}
        parts = [(g.id, ch.status)] if g.id in gv.expanded or g.bucket is not None else [(g.id, ch.compute)]
        if g.id not in gv.expanded and g.bucket is None and f"{g.id}c" in nodes:
            parts.append((f"{g.id}c", ch.communication))
        for nid, status in parts:
            if nid in nodes:
                nodes[nid] = {**nodes[nid], "change": change}
            if status in ("added", "removed", "changed"):
                node_marks.setdefault(nid, NodeMark(status="", **{"+": 0, "-": 0, "~": 0}))["status"] = status
    return PaneData(
        title=title or snapshot.label,
        prefix=id_prefix,
        dot=gv.dot,
        nodes=nodes,
        groups=[
            GroupRow(id=g.id, name=g.name, n_ops=len(g.ops), expanded=g.id in gv.expanded, spans=g.spans)
            for g in gv.groups
        ],
        holding={m: h for g in gv.groups for m in g.spans if (h := group_holding(gv.groups, m)) is not None},
        marks={k: m for k, m in node_marks.items() if m["status"]},
        n_ops=len(snapshot.ops),
        n_collectives=sum(1 for op in snapshot.ops if op.is_collective),
        n_waits=sum(1 for op in snapshot.ops if op.is_wait),
    )


def search_ops(
    snapshot: TraceSnapshot, query: str, *, expanded: Iterable[str] = (), limit: int = MAX_MATCHES
) -> tuple[list[SearchHit], int]:
    """Ops whose name, tensor names (proxy or parameter names) or module contain ``query`` (case-insensitive).

    Returns up to ``limit`` hits (``{"index", "node", "group", "op", "label", "kind"}``; ``node`` is the drawn node
    that holds the op in the current expansion) and the total number of hits. Bookkeeping ops are skipped, as in
    the graph. A fusion region is searched op by op (``OpRecord.inner``): ``ln_f`` finds the ops of ``ln_f`` inside
    ``blocks.3 -> lm_head``, each drawn in the region's group, or as its own node when the group is open.
    """
    q = query.strip().lower()
    if not q:
        return [], 0
    gv = graph_view(snapshot, [n for n in expanded if n in {g.name for g in graph_view(snapshot).groups}])
    node_of = dict(gv.node_of)
    for g in gv.groups:  # an open group draws its regions' ops: each its own node
        for op in g.regions if g.id in gv.expanded else ():
            node_of.update({(op.index, k): inner_node(op, k) for k in range(len(op.inner))})
    group_of = {op.index: g.name for g in gv.groups for op in g.ops}
    bucket_of = {op.index: g.bucket for g in gv.groups if g.bucket is not None for op in g.ops}
    # A gathered parameter is found where it is used too: each unpacked result of a bucket is its parameter.
    pn = dict(snapshot.param_names)
    for b in snapshot.buckets:
        if b.kind == "all_gather" and len(b.results) == len(b.params):
            pn.update(zip(b.results, b.params, strict=True))
    hits: list[SearchHit] = []
    total = 0
    searched = [(op, op, None) for op in snapshot.ops if op.index in node_of]  # a region by its name too
    searched += [(i, op, k) for op in snapshot.ops if op.index in node_of for k, i in enumerate(op.inner)]
    searched.sort(key=lambda x: (x[1].index, -1 if x[2] is None else x[2]))
    for op, drawn, k in searched:
        if op.is_bookkeeping:
            continue
        tensors = [t.name for t in (*op.inputs, *op.outputs)]
        names = tensors + [pn[t] for t in tensors if t in pn]
        hay = [op.op.lower(), short_op_name(op.op).lower(), (op.module or "").lower()] + [n.lower() for n in names]
        if not any(q in h for h in hay):
            continue
        total += 1
        if len(hits) >= limit:
            continue
        named = [pn[t] for t in tensors if t in pn]
        shown = next((n for n in named if q in n.lower()), None) or next(iter(named), None) or (op.module or "")
        bucket = bucket_of.get(drawn.index) if k is None else None
        if bucket is not None and not (q in shown.lower() and shown in bucket.params):
            shown = bucket.short_name  # a bucket's op by the bucket's short name, not its first parameter
        kind = "collective" if op.is_collective else "wait" if op.is_wait else "op"
        hits.append(
            SearchHit(
                index=drawn.index,
                node=node_of.get((drawn.index, k), node_of[drawn.index]),
                group=group_of.get(drawn.index, ""),
                op=short_op_name(op.op),
                label=f"{short_op_name(op.op)} {shown}".strip(),
                kind=kind,
            )
        )
    return hits, total


def diff_marks(diff: TraceDiff) -> tuple[dict[int, str], dict[int, str]]:
    """Op index -> tag for each side of a diff: a's removed/changed ops, b's added/changed ops."""
    a: dict[int, str] = {}
    b: dict[int, str] = {}
    for row in diff.rows:
        if row.tag == "=":
            continue
        if row.a is not None:
            a[row.a.index] = row.tag
        if row.b is not None:
            b[row.b.index] = row.tag
    return a, b


def compare_terms(a: Subject, b: Subject, label: str, diff: TraceDiff) -> list[str]:
    """What changed, clause by clause, empty ones left out: the trace's structure (``TraceDiff.summary_parts``:
    collectives, other ops, and whatever kinds of change it learns to name), then memory (saved for backward, the
    estimated peak of this trace: ``trace.diff.memory_changes``)."""
    return diff.summary_parts() + memory_changes(a.primary, b.primary, label)


def compare_header(a: Subject, b: Subject, label: str, diff: TraceDiff) -> str:
    """``zero2: FSDP ZERO2 BLOCK → zero3: FSDP ZERO3 BLOCK (backward): +4 all_gather, +4 wait; other ops +44;
    saved for backward 218.1 KiB -> 178.3 KiB``."""
    la, lb = distinct_labels(a, b)
    return f"{la} \u2192 {lb} ({label}): {'; '.join(compare_terms(a, b, label, diff)) or 'no differences'}"


def diff_for(a: Subject, b: Subject, label: str) -> TraceDiff:
    return diff_traces(snapshot_of(a.primary, label), snapshot_of(b.primary, label))


def changes_for(a: Subject, b: Subject, label: str, diff: TraceDiff | None = None) -> dict[str, GroupChange]:
    """Group name -> ``GroupChange`` between the two sides' trace ``label`` (what the outlines and clicks say)."""
    return group_changes(snapshot_of(a.primary, label), snapshot_of(b.primary, label), diff)


def run_names(a: Subject, b: Subject) -> tuple[str, str]:
    """Short names for the two runs, for a sentence: the cell's ``--name`` (``zero3``), else the label; told apart
    by ``(left)``/``(right)`` when they read the same."""
    na, nb = a.run or a.label, b.run or b.label
    return (f"{na} (left)", f"{nb} (right)") if na == nb else (na, nb)


def compare_verdict(a: Subject, b: Subject) -> str:
    """The comparison's one sentence (``trace.diff.verdict``): bytes sent per step, why, and the runs' measured step
    peaks (each its largest rank's, as every table says it) when both measured one (else the predicted one, else
    what forward's trace hands to backward)."""
    na, nb = run_names(a, b)
    memory = None
    ma, mb = largest_peak(a.step_memory), largest_peak(b.step_memory)
    if ma is not None and mb is not None:
        memory = ("step peak (measured)", ma[1].peak_bytes, mb[1].peak_bytes)
    elif a.prediction is not None and b.prediction is not None:
        memory = ("step peak (predicted)", a.prediction.peak_bytes, b.prediction.peak_bytes)
    return verdict(a.primary, b.primary, na, nb, memory)


def ledger_table(subject: Subject) -> LedgerPanel:
    """Every rank's collectives (waits left out) side by side, and the mismatch messages."""
    ranks = sorted(subject.ledgers)
    per_rank = {r: subject.ledgers[r].collectives() for r in ranks}
    n = max((len(v) for v in per_rank.values()), default=0)
    rows = []
    for i in range(n):
        cells = []
        for r in ranks:
            e = per_rank[r][i] if i < len(per_rank[r]) else None
            cells.append(None if e is None else e.to_dict())
        rows.append(cells)
    bad_positions = set()
    for m in find_mismatches(subject.ledgers) if len(ranks) > 1 else []:
        bad_positions.add(m.position)
    return LedgerPanel(
        ranks=ranks,
        rows=rows,
        bad=sorted(bad_positions),
        mismatches=subject.mismatches(),
        counts={r: subject.ledgers[r].counts() for r in ranks},
        bytes={r: subject.ledgers[r].sent_bytes() for r in ranks},
    )


#: The memory panel's columns, in the order shown; a column appears when any rank has its number.
MEMORY_COLUMNS: tuple[MemoryColumn, ...] = (
    MemoryColumn(key="measured_step_peak", title="step peak, measured", unit="bytes", source="measured"),
    MemoryColumn(key="predicted_step_peak", title="step peak, predicted", unit="bytes", source="predicted"),
    MemoryColumn(key="est_peak_forward", title="trace estimate, forward", unit="bytes", source="estimated"),
    MemoryColumn(key="est_peak_backward", title="trace estimate, backward", unit="bytes", source="estimated"),
    MemoryColumn(key="saved_for_backward", title=TRACE_SAVED, unit="bytes", source="estimated"),
    MemoryColumn(key="recomputed_ops", title="recomputed ops", unit="count", source="estimated"),
    MemoryColumn(key="kept_for_accumulation", title="kept for accumulation", unit="bytes", source="estimated"),
    MemoryColumn(key="rss_bytes", title="process RSS", unit="bytes", source="measured"),
    MemoryColumn(key="cuda_max_allocated_bytes", title="CUDA peak allocated", unit="bytes", source="measured"),
    MemoryColumn(key="cuda_allocated_bytes", title="CUDA allocated now", unit="bytes", source="measured"),
)
MEMORY_NOTE = (
    f"Step peak: {PEAK_NOTE} {TRACE_SAVED_NOTE} Trace estimate: thunder's get_alloc_memory of one trace's"
    " intermediates, not a step peak. Process RSS is not tensor memory."
)


def memory_rows(subject: Subject) -> list[dict[str, Any]]:
    """Per rank: thunder's estimated peak per trace and what forward saves for backward, plus whatever the rank
    engine measured (``MEMORY_COLUMNS`` keys)."""
    out = []
    for r in sorted(set(subject.bundles) | set(subject.memory)):
        b = subject.bundles.get(r)
        row: dict[str, Any] = {"rank": r}
        if b is not None:
            row.update({f"est_peak_{k}": v for k, v in b.memory.items()})
            if b.backward is not None:
                row["saved_for_backward"] = b.saved_for_backward["bytes"]
                if b.backward.recomputed_ops:
                    row["recomputed_ops"] = b.backward.recomputed_ops
            if b.accumulated_gradients["bytes"]:
                row["kept_for_accumulation"] = b.accumulated_gradients["bytes"]
        for k, v in subject.memory.get(r, {}).items():
            if isinstance(v, (int, float, str)) or v is None:
                row[k] = v
        measured = subject.step_memory.get(r)
        if measured is not None and measured.peak_bytes is not None:
            row["measured_step_peak"] = measured.peak_bytes
        if subject.prediction is not None:
            row["predicted_step_peak"] = subject.prediction.peak_bytes
        out.append(row)
    return out


def memory_panel(rows: Sequence[dict[str, Any]], *, lead: Sequence[MemoryColumn] = ()) -> MemoryPanel:
    """``memory_rows`` as the panel shows them: the known columns any row fills (plus ``lead`` columns first, e.g.
    a comparison's run), every row filled out with ``None`` where its rank has no number."""
    known = {c["key"] for c in MEMORY_COLUMNS}
    present = {k for r in rows for k, v in r.items() if v is not None}
    columns = [*lead, *(c for c in MEMORY_COLUMNS if c["key"] in present)]
    extra = sorted(present - known - {"rank"} - {c["key"] for c in lead})
    columns += [MemoryColumn(key=k, title=k.replace("_", " "), unit="", source="measured") for k in extra]
    full = [{"rank": r["rank"], **{c["key"]: r.get(c["key"]) for c in columns}} for r in rows]
    return MemoryPanel(columns=columns, rows=full, note=MEMORY_NOTE)


def memory_view(subject: Subject, plan: Any = None, saved_vs_eager: SavedComparison | None = None) -> MemoryView:
    """The Memory tab: the plan's candidates and the measured ranks as bars, saved tensors, thunder vs eager.

    ``plan`` is a ``thunderviz.plan(...)`` result (read by attribute); ``saved_vs_eager`` a
    ``thunder.memory.saved_compare.compare_saved(...)`` result.
    """
    if plan_predicted(plan, subject.prediction):
        bars = [b.to_dict() for b in plan_run_bars(plan, subject.step_memory, subject.prediction_name)]
    else:
        bars = [b.to_dict() for b in plan_bars(plan)] if plan is not None else []
        bars += [b.to_dict() for b in run_bars(subject.step_memory, subject.prediction, subject.prediction_name)]
    comparison = []
    if subject.prediction is not None:
        for rank, measured in sorted(subject.step_memory.items()):
            cmp = compare(subject.prediction, measured)
            if cmp is not None:
                comparison.append(f"rank {rank}: {cmp.summary()}")
    forward = subject.primary.forward
    eager = None
    if saved_vs_eager is not None:
        eager = {
            "summary": saved_vs_eager.summary(),
            "lines": [
                {
                    "line": c.line,
                    "code": c.code,
                    "thunder_bytes": c.thunder_bytes,
                    "eager_bytes": c.eager_bytes,
                    "extra": c.extra,
                    "thunder": list(c.thunder),
                    "eager": list(c.eager),
                }
                for c in saved_vs_eager.lines
            ],
        }
    return MemoryView(
        bars=bars,
        budget=getattr(plan, "memory_per_rank", None) if plan is not None else None,
        comparison=comparison,
        saved_by_group=[{"key": r.key, "tensors": r.tensors, "bytes": r.bytes} for r in saved_by_group(forward)],
        saved_by_line=[
            {"key": r.key, "code": r.code, "tensors": r.tensors, "bytes": r.bytes} for r in saved_by_line(forward)
        ],
        eager=eager,
    )


def op_counts(snapshot: TraceSnapshot) -> dict[str, int]:
    """Non-bookkeeping ops by short name, the ops that matter first (``render.graph.op_summary``)."""
    return dict(op_summary([op for op in snapshot.ops if not op.is_bookkeeping]))
