"""The trace file format: versioned JSON, written atomically, read back only after every field is checked.

A trace file is input from elsewhere (another rank, another machine, a colleague, an attacker), and what it holds
ends up in graph labels, HTML pages and a browser widget. So ``load`` builds each object through the typed readers
of ``thunderviz.trace.validate`` and checks, before anything is drawn:

- the file: at most ``MAX_FILE_BYTES`` (128 MiB; pass ``max_bytes=`` or set ``THUNDERVIZ_MAX_TRACE_FILE_BYTES`` to
  open a bigger trusted file), UTF-8, JSON without ``NaN``, duplicate keys or nesting deeper than 24 levels;
- the envelope: ``{"format": "thunderviz.traces", "version": 1, "bundles": [...]}``;
- every field's type, and ranges: ranks in ``[0, world_size)``, non-negative shape dimensions and memory, op
  ``index`` equal to its position, edges between existing ops, collective and tensor kinds from the model's own
  lists, string lengths, at most ``MAX_OPS`` ops in the whole file.

Any failure is a ``TraceFormatError`` naming the file and the field, e.g.
``load('rank0.json'): bundles[0].forward.ops[12].inputs[1].shape[0]: expected an integer, found the string '8'``;
the error also carries ``file`` and ``field`` attributes. Unknown fields are ignored, so a file from a newer
thunderviz that only added fields still opens.

The dict form (``bundle_to_dict``/``bundle_from_dict``) is also how bundles travel as plain data between
processes; it lists each field once, for both directions. To add a field: give it a default in
``trace_model``, write it in the ``*_to_dict`` function and read it with an ``opt_*`` accessor in the matching
``*_from`` function, so files without it still load; bump ``FORMAT_VERSION`` only when an older reader would
misread the new files.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from thunderviz.errors import TraceFormatError
from thunderviz.gc_pause import no_gc_pauses
from thunderviz.trace.buckets import ACCUMULATE_KIND, BUCKET_KINDS, Bucket
from thunderviz.trace.model import (
    COLLECTIVE_KINDS,
    TENSOR_KINDS,
    OpRecord,
    SourceRef,
    TensorRef,
    TraceBundle,
    TraceSnapshot,
)
from thunderviz.trace.validate import (
    MAX_FILE_BYTES,
    Invalid,
    Limits,
    Node,
    TooLarge,
    WrongVersion,
    check_envelope,
    int_within,
    read_json_file,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_FILE_BYTES",
    "MAX_OPS",
    "bundle_from_dict",
    "bundle_to_dict",
    "load",
    "save",
]

FORMAT_NAME = "thunderviz.traces"
FORMAT_VERSION = 1

# A trace file's size cap is MAX_FILE_BYTES (from trace.validate, re-exported): the cap of every file thunderviz reads.

#: Environment variable that raises (or lowers) the size cap for every ``load`` that does not pass ``max_bytes``.
MAX_FILE_BYTES_ENV = "THUNDERVIZ_MAX_TRACE_FILE_BYTES"
#: Most ops in one file, over all bundles and traces (the 4-block GPT's FSDP backward has 1,451).
MAX_OPS = 2_000_000

_NAME = 4096  # longest name: tensors, ops, modules, files, labels
_TEXT = 2**20  # longest free text: an op's printed Python, a source line
_MAX_NDIM = 64
_MAX_FUSED = MAX_OPS  # ops inside one fusion region
_MAX_NUMEL = 2**62  # a shape whose product is larger describes no tensor that exists
_MAX_WORLD = 2**24

_LIMITS = Limits(max_bytes=MAX_FILE_BYTES, max_depth=24, max_str=_TEXT)
_FIX = "pass a file written by thunderviz.trace.file.save (one per rank)"


# --------------------------------------------------------------------------------------------------------------
# Writing


def _tensor_to_dict(t: TensorRef) -> dict[str, Any]:
    return {
        "name": t.name,
        "kind": t.kind,
        "shape": None if t.shape is None else list(t.shape),
        "dtype": t.dtype,
        "device": t.device,
    }


def _op_to_dict(op: OpRecord) -> dict[str, Any]:
    src = op.source
    return {
        "index": op.index,
        "op": op.op,
        "symbol_id": op.symbol_id,
        "inputs": [_tensor_to_dict(t) for t in op.inputs],
        "outputs": [_tensor_to_dict(t) for t in op.outputs],
        "source": None if src is None else {"file": src.file, "line": src.line, "code": src.code},
        "python": op.python,
        "collective": op.collective,
        "group_size": op.group_size,
        "module": op.module,
    }


def _snapshot_to_dict(s: TraceSnapshot) -> dict[str, Any]:
    return {
        "label": s.label,
        "ops": [_op_to_dict(op) for op in s.ops],
        "edges": [list(e) for e in s.edges],
        "arg_names": list(s.arg_names),
        "return_names": list(s.return_names),
        "param_names": dict(s.param_names),
        "peak_memory_bytes": s.peak_memory_bytes,
        "saved_for_backward": [_tensor_to_dict(t) for t in s.saved_for_backward],
        "buckets": [b.to_dict() for b in s.buckets],
        "accumulated": [b.to_dict() for b in s.accumulated],
        "recomputed": [op.index for op in s.ops if op.recomputed],
        "fused": {str(op.index): list(op.fused) for op in s.ops if op.fused},
        "inner": {str(op.index): [_op_to_dict(i) for i in op.inner] for op in s.ops if op.inner},
    }


def bundle_to_dict(bundle: TraceBundle) -> dict[str, Any]:
    """The JSON-able form of a bundle, as stored in ``bundles[i]`` of a trace file."""
    return {
        "name": bundle.name,
        "rank": bundle.rank,
        "world_size": bundle.world_size,
        "forward": _snapshot_to_dict(bundle.forward),
        "backward": None if bundle.backward is None else _snapshot_to_dict(bundle.backward),
        "stages": [_snapshot_to_dict(s) for s in bundle.stages],
        "versions": dict(bundle.versions),
    }


def save(bundles: TraceBundle | Iterable[TraceBundle], path: str | os.PathLike[str]) -> Path:
    """Write bundles as versioned JSON; one file per rank is the usual layout on a cluster.

    The file appears whole or not at all (written next to it, then renamed), so a reader on another node never
    sees half a file.
    """
    if isinstance(bundles, TraceBundle):
        bundles = [bundles]
    bundles = list(bundles)
    for b in bundles:
        if not isinstance(b, TraceBundle):
            raise TypeError(
                f"save(bundles, path): expected TraceBundle objects (from capture()), got {type(b).__name__}"
            )
    doc = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "bundles": [bundle_to_dict(b) for b in bundles]}
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, p)
    return p


# --------------------------------------------------------------------------------------------------------------
# Reading


class _Budget:
    """Ops left for the rest of the file: a file cannot make the renderer walk millions of ops."""

    def __init__(self, ops: int) -> None:
        self.limit = self.left = ops

    def take(self, node: Node, n: int) -> None:
        self.left -= n
        if self.left < 0:
            node.fail(f"more than {self.limit:,} ops in the file")


def _tensor_from(n: Node) -> TensorRef:
    shape_node = n.get("shape")
    shape = None
    if shape_node is not None:
        shape = tuple(shape_node.int_list(max_len=_MAX_NDIM, minimum=0, maximum=_MAX_NUMEL))
        numel = 1
        for d in shape:
            numel *= d
            if numel > _MAX_NUMEL:
                shape_node.fail(f"a tensor of this shape would have more than {_MAX_NUMEL:,} elements")
    return TensorRef(
        name=n.req_str("name", max_len=_NAME),
        kind=n.str_or("kind", "tensor", choices=TENSOR_KINDS),
        shape=shape,
        dtype=n.opt_str("dtype", max_len=64),
        device=n.opt_str("device", max_len=_NAME),
    )


def _op_from(n: Node, position: int) -> OpRecord:
    index = n.req_int("index", minimum=0)
    if index != position:
        n["index"].fail(f"op at position {position} says index {index}: ops are stored in order, index = position")
    src = n.get("source")
    return OpRecord(
        index=index,
        op=n.req_str("op", max_len=_NAME),
        symbol_id=n.req_str("symbol_id", max_len=_NAME),
        inputs=tuple(_tensor_from(t) for t in n.opt_list("inputs")),
        outputs=tuple(_tensor_from(t) for t in n.opt_list("outputs")),
        source=None
        if src is None
        else SourceRef(
            file=src.req_str("file", max_len=_NAME), line=src.req_int("line", minimum=0), code=src.str_or("code", "")
        ),
        python=n.str_or("python", ""),
        collective=n.opt_str("collective", choices=COLLECTIVE_KINDS),
        group_size=n.opt_int("group_size", minimum=1, maximum=_MAX_WORLD),
        module=n.opt_str("module", max_len=_NAME),
    )


def _edges_from(n: Node | None, n_ops: int) -> list[tuple[int, int, str]]:
    """Edges are the longest list in a trace: each is checked in place, and only a bad one gets a node."""
    if n is None:
        return []
    if not isinstance(n.value, list):
        n.items()  # raises: expected a list
    out = []
    last = n_ops - 1
    for i, e in enumerate(n.value):
        if (
            isinstance(e, list)
            and len(e) == 3
            and int_within(e[0], 0, last)
            and int_within(e[1], 0, last)
            and isinstance(e[2], str)
            and len(e[2]) <= _NAME
        ):
            out.append((e[0], e[1], e[2]))
        else:
            out.append(_edge_from(n._child(e, i), n_ops))
    return out


def _edge_from(n: Node, n_ops: int) -> tuple[int, int, str]:
    parts = n.items()
    if len(parts) != 3:
        n.fail(f"an edge is [producer op, consumer op, tensor name]; found a list of {len(parts)}")
    if not n_ops:
        n.fail("an edge in a trace without ops")
    src = parts[0].integer(minimum=0, maximum=n_ops - 1)
    dst = parts[1].integer(minimum=0, maximum=n_ops - 1)
    return src, dst, parts[2].string(max_len=_NAME)


def _bucket_from(n: Node, n_ops: int, kinds: tuple[str, ...] = BUCKET_KINDS) -> Bucket:
    """A bucket's ops must exist in its trace: a file cannot point the ledger or a graph outside it."""
    last = max(n_ops - 1, 0)
    return Bucket(
        kind=n.req_str("kind", choices=kinds),
        trace=n.str_or("trace", "", max_len=_NAME),
        label=n.req_str("label", max_len=_NAME),
        params=[p.string(max_len=_NAME) for p in n.req_list("params")],
        bytes=n.req_int("bytes", minimum=0, maximum=_MAX_NUMEL * 16),
        dtype=n.req_str("dtype", max_len=64),
        issue_index=n.req_int("issue_index", minimum=0, maximum=last),
        wait_index=n.req_int("wait_index", minimum=0, maximum=last),
        sends=[p.string(max_len=_NAME) for p in n.opt_list("sends")],
        results=[p.string(max_len=_NAME) for p in n.opt_list("results")],
        reshard_after_forward=False if n.get("reshard_after_forward") is None else n["reshard_after_forward"].boolean(),
        future=n.str_or("future", "", max_len=_NAME),
        mesh_group=n.str_or("mesh_group", "", choices=("", "shard", "replica")),
    )


