"""A trace model that can leave the rank process.

Thunder's trace objects hold live proxies, process groups and executors: they cannot be pickled, sent from an
ipyparallel engine, or opened a week later. ``capture`` reads what a person needs from them (ops, tensors,
producer -> consumer edges, collectives, source lines, a memory estimate) into plain dataclasses that round-trip
through JSON (``save``/``load``) and pickle. It reads thunder's objects (``trace.bound_symbols``, ``bsym.sym``,
``flat_proxy_args/outs``, ``thunder.core.utils.producers``), never printed Python, so a change in thunder's
printer cannot silently change what we show.

Thunder is imported only inside ``capture``: loading and rendering saved traces works without it.
"""

from __future__ import annotations

import json
import linecache
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from thunderviz.errors import TraceCaptureError, TraceFormatError

__all__ = [
    "BOOKKEEPING_OPS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "OpRecord",
    "SourceRef",
    "TensorRef",
    "TraceBundle",
    "TraceSnapshot",
    "capture",
    "load",
    "save",
    "snapshot_trace",
]

FORMAT_NAME = "thunderviz.traces"
FORMAT_VERSION = 1

#: Ops that manage Python objects rather than compute: hidden by default in graphs and ignored by the diff,
#: because in a 1,451-op backward trace 690 of them are ``python_del``.
BOOKKEEPING_OPS = frozenset(
    {
        "python_del",
        "unpack_trivial",
        "unpack_sequence",
        "unpack_key",
        "unpack_attr",
        "clear_mutable_collection",
        "python_return",
        "comment",
        "check_tensor_shape_and_metadata",
    }
)

_DTYPE_BYTES = {
    "bool": 1, "bool8": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "float32": 4, "complex32": 4,
    "int64": 8, "float64": 8, "complex64": 8, "complex128": 16,
}  # fmt: skip


@dataclass(frozen=True)
class TensorRef:
    """One value an op reads or writes. ``shape``/``dtype`` are None for non-tensors (collections, numbers)."""

    name: str
    kind: str = "tensor"  # tensor | future | collection | number | other
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None

    @property
    def numel(self) -> int | None:
        if self.shape is None:
            return None
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def bytes(self) -> int | None:
        """Size in bytes, so ledgers and labels can show traffic without thunder installed."""
        n = self.numel
        if n is None or self.dtype is None:
            return None
        return n * _DTYPE_BYTES.get(self.dtype, 4)

    def short(self) -> str:
        """``f32[8,64,128]``: the compact form used in graph labels."""
        if self.shape is None:
            return self.kind
        return f"{_short_dtype(self.dtype)}[{','.join(str(d) for d in self.shape)}]"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "shape": None if self.shape is None else list(self.shape),
                "dtype": self.dtype, "device": self.device}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorRef:
        shape = d.get("shape")
        return cls(name=str(d["name"]), kind=str(d.get("kind", "tensor")),
                   shape=None if shape is None else tuple(int(x) for x in shape),
                   dtype=d.get("dtype"), device=d.get("device"))  # fmt: skip


@dataclass(frozen=True)
class SourceRef:
    """Where an op came from in Python. Thunder records this for forward ops only (not for backward)."""

    file: str
    line: int
    code: str = ""

    def short(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "code": self.code}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SourceRef:
        return cls(file=str(d["file"]), line=int(d["line"]), code=str(d.get("code", "")))


@dataclass
class OpRecord:
    """One bound symbol of a trace.

    ``collective`` is ``all_gather``/``reduce_scatter``/``all_reduce``/``broadcast``/``wait`` or None;
    ``module`` is the module path the op is attributed to (see ``thunderviz.core.module_paths``).
    """

    index: int
    op: str
    symbol_id: str
    inputs: tuple[TensorRef, ...] = ()
    outputs: tuple[TensorRef, ...] = ()
    source: SourceRef | None = None
    python: str = ""
    collective: str | None = None
    group_size: int | None = None
    module: str | None = None

    @property
    def is_collective(self) -> bool:
        return self.collective is not None and self.collective != "wait"

    @property
    def is_wait(self) -> bool:
        return self.collective == "wait"

    @property
    def is_bookkeeping(self) -> bool:
        return self.op in BOOKKEEPING_OPS

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "op": self.op, "symbol_id": self.symbol_id,
            "inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs],
            "source": None if self.source is None else self.source.to_dict(), "python": self.python,
            "collective": self.collective, "group_size": self.group_size, "module": self.module,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OpRecord:
        src = d.get("source")
        return cls(
            index=int(d["index"]), op=str(d["op"]), symbol_id=str(d["symbol_id"]),
            inputs=tuple(TensorRef.from_dict(t) for t in d.get("inputs", ())),
            outputs=tuple(TensorRef.from_dict(t) for t in d.get("outputs", ())),
            source=None if src is None else SourceRef.from_dict(src), python=str(d.get("python", "")),
            collective=d.get("collective"), group_size=d.get("group_size"), module=d.get("module"),
        )  # fmt: skip


