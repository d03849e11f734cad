"""Property test: no file, however malformed or hostile, gets past ``load`` as anything but ``TraceFormatError``,
and every file ``load`` accepts can be drawn (DOT, the HTML report, the widgets' view data) without an exception.

Three kinds of generated file, 2,000 examples in all, derandomized so CI sees the same files every run:
random bytes; random JSON (bare or inside a valid envelope); and mutations of real saved traces (the small FSDP
and DDP files kept in ``tests/trace/data``): a field replaced by a value of another type, by a value of the same type
that makes no sense (an edge to another op, a tensor renamed after another one, a collective kind swapped, markup
in a name), a key dropped, list elements duplicated, dropped or swapped, an op copied, dropped or moved with the
trace renumbered (two waits on one future), bytes flipped or cut off. At least a third of the mutated files must
pass ``load``, so the renderer, not only the validator, is what gets exercised.
No thunder is imported: this is what opening a colleague's file on a laptop does.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.trace_scenarios import SMALL_TRACE_FILES
from thunderviz.errors import TraceFormatError
from thunderviz.notebook import viewdata as vd
from thunderviz.notebook.memory_tab import memory_rows
from thunderviz.notebook.subject import snapshot_of, subject_of, trace_choices
from thunderviz.render.graph import graph_view, to_dot
from thunderviz.render.html import render_html
from thunderviz.trace.attribution import assign_modules
from thunderviz.trace.file import FORMAT_NAME, FORMAT_VERSION, load
from thunderviz.trace.ledger import ledger_from_bundle
from thunderviz.trace.model import COLLECTIVE_KINDS, TENSOR_KINDS

pytestmark = pytest.mark.timeout(300)


def _settings(n: int) -> settings:
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )


def load_and_render(path: Path) -> bool:
    """Everything a person can do with a trace file; any exception but the one ``load`` documents fails the test.
    Returns whether ``load`` accepted the file (and so whether the renderer saw it)."""
    try:
        bundles = load(path)
    except TraceFormatError as e:
        assert e.file == str(path) and str(path) in str(e)  # noqa: PT017 - the message must name the file
        return False
    render_html(bundles, svg=False)
    for b in bundles:
        ledger_from_bundle(b)
        for snap in (*b.traces().values(), *b.stages):
            view = graph_view(snap)
            to_dot(snap, expand=[g.name for g in view.groups[:2]], title=b.name)
    subjects = []
    for name in dict.fromkeys(b.name for b in bundles):
        subj = subject_of(bundles, name=name)
        subjects.append(subj)
        for label in trace_choices(subj.primary):
            snap = snapshot_of(subj.primary, label)
            opened = [g.name for g in graph_view(snap).groups[:1]]
            pane = vd.pane_data(snap, expanded=opened, ledger=subj.ledgers.get(subj.primary.rank), title=label)
            json.dumps(pane, allow_nan=False)  # what the widget sends to the browser must be plain JSON
            vd.search_ops(snap, "a", expanded=opened)
        json.dumps([vd.ledger_table(subj), memory_rows(subj), subj.mismatches()], allow_nan=False)
    for a, b in itertools.pairwise(subjects):
        for label in set(trace_choices(a.primary)) & set(trace_choices(b.primary)):
            d = vd.diff_for(a, b, label)
            vd.diff_marks(d)
            vd.compare_header(a, b, label, d)
            d.to_text()
    for b in bundles:  # what capture does after reading thunder, on whatever the file says
        assign_modules(b.forward, b.backward)
        graph_view(b.forward)
    return True


def _write(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> Path:
    path = tmp_path_factory.getbasetemp() / "generated.json"
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------------------------- random input

NASTY_STRINGS = [
    "",
    "<script>alert(1)</script>",
    "\ud800",
    "\x00\x1b[31m",
    'a"b\\N\nc',
    "\u202e",
    "x" * 5000,
    "forward",
    "backward",
    "blocks.0",
    "@f.py:1",
    "(root)",
    "g0",
    "op1",
    "t0",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(NASTY_STRINGS)
)
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4), max_leaves=24
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8")


@_settings(300)
@given(st.binary(max_size=400))
def test_random_bytes(tmp_path_factory, data):
    load_and_render(_write(tmp_path_factory, data))


@_settings(700)
@given(json_values, st.sampled_from(["bare", "envelope", "bundle"]))
def test_random_json(tmp_path_factory, value, shape):
    if shape == "envelope":
        value = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "bundles": value}
    elif shape == "bundle":
        value = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "bundles": [value]}
    load_and_render(_write(tmp_path_factory, _dumps(value)))


# ---------------------------------------------------------------------------------------------- mutations of real files


def _real_docs() -> list[dict]:
    """Small but real documents: each kept file's DDP bundle, its FSDP bundle with two stages, and both together."""
    out = []
    for path in SMALL_TRACE_FILES:
        doc = json.loads(path.read_text(encoding="utf-8"))
        fsdp, ddp = doc["bundles"]
        fsdp_two_stages = {**fsdp, "stages": fsdp["stages"][:2]}
        for bundles in ([ddp], [fsdp_two_stages], [{**fsdp, "stages": []}, ddp]):
            out.append({**doc, "bundles": copy.deepcopy(bundles)})
    return out