def _fused_from(n: Node, ops: list[OpRecord]) -> None:
    """``{"op index": [op names]}``: the fusion regions (one map per trace, like ``recomputed``; optional)."""
    fused = n.get("fused")
    if fused is None:
        return
    for key, names in fused.entries():
        if not key.isdigit() or int(key) >= len(ops):
            names.fail(f"fusion region {key!r} is not an op index of this trace ({len(ops)} ops)")
        ops[int(key)].fused = tuple(x.string(max_len=_NAME) for x in names.items(max_len=_MAX_FUSED))


def _inner_from(n: Node, ops: list[OpRecord], budget: _Budget) -> None:
    """``{"op index": [op dicts]}``: each fusion region's own ops (optional; older files name them only)."""
    inner = n.get("inner")
    if inner is None:
        return
    for key, region in inner.entries():
        if not key.isdigit() or int(key) >= len(ops) or not ops[int(key)].fused:
            region.fail(f"{key!r} is not the op index of a fusion region of this trace")
        nodes = region.items(max_len=_MAX_FUSED)
        budget.take(region, len(nodes))
        ops[int(key)].inner = tuple(_op_from(o, i) for i, o in enumerate(nodes))


def _snapshot_from(n: Node, budget: _Budget) -> TraceSnapshot:
    op_nodes = n.req_list("ops")
    budget.take(n["ops"], len(op_nodes))
    ops = [_op_from(o, i) for i, o in enumerate(op_nodes)]
    for r in n.opt_list("recomputed"):  # op indices: one list per trace instead of a flag on every op
        if not ops:
            r.fail("a recomputed op in a trace without ops")
        ops[r.integer(minimum=0, maximum=len(ops) - 1)].recomputed = True
    _fused_from(n, ops)
    _inner_from(n, ops, budget)
    return_names = [None if r.value is None else r.string(max_len=_NAME) for r in n.opt_list("return_names")]
    pm = n.get("param_names")
    return TraceSnapshot(
        label=n.str_or("label", "", max_len=_NAME),
        ops=ops,
        edges=_edges_from(n.get("edges"), len(ops)),
        arg_names=[a.string(max_len=_NAME) for a in n.opt_list("arg_names")],
        return_names=return_names,
        param_names={} if pm is None else pm.str_map(max_len=_NAME),
        peak_memory_bytes=n.opt_int("peak_memory_bytes", minimum=0),
        saved_for_backward=[_tensor_from(t) for t in n.opt_list("saved_for_backward")],
        buckets=[_bucket_from(b, len(ops)) for b in n.opt_list("buckets")],
        accumulated=[_bucket_from(b, len(ops), (ACCUMULATE_KIND,)) for b in n.opt_list("accumulated")],
    )