@dataclass
class TraceSnapshot:
    """One thunder trace, frozen.

    ``edges`` are ``(producer_index, consumer_index, tensor_name)`` from thunder's own producer/consumer maps.
    ``param_names`` maps trace argument names (``t_blocks_0_attn_proj_weight``) to the module's qualified
    parameter names (``blocks.0.attn_proj.weight``): proxy names lose dots and odd characters, the grouping
    needs the real path. ``return_names`` keeps positions (None for non-proxy outputs) so backward gradients
    can be matched to the forward inputs they belong to.
    """

    label: str
    ops: list[OpRecord]
    edges: list[tuple[int, int, str]] = field(default_factory=list)
    arg_names: list[str] = field(default_factory=list)
    return_names: list[str | None] = field(default_factory=list)
    param_names: dict[str, str] = field(default_factory=dict)
    peak_memory_bytes: int | None = None

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def collectives(self) -> list[OpRecord]:
        return [op for op in self.ops if op.collective is not None]

    def producers(self) -> dict[str, int]:
        """Tensor name -> index of the op that produced it."""
        return {name: src for src, _dst, name in self.edges}

    def consumers(self) -> dict[int, list[int]]:
        """Op index -> indices of the ops that read one of its outputs."""
        out: dict[int, list[int]] = {}
        for src, dst, _name in self.edges:
            lst = out.setdefault(src, [])
            if not lst or lst[-1] != dst:
                lst.append(dst)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "ops": [op.to_dict() for op in self.ops],
            "edges": [list(e) for e in self.edges], "arg_names": list(self.arg_names),
            "return_names": list(self.return_names), "param_names": dict(self.param_names),
            "peak_memory_bytes": self.peak_memory_bytes,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TraceSnapshot:
        return cls(
            label=str(d.get("label", "")), ops=[OpRecord.from_dict(o) for o in d["ops"]],
            edges=[(int(a), int(b), str(n)) for a, b, n in d.get("edges", ())],
            arg_names=[str(x) for x in d.get("arg_names", ())],
            return_names=[None if x is None else str(x) for x in d.get("return_names", ())],
            param_names={str(k): str(v) for k, v in d.get("param_names", {}).items()},
            peak_memory_bytes=d.get("peak_memory_bytes"),
        )  # fmt: skip


@dataclass
class TraceBundle:
    """Everything captured for one jitted object on one rank."""

    name: str
    rank: int
    world_size: int
    forward: TraceSnapshot
    backward: TraceSnapshot | None = None
    stages: list[TraceSnapshot] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def memory(self) -> dict[str, int | None]:
        """Estimated peak bytes per execution trace (thunder's ``get_alloc_memory``), for this rank."""
        out = {"forward": self.forward.peak_memory_bytes}
        if self.backward is not None:
            out["backward"] = self.backward.peak_memory_bytes
        return out

    def gradient_params(self) -> dict[str, str]:
        """Backward tensor name -> qualified name of the parameter it is the gradient of.

        The backward trace returns one gradient per forward argument, in the same positions.
        """
        if self.backward is None or len(self.backward.return_names) != len(self.forward.arg_names):
            return {}
        return {
            g: self.forward.param_names[a]
            for g, a in zip(self.backward.return_names, self.forward.arg_names)
            if g is not None and a in self.forward.param_names
        }

    def traces(self) -> dict[str, TraceSnapshot]:
        out = {"forward": self.forward}
        if self.backward is not None:
            out["backward"] = self.backward
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "rank": self.rank, "world_size": self.world_size,
            "forward": self.forward.to_dict(), "backward": None if self.backward is None else self.backward.to_dict(),
            "stages": [s.to_dict() for s in self.stages], "versions": dict(self.versions),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TraceBundle:
        bwd = d.get("backward")
        return cls(
            name=str(d["name"]), rank=int(d["rank"]), world_size=int(d["world_size"]),
            forward=TraceSnapshot.from_dict(d["forward"]),
            backward=None if bwd is None else TraceSnapshot.from_dict(bwd),
            stages=[TraceSnapshot.from_dict(s) for s in d.get("stages", ())],
            versions={str(k): str(v) for k, v in d.get("versions", {}).items()},
        )  # fmt: skip