REAL_DOCS = _real_docs()
#: Each document as JSON text: a fresh copy to mutate is ``json.loads`` of it (plain JSON data; several times
#: faster than ``copy.deepcopy``, which took a third of this file's time).
REAL_DOCS_JSON = [json.dumps(d) for d in REAL_DOCS]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


PATHS = [_paths(d) for d in REAL_DOCS]
NAMES = sorted(
    {
        t["name"]
        for d in REAL_DOCS
        for b in d["bundles"]
        for op in b["forward"]["ops"]
        for t in op["inputs"] + op["outputs"]
    }
)


def _get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def same_type_nonsense(draw: st.DrawFn, current: Any) -> Any:
    """A value of the type the field already has, chosen to make no sense where it lands."""
    if isinstance(current, bool):
        return not current
    if isinstance(current, int):
        return draw(st.integers(min_value=0, max_value=40) | st.sampled_from([0, 1, 2**31, 2**62]))
    if isinstance(current, str):
        return draw(
            st.sampled_from(NAMES)
            | st.sampled_from(NASTY_STRINGS)
            | st.sampled_from(COLLECTIVE_KINDS)
            | st.sampled_from(TENSOR_KINDS)
            | st.text(max_size=6)
        )
    if current is None:
        return draw(st.sampled_from(COLLECTIVE_KINDS) | st.integers(0, 8) | st.just("blocks.1"))
    if isinstance(current, list) and current:
        items = list(current)
        how = draw(st.sampled_from(["drop", "dup", "swap", "reverse", "clear"]))
        i = draw(st.integers(0, len(items) - 1))
        j = draw(st.integers(0, len(items) - 1))
        if how == "drop":
            del items[i]
        elif how == "dup":
            items.insert(j, copy.deepcopy(items[i]))
        elif how == "swap":
            items[i], items[j] = items[j], items[i]
        elif how == "reverse":
            items.reverse()
        else:
            items = []
        return items
    if isinstance(current, dict) and current:
        key = draw(st.sampled_from(sorted(current)))
        out = dict(current)
        del out[key]
        return out
    return draw(json_values)


OPTIONAL_KEYS = {
    "source",
    "python",
    "collective",
    "group_size",
    "module",
    "edges",
    "arg_names",
    "return_names",
    "param_names",
    "peak_memory_bytes",
    "backward",
    "stages",
    "versions",
    "kind",
    "dtype",
    "device",
    "shape",
    "inputs",
    "outputs",
    "code",
    "label",
}
FREE_TEXT = {"name", "module", "label", "python", "code", "file", "dtype", "device", "symbol_id", "op"}
SHORT_NASTY = st.sampled_from([s for s in NASTY_STRINGS if len(s) < 100 and s != "\ud800"])


def _snapshot_of_path(doc: Any, path: tuple) -> Any:
    """The snapshot (forward, backward or a stage) that ``path`` points into, if any."""
    for cut in range(len(path), 0, -1):
        node = _get(doc, path[:cut])
        if isinstance(node, dict) and "ops" in node and isinstance(node.get("ops"), list):
            return node
    return None


@st.composite
def sensible_nonsense(draw: st.DrawFn, doc: Any, path: tuple) -> tuple[tuple, Any] | None:
    """A value that passes validation but means something else: the renderer must cope with what it says."""
    current = _get(doc, path)
    key = path[-1] if path else None
    parent_key = path[-2] if len(path) > 1 else None
    snap = _snapshot_of_path(doc, path)
    n_ops = len(snap["ops"]) if snap else 0
    if key in FREE_TEXT and isinstance(current, str):
        text = st.sampled_from(NAMES) | SHORT_NASTY | st.sampled_from(COLLECTIVE_KINDS) | st.text(max_size=6)
        return path, draw(text)
    if key == "kind":
        return path, draw(st.sampled_from(TENSOR_KINDS))
    if key == "collective":
        return path, draw(st.none() | st.sampled_from(COLLECTIVE_KINDS))
    if key == "group_size":
        return path, draw(st.none() | st.integers(1, 4))
    if parent_key == "shape" or key == "peak_memory_bytes":
        return path, draw(st.integers(0, 64) | st.just(2**40))
    if key == "shape":
        return path, draw(st.none() | st.lists(st.integers(0, 9), max_size=4))
    if "edges" in path and isinstance(current, int) and n_ops:
        return path, draw(st.integers(0, n_ops - 1))
    if key == "rank":
        return path, draw(st.integers(0, _get(doc, path[:-1])["world_size"] - 1))
    if key == "world_size":
        return path, current + draw(st.integers(0, 3))
    if key == "param_names":
        return path, draw(st.dictionaries(st.sampled_from(NAMES), SHORT_NASTY | st.sampled_from(NAMES), max_size=6))
    if key in ("arg_names", "return_names"):
        name = st.sampled_from(NAMES)
        return path, draw(st.lists(name | st.none() if key == "return_names" else name, max_size=8))
    if key in ("inputs", "outputs", "edges", "stages", "bundles") and isinstance(current, list) and current:
        return path, draw(same_type_nonsense(current))
    if isinstance(current, dict) and current:
        optional = sorted(k for k in current if k in OPTIONAL_KEYS)
        if optional:
            out = dict(current)
            del out[draw(st.sampled_from(optional))]
            return path, out
    return None