def bundle_from_dict(data: Any, *, path: str = "", max_ops: int = MAX_OPS) -> TraceBundle:
    """Build a bundle from its dict form, checking every field.

    Raises:
        thunderviz.trace.validate.Invalid: a field is missing, of the wrong type or out of range (``.path`` says
            which, relative to ``path``).
    """
    return _bundle_from(Node(data, path), _Budget(max_ops))


def _bundle_from(n: Node, budget: _Budget) -> TraceBundle:
    world = n.req_int("world_size", minimum=1, maximum=_MAX_WORLD)
    rank = n.req_int("rank", minimum=0)
    if rank >= world:
        n["rank"].fail(f"rank {rank} is outside a world of {world} (ranks are 0..{world - 1})")
    bwd = n.get("backward")
    vs = n.get("versions")
    return TraceBundle(
        name=n.req_str("name", max_len=_NAME),
        rank=rank,
        world_size=world,
        forward=_snapshot_from(n["forward"], budget),
        backward=None if bwd is None else _snapshot_from(bwd, budget),
        stages=[_snapshot_from(s, budget) for s in n.opt_list("stages")],
        versions={} if vs is None else vs.str_map(max_len=_NAME),
    )


def _max_bytes_default() -> int:
    raw = os.environ.get(MAX_FILE_BYTES_ENV)
    if not raw:
        return MAX_FILE_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise TraceFormatError(f"{MAX_FILE_BYTES_ENV}={raw[:40]!r}: expected a positive number of bytes")
    return value