# --------------------------------------------------------------------------------------------------------------
# Capture (the only part that imports thunder)


def capture(obj: Any, name: str | None = None, *, rank: int | None = None, stages: bool = True) -> TraceBundle:
    """Read the traces of a jitted module or function that has already run once.

    Args:
        obj: a ``ThunderModule`` (``thunder.jit(model)``, also after ``thunder.distributed.fsdp/ddp``) or a
            function returned by ``thunder.jit``.
        name: label for reports; defaults to the module class or function name.
        rank: defaults to ``torch.distributed.get_rank()`` when a process group exists, else 0.
        stages: also snapshot every named stage of ``thunder.last_traces`` (larger files).

    Raises:
        TraceCaptureError: ``obj`` is not jitted, or has not been called yet.
    """
    import thunder

    try:
        cd = thunder.compile_data(obj)
    except Exception:  # noqa: BLE001 - thunder raises various types for non-jitted objects
        cd = None
    if cd is None:
        raise TraceCaptureError(
            f"capture(obj) needs a module or function returned by thunder.jit; got {type(obj).__name__}. "
            "Jit it first (jm = thunder.jit(model)), run it once, then call capture(jm)."
        )
    cs = thunder.compile_stats(obj)
    if cs is None or cs.last_traces is None:
        raise TraceCaptureError(
            f"capture(obj): the jitted {type(obj).__name__} has not run yet, so thunder has no traces. "
            "Call it once (out = jm(batch); and out.sum().backward() for the backward trace), then capture(jm)."
        )
    fwd_traces = list(thunder.last_traces(obj))
    try:
        bwd_traces = list(thunder.last_backward_traces(obj) or [])
    except Exception:  # noqa: BLE001 - no backward recorded
        bwd_traces = []
    param_names = _param_name_map(obj, fwd_traces[-1])
    forward = snapshot_trace(fwd_traces[-1], label="forward", param_names=param_names)
    backward = snapshot_trace(bwd_traces[-1], label="backward") if bwd_traces else None
    stage_snaps: list[TraceSnapshot] = []
    if stages:
        for i, t in enumerate(fwd_traces):
            stage_snaps.append(snapshot_trace(t, label=_stage_label(t, i), param_names=param_names, memory=False))
    from thunderviz.core.module_paths import assign_modules

    assign_modules(forward, backward)
    for s in stage_snaps:
        assign_modules(s, None)
    if rank is None:
        rank = _dist_rank()
    import torch

    return TraceBundle(
        name=name or _default_name(obj), rank=rank, world_size=_dist_world_size(), forward=forward,
        backward=backward, stages=stage_snaps,
        versions={"thunder": getattr(thunder, "__version__", "?"), "torch": torch.__version__},
    )  # fmt: skip


def snapshot_trace(
    trace: Any, label: str = "", *, param_names: Mapping[str, str] | None = None, memory: bool = True
) -> TraceSnapshot:
    """Freeze one thunder ``TraceCtx`` into a ``TraceSnapshot``."""
    from thunder.core.utils import producers as thunder_producers

    bsyms = list(trace.bound_symbols)
    kinds = _collective_kinds()
    # flat_proxy_args flattens the arguments on every access: read it once per op.
    ins = [_unique(b.flat_proxy_args) for b in bsyms]
    ops = [_op_record(i, b, kinds, ins[i]) for i, b in enumerate(bsyms)]

    # Producers by op index (thunder's map), so edges need no id() bookkeeping.
    prod = thunder_producers(trace, _map_to_numbers=True)
    edges: list[tuple[int, int, str]] = []
    for j in range(len(bsyms)):
        for p in ins[j]:
            i = prod.get(p, None)
            if i is not None and i != j:
                edges.append((i, j, p.name))

    arg_names = [p.name for p in _flat_proxies(getattr(trace, "args", ()) or ())]
    return_names: list[str | None] = []
    for b in bsyms:
        if b.sym.name == "python_return":
            return_names = _flat_names_keep_none(b.args)
    peak = _peak_memory(trace) if memory else None
    pn = {k: v for k, v in (param_names or {}).items() if k in set(arg_names)}
    return TraceSnapshot(label=label, ops=ops, edges=edges, arg_names=arg_names, return_names=return_names,
                         param_names=pn, peak_memory_bytes=peak)  # fmt: skip


