"""One thunder trace frozen into the trace model: ``snapshot_trace`` (a ``TraceCtx`` -> ``TraceSnapshot``).

It reads thunder's objects (``trace.bound_symbols``, ``bsym.sym``, ``flat_proxy_args/outs``,
``thunder.core.utils.producers``), never printed Python, so a change in thunder's printer cannot silently change what
we show. Thunder is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import dataclasses
import linecache
import re
from collections.abc import Iterable, Mapping
from typing import Any

from thunderviz.thunder.comm.collectives import collective_kinds
from thunderviz.trace.model import COLLECTIVE_KINDS, OpRecord, SourceRef, TensorRef, TraceSnapshot

__all__ = [
    "RELEASED_ONLY",
    "dtype_name",
    "flat_proxies",
    "recomputed_ops",
    "snapshot_trace",
    "stage_label",
    "tensor_ref",
]

#: Ops that take an argument only to free it (op name -> its position): that is not data flow, so the snapshot
#: leaves it out of the op's inputs and edges. The communication pass's unpack frees the bucket's send buffer
#: (``comm.ops._free``); drawn as an input, it would tie every pack to its unpack and move modules in the graph.
RELEASED_ONLY: dict[str, int] = {"thunderviz_unpack_all_gather": 1}


def snapshot_trace(
    trace: Any,
    label: str = "",
    *,
    param_names: Mapping[str, str] | None = None,
    memory: bool = True,
    seen: dict[int, OpRecord] | None = None,
) -> TraceSnapshot:
    """Freeze one thunder ``TraceCtx`` into a ``TraceSnapshot``.

    ``seen``: the records already made of bound symbols, by ``id``, shared by the snapshots of one capture. Why:
    thunder's passes build new traces from mostly the same bound symbol objects (a TinyGPT forward's 7 stages: 2,805
    ops, 1,859 distinct symbols), and printing each op's Python was half of a capture; a symbol is recorded once and
    each trace takes a copy at its own position (0.81x the capture's time). The traces must stay alive while
    ``seen`` is used (ids are only unique among live objects).
    """
    from thunder.core.utils import producers as thunder_producers

    bsyms = list(trace.bound_symbols)
    kinds = collective_kinds()
    seen = {} if seen is None else seen
    # flat_proxy_args flattens the arguments on every access: read it once per op.
    ins = [_unique(_data_args(b)) for b in bsyms]
    ops = [_recorded(i, b, kinds, ins[i], seen) for i, b in enumerate(bsyms)]

    # Producers by op index (thunder's map), so edges need no id() bookkeeping.
    prod = thunder_producers(trace, _map_to_numbers=True)
    edges: list[tuple[int, int, str]] = []
    for j in range(len(bsyms)):
        for p in ins[j]:
            i = prod.get(p, None)
            if i is not None and i != j:
                edges.append((i, j, p.name))

    arg_names = [p.name for p in flat_proxies(getattr(trace, "args", ()) or ())]
    return_names: list[str | None] = []
    for b in bsyms:
        if b.sym.name == "python_return":
            return_names = _flat_names_keep_none(b.args)
    peak = _peak_memory(trace) if memory else None
    args = set(arg_names)
    pn = {k: v for k, v in (param_names or {}).items() if k in args}
    return TraceSnapshot(
        label=label,
        ops=ops,
        edges=edges,
        arg_names=arg_names,
        return_names=return_names,
        param_names=pn,
        peak_memory_bytes=peak,
    )


def tensor_ref(p: Any) -> TensorRef:
    """A proxy as the trace model's ``TensorRef`` (tensor, future, collection, number or other)."""
    from thunder.core.proxies import CollectionProxy, FutureTensorProxy, NumberProxy, TensorProxy

    if isinstance(p, (TensorProxy, FutureTensorProxy)):
        kind = "future" if isinstance(p, FutureTensorProxy) else "tensor"
        device = p.device.device_str() if hasattr(p.device, "device_str") else str(p.device)
        return TensorRef(
            name=p.name, kind=kind, shape=tuple(int(d) for d in p.shape), dtype=dtype_name(p.dtype), device=device
        )
    if isinstance(p, CollectionProxy):
        return TensorRef(name=p.name, kind="collection")
    if isinstance(p, NumberProxy):
        return TensorRef(name=p.name, kind="number")
    return TensorRef(name=p.name, kind="other")


def dtype_name(dtype: Any) -> str:
    """``thunder.dtypes.float32_`` and ``torch.float32`` -> ``float32`` (thunder spells weak dtypes with ``_``)."""
    return str(dtype).rsplit(".", 1)[-1].rstrip("_")


def stage_label(trace: Any, i: int) -> str:
    """The name of the ``i``-th stage of ``thunder.last_traces``: the pass that made it, without its timing."""
    prov = trace.get_provenance() if hasattr(trace, "get_provenance") else None
    if prov is None:
        return "computation" if i == 0 else f"stage {i}"
    text = str(prov).strip().removeprefix("# Constructed by ").strip()
    return re.sub(r"\s*\(took \d+ milliseconds\)", "", text)


def _data_args(bsym: Any) -> list[Any]:
    """The proxies ``bsym`` reads (``RELEASED_ONLY`` ones left out)."""
    position = RELEASED_ONLY.get(str(bsym.sym.name))
    if position is None or len(bsym.args) <= position:
        return bsym.flat_proxy_args
    released = {p.name for p in flat_proxies(bsym.args[position])}
    return [p for p in bsym.flat_proxy_args if p.name not in released]


def flat_proxies(x: Any) -> list[Any]:
    """The proxies in a nest of lists, tuples and dicts (a trace's ``args``), in order."""
    from thunder.core.proxies import Proxy

    return [p for p in _flatten(x) if isinstance(p, Proxy)]


def _recorded(
    index: int, bsym: Any, kinds: Mapping[Any, str], inputs: list[Any], seen: dict[int, OpRecord]
) -> OpRecord:
    """The record of ``bsym`` at ``index``: made once per bound symbol object (``snapshot_trace``'s ``seen``)."""
    done = seen.get(id(bsym))
    if done is None:
        done = seen[id(bsym)] = _op_record(index, bsym, kinds, inputs)
    # a copy per trace, its region's ops too: attribution sets each copy's module
    return dataclasses.replace(done, index=index, inner=tuple(dataclasses.replace(i) for i in done.inner))


def _op_record(index: int, bsym: Any, kinds: Mapping[Any, str], inputs: list[Any]) -> OpRecord:
    collective = kinds.get(bsym.sym.id)
    if collective is None and bsym.sym.name in COLLECTIVE_KINDS:
        # Distributed prims before the torch executor claims them (earlier stages) have the same names.
        collective = bsym.sym.name
    group_size = _group_size(bsym.args) if collective and collective != "wait" else None
    try:
        python = "\n".join(bsym.python(indent=0, print_depth=1))
    except Exception:
        python = ""
    return OpRecord(
        index=index,
        op=str(bsym.sym.name),
        symbol_id=str(bsym.sym.id),
        inputs=tuple(tensor_ref(p) for p in inputs),
        outputs=tuple(tensor_ref(p) for p in _unique(bsym.flat_proxy_outs)),
        source=_source_ref(bsym),
        python=python,
        collective=collective,
        group_size=group_size,
        fused=tuple(str(b.sym.name) for b in bsym.subsymbols) if getattr(bsym.sym, "is_fusion", False) else (),
        inner=_region_ops(bsym, kinds),
    )


def _region_ops(bsym: Any, kinds: Mapping[Any, str]) -> tuple[OpRecord, ...]:
    """A fusion region's ops, each a record of its own (numbered within the region): the data flow inside the region
    says which modules it runs (``trace.attribution``), and opening the region in a graph draws them."""
    if not getattr(bsym.sym, "is_fusion", False):
        return ()
    return tuple(_op_record(k, b, kinds, _unique(_data_args(b))) for k, b in enumerate(bsym.subsymbols))


def _unique(proxies: Iterable[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for p in proxies:
        if p.name not in seen:
            seen.add(p.name)
            out.append(p)
    return out


def _source_ref(bsym: Any) -> SourceRef | None:
    fname = getattr(bsym, "source_filename", None)
    pos = getattr(bsym, "source_positions", None)
    if not fname or pos is None or getattr(pos, "lineno", None) is None:
        return None
    return SourceRef(file=str(fname), line=int(pos.lineno), code=linecache.getline(fname, pos.lineno).strip())


def _group_size(args: Any) -> int | None:
    try:
        from torch.distributed import ProcessGroup
    except Exception:
        return None
    for a in _flatten(args):
        if isinstance(a, ProcessGroup):
            try:
                return int(a.size())
            except Exception:
                return None
    return None


def _flatten(x: Any) -> Iterable[Any]:
    stack = [x]
    while stack:
        y = stack.pop()
        if isinstance(y, (list, tuple)):
            stack.extend(reversed(y))
        elif isinstance(y, dict):
            stack.extend(reversed(list(y.values())))
        else:
            yield y


def _flat_names_keep_none(x: Any) -> list[str | None]:
    from thunder.core.proxies import Proxy

    return [p.name if isinstance(p, Proxy) else None for p in _flatten(x)]


def _peak_memory(trace: Any) -> int | None:
    try:
        from thunder.examine.memory_calculation import get_alloc_memory

        peak, _per_tensor = get_alloc_memory(trace)
        return int(peak)
    except Exception:
        return None


def recomputed_ops(forward: Any, backward: Any) -> set[int]:
    """Positions of the backward's ops that recompute forward ops (activation checkpointing, ZERO3's unsharding).

    thunder marks what a ``torch.utils.checkpoint`` region (or a value tagged *recompute in backward*) computes with
    ``BoundSymbolTag.RECOMPUTE_IN_BACKWARD``, in the forward and on the copies autodiff places in the backward; but
    the gradient ops derived from those regions inherit the tag too, and proxy names are renumbered after the split.
    So a backward op counts as recomputed when it carries the tag, reads no cotangent (directly or through other
    ops: it is computed from saved tensors alone), is not a collective, and matches a tagged forward op of the same
    symbol and output shapes (each forward op matched once).
    """
    from collections import Counter

    from thunder.core.symbol import BoundSymbolTag

    tag = BoundSymbolTag.RECOMPUTE_IN_BACKWARD
    kinds = collective_kinds()

    def key(b: Any) -> tuple:
        return (b.sym.name, tuple(tuple(p.shape) for p in b.flat_proxy_outs if hasattr(p, "shape")))

    available = Counter(key(b) for b in forward.bound_symbols if tag in b.tags and b.sym.id not in kinds)
    if not available:
        return set()
    cotangents = _cotangent_names(backward)
    tainted = set(cotangents)
    out: set[int] = set()
    for i, b in enumerate(backward.bound_symbols):
        ins = {p.name for p in b.flat_proxy_args}
        if ins & tainted:
            tainted.update(p.name for p in b.flat_proxy_outs)
            continue
        if tag not in b.tags or b.sym.id in kinds:
            continue
        k = key(b)
        if available[k] > 0:
            available[k] -= 1
            out.add(i)
    return out


def _cotangent_names(backward: Any) -> set[str]:
    """The names of the gradients of the forward's outputs, as the backward unpacks them from its second argument."""
    args = getattr(backward, "args", None) or ()
    if len(args) < 2:
        return set()
    cot = getattr(args[1], "name", None)
    names: set[str] = set()
    for b in backward.bound_symbols:
        if b.sym.name == "unpack_sequence" and b.args and getattr(b.args[0], "name", None) == cot:
            names.update(p.name for p in b.flat_proxy_outs)
    return names