def _snapshots(doc: Any) -> list[dict]:
    out = []
    bundles = doc.get("bundles") if isinstance(doc, dict) else None
    for b in bundles if isinstance(bundles, list) else []:  # an earlier edit may have made it any JSON value
        if isinstance(b, dict):
            out += [s for s in (b.get("forward"), b.get("backward"), *(b.get("stages") or [])) if isinstance(s, dict)]
    return [s for s in out if isinstance(s.get("ops"), list) and s["ops"] and isinstance(s.get("edges"), list)]


@st.composite
def op_level_edit(draw: st.DrawFn, doc: Any) -> None:
    """Copy, drop or move an op and renumber the trace, edges included: a valid file whose data flow is odd (two
    waits on one future, a collective without its wait, a use before its definition)."""
    snaps = _snapshots(doc)
    if not snaps:
        return
    snap = draw(st.sampled_from(snaps))
    ops = snap["ops"]
    if not all(isinstance(o, dict) for o in ops):
        return
    i = draw(st.integers(0, len(ops) - 1))
    j = draw(st.integers(0, len(ops)))
    how = draw(st.sampled_from(["copy", "drop", "move"]))
    old_pos = list(range(len(ops)))
    if how == "copy":
        ops.insert(j, copy.deepcopy(ops[i]))
        old_pos.insert(j, None)
    elif how == "drop":
        del ops[i]
        del old_pos[i]
    else:
        ops.insert(j, ops.pop(i))
        old_pos.insert(j, old_pos.pop(i))
    new_of = {old: new for new, old in enumerate(old_pos) if old is not None}
    for n, op in enumerate(ops):
        op["index"] = n
    edges = []
    for e in snap["edges"]:
        if isinstance(e, list) and len(e) == 3 and all(type(x) is int and x in new_of for x in e[:2]):
            edges.append([new_of[e[0]], new_of[e[1]], e[2]])
    snap["edges"] = edges


@st.composite
def mutated_files(draw: st.DrawFn) -> bytes:
    k = draw(st.integers(0, len(REAL_DOCS) - 1))
    doc = json.loads(REAL_DOCS_JSON[k])
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 3)) == 0:
            draw(op_level_edit(doc))
            continue
        # an index, not sampled_from(PATHS[k]): that strategy hashes all ~10,000 paths on every draw to label itself
        path = PATHS[k][draw(st.integers(0, len(PATHS[k]) - 1))]
        try:
            current = _get(doc, path)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed it
        how = draw(st.sampled_from(["sensible"] * 5 + ["same-type"] * 2 + ["other-type", "nasty"]))
        if how == "sensible":
            edit = draw(sensible_nonsense(doc, path))
            if edit is None:
                continue
            path, new = edit
        elif how == "same-type":
            new = draw(same_type_nonsense(current))
        elif how == "other-type":
            new = draw(json_values)
        else:
            new = draw(st.sampled_from([-1, 2**63, 1e308, 3.5, True, None, "", [], {}, [[[[[]]]]], "\ud800"]))
        if not path:
            doc = new
            continue
        _get(doc, path[:-1])[path[-1]] = new
    data = _dumps(doc)
    if draw(st.integers(0, 9)) == 0:  # now and then, damage the bytes too
        at = draw(st.integers(0, len(data)))
        data = draw(st.sampled_from([data[:at], data[:at] + b"\xff" + data[at:], data[:at] + data[at + 1 :]]))
    return data


def test_mutated_real_files(tmp_path_factory):
    """1,000 mutated files, each loaded and drawn; and, so that the test does not only ever exercise the validator,
    at least a third of them must load and reach the renderer (counted over the same files: a separate count of
    150 more files cost 5 s)."""
    loaded: list[bool] = []

    @_settings(1000)
    @given(mutated_files())
    def each(data: bytes) -> None:
        loaded.append(load_and_render(_write(tmp_path_factory, data)))

    each()
    assert loaded and sum(loaded) >= len(loaded) / 3, f"only {sum(loaded)} of {len(loaded)} mutated files loaded"