def _op_record(index: int, bsym: Any, kinds: Mapping[Any, str], inputs: list[Any]) -> OpRecord:
    collective = kinds.get(bsym.sym.id)
    if collective is None and bsym.sym.name in ("wait", "all_gather", "reduce_scatter", "all_reduce", "broadcast"):
        # Distributed prims before the torch executor claims them (earlier stages) have the same names.
        collective = bsym.sym.name
    group_size = _group_size(bsym.args) if collective and collective != "wait" else None
    try:
        python = "\n".join(bsym.python(indent=0, print_depth=1))
    except Exception:  # noqa: BLE001 - printing is best effort, the structure is what we rely on
        python = ""
    return OpRecord(
        index=index, op=str(bsym.sym.name), symbol_id=str(bsym.sym.id),
        inputs=tuple(_tensor_ref(p) for p in inputs),
        outputs=tuple(_tensor_ref(p) for p in _unique(bsym.flat_proxy_outs)),
        source=_source_ref(bsym), python=python, collective=collective, group_size=group_size,
    )  # fmt: skip


def _unique(proxies: Iterable[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for p in proxies:
        if p.name not in seen:
            seen.add(p.name)
            out.append(p)
    return out


def _tensor_ref(p: Any) -> TensorRef:
    from thunder.core.proxies import CollectionProxy, FutureTensorProxy, NumberProxy, TensorProxy

    if isinstance(p, (TensorProxy, FutureTensorProxy)):
        kind = "future" if isinstance(p, FutureTensorProxy) else "tensor"
        device = p.device.device_str() if hasattr(p.device, "device_str") else str(p.device)
        return TensorRef(name=p.name, kind=kind, shape=tuple(int(d) for d in p.shape),
                         dtype=_dtype_name(p.dtype), device=device)  # fmt: skip
    if isinstance(p, CollectionProxy):
        return TensorRef(name=p.name, kind="collection")
    if isinstance(p, NumberProxy):
        return TensorRef(name=p.name, kind="number")
    return TensorRef(name=p.name, kind="other")


def _dtype_name(dtype: Any) -> str:
    s = str(dtype)
    s = s.rsplit(".", 1)[-1]
    return s.rstrip("_")  # thunder spells weak dtypes "float32_"


def _short_dtype(dtype: str | None) -> str:
    if dtype is None:
        return "?"
    m = re.fullmatch(r"(float|int|uint|bfloat|complex)(\d+)", dtype)
    if m:
        return {"float": "f", "int": "i", "uint": "u", "bfloat": "bf", "complex": "c"}[m.group(1)] + m.group(2)
    return {"bool": "b8", "bool8": "b8"}.get(dtype, dtype)


def _source_ref(bsym: Any) -> SourceRef | None:
    fname = getattr(bsym, "source_filename", None)
    pos = getattr(bsym, "source_positions", None)
    if not fname or pos is None or getattr(pos, "lineno", None) is None:
        return None
    return SourceRef(file=str(fname), line=int(pos.lineno), code=linecache.getline(fname, pos.lineno).strip())


def _collective_kinds() -> dict[Any, str]:
    """Symbol id -> collective kind, for the torch executor's implementations and the distributed prims."""
    kinds: dict[Any, str] = {}
    try:
        import thunder.executors.torchex as tx

        for kind in ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "wait"):
            impl = getattr(tx, f"{kind}_prim_impl", None)
            if impl is not None:
                kinds[impl.id] = kind
    except Exception:  # noqa: BLE001 - no distributed support in this build
        pass
    try:
        import thunder.distributed.prims as dp

        for kind in ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "wait"):
            kinds[getattr(dp, kind).id] = kind
    except Exception:  # noqa: BLE001
        pass
    return kinds


def _group_size(args: Any) -> int | None:
    try:
        from torch.distributed import ProcessGroup
    except Exception:  # noqa: BLE001
        return None
    for a in _flatten(args):
        if isinstance(a, ProcessGroup):
            try:
                return int(a.size())
            except Exception:  # noqa: BLE001
                return None
    return None


