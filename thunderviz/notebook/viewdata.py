"""What the trace widgets show, computed from plain trace objects: no IPython, no ipywidgets, no browser.

The widgets are thin: every number, label, search hit, diff mark and ledger row a person sees is computed here
from the trace model (``thunderviz.trace``) and the DOT renderer (``thunderviz.render.graph``), so it can be tested
in plain Python and reused by the static (nbconvert/GitHub) view. The browser only lays out the DOT and handles
zoom, pan and clicks.

The subject a view shows (one jitted object on every rank) is a ``notebook.subject.Subject``; the Memory tab's data
is ``notebook.memory_tab``'s. Here: the graph panes, search, the ledger table and what a comparison says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from thunderviz.notebook.memory_tab import MemoryPanel, MemoryView
from thunderviz.notebook.subject import Subject, distinct_labels, snapshot_of
from thunderviz.render.graph import graph_view, short_op_name
from thunderviz.render.graph_groups import group_holding, op_summary
from thunderviz.render.graph_nodes import inner_node
from thunderviz.trace.diff import GroupChange, TraceDiff, diff_traces, group_changes, memory_changes, verdict
from thunderviz.trace.ledger import Ledger, find_mismatches
from thunderviz.trace.memory import largest_peak
from thunderviz.trace.model import TraceSnapshot

__all__ = [
    "DecisionRow",
    "LedgerPanel",
    "NodeMark",
    "PaneData",
    "Panels",
    "SearchHit",
    "changes_for",
    "compare_verdict",
    "diff_marks",
    "pane_data",
    "run_names",
    "search_ops",
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


class Panels(TypedDict, total=False):
    """The side panels: a trace view has ledger, decisions and memory (per-rank rows, and ``memory_view``); a
    comparison has diff and memory."""

    ledger: LedgerPanel
    decisions: list[DecisionRow]
    memory: MemoryPanel
    memory_view: MemoryView
    diff: DiffPanel


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


def op_counts(snapshot: TraceSnapshot) -> dict[str, int]:
    """Non-bookkeeping ops by short name, the ops that matter first (``render.graph_groups.op_summary``)."""
    return dict(op_summary([op for op in snapshot.ops if not op.is_bookkeeping]))