def _error(where: str, field: str, problem: str, fix: str = _FIX) -> TraceFormatError:
    err = TraceFormatError(f"load({where!r}): {field + ': ' if field else ''}{problem}; {fix}.")
    err.file, err.field = where, field  # type: ignore[attr-defined]
    return err


def load(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> list[TraceBundle]:
    """Read a file written by ``save``, checking every field (see the module docstring for the rules).

    Args:
        path: the trace file.
        max_bytes: size cap; default ``MAX_FILE_BYTES`` (128 MiB) or ``$THUNDERVIZ_MAX_TRACE_FILE_BYTES``.

    Raises:
        TraceFormatError: the file is missing, too large, not JSON, not a thunderviz trace file, from another
            format version, or any field is malformed. The message names the file and the field; nothing else
            escapes, whatever the file holds.
    """
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"load(path): expected a file path, got {type(path).__name__}")
    where = os.fsdecode(path)
    cap = _max_bytes_default() if max_bytes is None else max_bytes
    with no_gc_pauses():
        return _load(where, cap)


def _load(where: str, cap: int) -> list[TraceBundle]:
    try:
        try:
            doc = read_json_file(where, dataclasses.replace(_LIMITS, max_bytes=cap))
        except Invalid:
            raise
        except (OSError, ValueError) as e:  # ValueError: a path with a NUL byte
            raise _error(where, "", f"cannot read the file ({getattr(e, 'strerror', None) or e})") from e
        check_envelope(doc, FORMAT_NAME, FORMAT_VERSION)
        budget = _Budget(MAX_OPS)
        return [_bundle_from(b, budget) for b in doc.req_list("bundles")]
    except TooLarge as e:
        fix = f"if you trust it, pass load(..., max_bytes=N) or set {MAX_FILE_BYTES_ENV}=N"
        raise _error(where, "", e.problem, fix) from None
    except WrongVersion as e:
        raise _error(
            where,
            e.path,
            f"trace {e.problem}",
            "capture the traces again with this version, or open them with the thunderviz that wrote them",
        ) from None
    except Invalid as e:
        raise _error(where, e.path, e.problem) from None
    except (MemoryError, RecursionError) as e:
        raise _error(where, "", f"too large or too deeply nested to read ({type(e).__name__})") from None