def _flatten(x: Any) -> Iterable[Any]:
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flatten(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flatten(y)
    else:
        yield x


def _flat_proxies(x: Any) -> list[Any]:
    from thunder.core.proxies import Proxy

    return [p for p in _flatten(x) if isinstance(p, Proxy)]


def _flat_names_keep_none(x: Any) -> list[str | None]:
    from thunder.core.proxies import Proxy

    return [p.name if isinstance(p, Proxy) else None for p in _flatten(x)]


def _peak_memory(trace: Any) -> int | None:
    try:
        from thunder.examine.memory_calculation import get_alloc_memory

        peak, _per_tensor = get_alloc_memory(trace)
        return int(peak)
    except Exception:  # noqa: BLE001 - the estimate only understands execution traces
        return None


def _stage_label(trace: Any, i: int) -> str:
    prov = trace.get_provenance() if hasattr(trace, "get_provenance") else None
    if prov is None:
        return "computation" if i == 0 else f"stage {i}"
    text = str(prov).strip().removeprefix("# Constructed by ").strip()
    return re.sub(r"\s*\(took \d+ milliseconds\)", "", text)


def _param_name_map(obj: Any, trace: Any) -> dict[str, str]:
    """Trace argument name -> qualified parameter/buffer name, by thunder's own naming of module tensors."""
    named = getattr(obj, "named_parameters", None)
    if named is None:
        return {}
    by_sanitized: dict[str, str] = {}
    try:
        items = list(obj.named_parameters()) + list(obj.named_buffers())
    except Exception:  # noqa: BLE001
        return {}
    for qual, _t in items:
        by_sanitized.setdefault(_sanitize(qual), qual)
    out = {}
    for p in _flat_proxies(getattr(trace, "args", ()) or ()):
        for candidate in (p.name, p.name.removeprefix("t_"), p.name.removeprefix("t")):
            qual = by_sanitized.get(_sanitize(candidate))
            if qual is not None:
                out[p.name] = qual
                break
    return out


def _sanitize(name: str) -> str:
    """Compare names the way thunder turns them into identifiers: every non-alphanumeric becomes ``_``."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").lower()


def _default_name(obj: Any) -> str:
    inner = getattr(obj, "_model", None)
    if inner is not None:
        return type(inner).__name__
    fn = getattr(obj, "__wrapped__", obj)
    return getattr(fn, "__name__", type(obj).__name__)


def _dist_rank() -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:  # noqa: BLE001
        return 0


def _dist_world_size() -> int:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:  # noqa: BLE001
        return 1


# --------------------------------------------------------------------------------------------------------------
# Files


def save(bundles: TraceBundle | Iterable[TraceBundle], path: str | os.PathLike[str]) -> Path:
    """Write bundles as versioned JSON; one file per rank is the usual layout on a cluster."""
    if isinstance(bundles, TraceBundle):
        bundles = [bundles]
    bundles = list(bundles)
    for b in bundles:
        if not isinstance(b, TraceBundle):
            raise TypeError(f"save(bundles, path): expected TraceBundle objects (from capture()), got {type(b).__name__}")
    doc = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "bundles": [b.to_dict() for b in bundles]}
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, p)
    return p


def load(path: str | os.PathLike[str]) -> list[TraceBundle]:
    """Read a file written by ``save``.

    Raises:
        TraceFormatError: the file is missing, not JSON, not a thunderviz trace file, or from another version.
    """
    p = Path(path)
    fix = "pass a file written by thunderviz.core.traces.save (one per rank)"
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceFormatError(f"load({str(p)!r}): cannot read the file ({e.strerror or e}); {fix}.") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"load({str(p)!r}): not JSON ({e.msg} at line {e.lineno}); {fix}.") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise TraceFormatError(f"load({str(p)!r}): JSON without \"format\": \"{FORMAT_NAME}\"; {fix}.")
    version = doc.get("version")
    if version != FORMAT_VERSION:
        raise TraceFormatError(
            f"load({str(p)!r}): trace format version {version!r}, this thunderviz reads version {FORMAT_VERSION}; "
            "capture the traces again with this version, or open them with the thunderviz that wrote them."
        )
    raw = doc.get("bundles")
    if not isinstance(raw, list):
        raise TraceFormatError(f"load({str(p)!r}): \"bundles\" must be a list; {fix}.")
    out = []
    for i, b in enumerate(raw):
        try:
            out.append(TraceBundle.from_dict(b))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TraceFormatError(f"load({str(p)!r}): bundle {i} is malformed ({type(e).__name__}: {e}); {fix}.") from e
    return out
