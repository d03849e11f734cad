"""Capture: read thunder's trace objects into the trace model (``thunderviz.trace.model``).

This module and ``thunderviz.thunder.hooks`` are the only places that read thunder's internals, so a thunder
upgrade touches them and nothing else. It reads thunder's objects (``trace.bound_symbols``, ``bsym.sym``,
``flat_proxy_args/outs``, ``thunder.core.utils.producers``, the prologue's ``unpack_parameter`` records), never
printed Python, so a change in thunder's printer cannot silently change what we show.

``capture`` accepts whatever a user holds after ``fabric.setup``:

- a ``ThunderModule`` or a jitted function (``thunder.jit``), as is;
- Fabric's ``_FabricModule`` around a ``ThunderModule`` (cases 1 and 3): the ThunderModule inside is captured;
- Fabric's ``_FabricModule`` around a plain module set up with ``jit=False`` (case 2), or that plain module: the
  module itself has no traces, the function the user jitted and called with it does. Thunder keeps no link from a
  module to the functions that traced it, but each jitted function's prologue records which parameters it read
  (qualified name, shape, dtype). The function whose last prologue read this module's parameters is captured,
  provided exactly one function did and no other live module has parameters that fit the same record;
  otherwise ``TraceCaptureError`` names the function(s) to pass instead.

Thunder and torch are imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import gc
import inspect
import linecache
import re
import sys
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from thunderviz.errors import TraceCaptureError
from thunderviz.trace.attribution import assign_modules
from thunderviz.trace.model import COLLECTIVE_KINDS, OpRecord, SourceRef, TensorRef, TraceBundle, TraceSnapshot

__all__ = ["capture", "snapshot_trace"]

_FABRIC_WRAPPER_MODULES = ("lightning.fabric.wrappers", "lightning_fabric.wrappers")
#: The attribute under which Fabric's wrapper holds the module it forwards to; parameter names read through the
#: wrapper start with it.
_FABRIC_PREFIX = "_forward_module."


def capture(obj: Any, name: str | None = None, *, rank: int | None = None, stages: bool = True) -> TraceBundle:
    """Read the traces of a jitted module or function that has already run once.

    Args:
        obj: what ``thunder.jit`` or ``fabric.setup`` returned: a ``ThunderModule`` (also after
            ``thunder.distributed.fsdp/ddp``), a jitted function, or Fabric's wrapper around either a
            ThunderModule (cases 1 and 3) or a plain module whose jitted function ran (case 2, see the module
            docstring).
        name: label for reports; defaults to the module class or function name.
        rank: defaults to ``torch.distributed.get_rank()`` when a process group exists, else 0.
        stages: also snapshot every named stage of ``thunder.last_traces`` (larger files).

    Raises:
        TraceCaptureError: nothing jitted can be found behind ``obj``, several candidates can, or it has not run.
    """
    import thunder
    import torch

    target, default_name, what = _jitted_target(obj)
    cs = thunder.compile_stats(target)
    if cs is None or cs.last_traces is None:
        raise TraceCaptureError(
            f"capture(obj): {what} has not run yet, so thunder has no traces. Call it once (out = model(batch); "
            "and out.sum().backward() for the backward trace), then capture it."
        )
    fwd_traces = list(thunder.last_traces(target))
    try:
        bwd_traces = list(thunder.last_backward_traces(target) or [])
    except Exception:
        bwd_traces = []
    param_names = _param_names(target, fwd_traces[-1])
    forward = snapshot_trace(fwd_traces[-1], label="forward", param_names=param_names)
    backward = snapshot_trace(bwd_traces[-1], label="backward") if bwd_traces else None
    _add_communication(forward, fwd_traces[-1], backward, bwd_traces[-1] if bwd_traces else None)
    stage_snaps: list[TraceSnapshot] = []
    if stages:
        for i, t in enumerate(fwd_traces):
            stage_snaps.append(snapshot_trace(t, label=_stage_label(t, i), param_names=param_names, memory=False))
    assign_modules(forward, backward)
    for s in stage_snaps:
        assign_modules(s, None)
    return TraceBundle(
        name=name or default_name,
        rank=_dist_rank() if rank is None else rank,
        world_size=_dist_world_size(),
        forward=forward,
        backward=backward,
        stages=stage_snaps,
        versions={"thunder": str(getattr(thunder, "__version__", "?")), "torch": str(torch.__version__)},
    )


def _add_communication(forward: TraceSnapshot, fwd: Any, backward: TraceSnapshot | None, bwd: Any) -> None:
    """What forward saves for backward, and the buckets thunderviz's communication pass laid out in each trace."""
    from thunderviz.thunder import hooks
    from thunderviz.trace.buckets import Bucket

    if bwd is not None:
        forward.saved_for_backward = [_tensor_ref(p) for p in hooks.saved_tensors(fwd)]
    forward.buckets = [Bucket.from_dict(b.to_dict()) for b in hooks.trace_buckets(fwd)]
    if backward is not None:
        backward.buckets = [Bucket.from_dict(b.to_dict()) for b in hooks.trace_buckets(bwd)]


# --------------------------------------------------------------------------------------------------------------
# What to capture


def _jitted_target(obj: Any) -> tuple[Any, str, str]:
    """(the jitted object whose traces to read, its default name, how to call it in messages)."""
    from torch import nn

    from thunderviz.thunder.hooks import is_jitted

    inner = _unwrap_fabric(obj)
    wrapped = inner is not obj
    if is_jitted(inner):
        kind = type(inner).__name__
        what = f"the {kind} inside Fabric's wrapper" if wrapped else f"the jitted {kind}"
        return inner, _default_name(inner), what
    if is_jitted(obj):
        return obj, _default_name(obj), f"the jitted {type(obj).__name__}"
    if isinstance(inner, nn.Module):
        fn = _function_that_traced(inner, type(obj).__name__)
        return fn, type(inner).__name__, f"the jitted function {_fn_name(fn)}"
    raise TraceCaptureError(
        f"capture(obj) needs what thunder.jit or fabric.setup returned; got {type(obj).__name__}. "
        "Jit it first (jm = thunder.jit(model)), run it once, then call capture(jm)."
    )


def _unwrap_fabric(obj: Any) -> Any:
    """The module inside Fabric's ``_FabricModule`` (without importing lightning: if it is not loaded, ``obj``
    cannot be one)."""
    for modname in _FABRIC_WRAPPER_MODULES:
        cls = getattr(sys.modules.get(modname), "_FabricModule", None)
        if cls is not None and isinstance(obj, cls):
            return obj._forward_module
    return obj


@dataclass
class _ModuleRead:
    """The tensors a trace's prologue read from one module argument: qualified name -> (proxy, shape, dtype)."""

    arg: str
    tensors: dict[str, tuple[str, tuple[int, ...], str]] = field(default_factory=dict)


def _prologue_reads(jitted: Any) -> list[_ModuleRead]:
    """What the last prologue of ``jitted`` unpacked from modules, from thunder's ``unpack_parameter`` and
    ``unpack_buffer`` records (exact, unlike matching proxy names)."""
    import thunder
    from thunder.core.prims import PrimIDs

    try:
        prologues = thunder.compile_stats(jitted).last_prologue_traces
    except Exception:
        return []
    if not prologues:
        return []
    arg_of: dict[str, str] = {}  # proxy name -> where it came from (function argument)
    reads: dict[str, _ModuleRead] = {}
    params = _signature_names(jitted)
    for b in prologues[-1].bound_symbols:
        sid = b.sym.id
        if sid == PrimIDs.UNPACK_GETITEM and len(b.args) == 2 and b.output is not None:
            container, key = b.args
            cname = getattr(container, "name", "")
            if cname == "args" and isinstance(key, int):
                arg_of[b.output.name] = params[key] if key < len(params) else f"arg{key}"
            elif cname == "kwargs":
                arg_of[b.output.name] = str(key)
        elif sid == PrimIDs.UNPACK_THUNDER_MODULE and b.output is not None:
            src = getattr(b.args[0], "name", "") if b.args else ""
            reads[b.output.name] = _ModuleRead(arg=arg_of.get(src, "self"))
        elif sid in (PrimIDs.UNPACK_PARAMETER, PrimIDs.UNPACK_BUFFER) and len(b.args) == 2:
            owner = reads.get(getattr(b.args[0], "name", ""))
            out = b.output
            if owner is not None and out is not None and hasattr(out, "shape"):
                qual = str(b.args[1]).removeprefix(_FABRIC_PREFIX)
                owner.tensors[qual] = (out.name, tuple(int(d) for d in out.shape), _dtype_name(out.dtype))
    return [r for r in reads.values() if r.tensors]


def _signature_names(jitted: Any) -> list[str]:
    import thunder

    try:
        fn = thunder.compile_data(jitted).fn
        return [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except Exception:
        return []


def _fits(module: Any, read: _ModuleRead) -> frozenset[int] | None:
    """The ids of ``module``'s tensors that fit ``read`` (same names, shapes, dtypes), or None when any does not."""
    ids = []
    for qual, (_proxy, shape, dtype) in read.tensors.items():
        t = None
        for getter in ("get_parameter", "get_buffer"):
            try:
                t = getattr(module, getter)(qual)
                break
            except Exception:
                continue
        if t is None or tuple(t.shape) != shape or _dtype_name(t.dtype) != dtype:
            return None
        ids.append(id(t))
    return frozenset(ids)


def _live_jitted_functions() -> list[Any]:
    """Every function ``thunder.jit`` returned that is still alive in this process (not ThunderModules)."""
    import thunder

    out = []
    for o in gc.get_objects():
        if type(o) is types.FunctionType and getattr(o, "_lc_cs", None) is not None:
            cd = thunder.compile_data(o)
            if cd is not None and not cd.is_module:
                out.append(o)
    return out


def _function_that_traced(module: Any, given: str) -> Any:
    """Case 2: the one jitted function whose last trace read ``module``'s parameters (see the module docstring)."""
    gc.collect()  # objects left in reference cycles (an earlier cell's model and function) are not candidates
    hits: list[tuple[Any, _ModuleRead, frozenset[int]]] = []
    for fn in _live_jitted_functions():
        for read in _prologue_reads(fn):
            ids = _fits(module, read)
            if ids:
                hits.append((fn, read, ids))
                break
    if not hits:
        raise TraceCaptureError(
            f"capture({given}): this {type(module).__name__} is not jitted (thunder.jit), and no jitted function in "
            "this process has traced it. Pass what thunder.jit or fabric.setup returned after one call; for a module "
            "set up with jit=False (case 2), call your jitted function once (loss = step(model, x)) and pass that "
            "function: capture(step)."
        )
    names = ", ".join(_fn_name(fn) for fn, _r, _i in hits)
    if len(hits) > 1:
        raise TraceCaptureError(
            f"capture({given}): {len(hits)} jitted functions traced this {type(module).__name__} ({names}), each with "
            f"its own traces; pass the one you mean, e.g. capture({_fn_name(hits[0][0])})."
        )
    fn, read, ids = hits[0]
    twins = _other_modules_that_fit(read, ids)
    if twins:
        raise TraceCaptureError(
            f"capture({given}): the jitted function {names} last traced a module with this "
            f"{type(module).__name__}'s parameter names and shapes, but {len(twins)} other live module(s) have them "
            f"too, so which one it traced cannot be told; pass the function: capture({names})."
        )
    return fn


def _other_modules_that_fit(read: _ModuleRead, own: frozenset[int]) -> set[frozenset[int]]:
    """Live modules other than the one whose tensors are ``own`` that would have fit ``read`` just as well.

    Wrappers (Fabric's, a ThunderModule) expose the same tensor objects as the module they wrap, so they count once.
    """
    from torch import nn

    found: set[frozenset[int]] = set()
    for o in gc.get_objects():
        if not issubclass(type(o), nn.Module):  # type(), not isinstance: some objects warn on __class__
            continue
        try:
            ids = _fits(o, read)
        except Exception:
            continue
        if ids and ids != own:
            found.add(ids)
    return found


def _fn_name(fn: Any) -> str:
    inner = getattr(fn, "__wrapped__", fn)
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(fn).__name__


# --------------------------------------------------------------------------------------------------------------
# One trace


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
        inputs=tuple(_tensor_ref(p) for p in inputs),
        outputs=tuple(_tensor_ref(p) for p in _unique(bsym.flat_proxy_outs)),
        source=_source_ref(bsym),
        python=python,
        collective=collective,
        group_size=group_size,
    )


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
        return TensorRef(
            name=p.name, kind=kind, shape=tuple(int(d) for d in p.shape), dtype=_dtype_name(p.dtype), device=device
        )
    if isinstance(p, CollectionProxy):
        return TensorRef(name=p.name, kind="collection")
    if isinstance(p, NumberProxy):
        return TensorRef(name=p.name, kind="number")
    return TensorRef(name=p.name, kind="other")


def _dtype_name(dtype: Any) -> str:
    """``thunder.dtypes.float32_`` and ``torch.float32`` -> ``float32`` (thunder spells weak dtypes with ``_``)."""
    return str(dtype).rsplit(".", 1)[-1].rstrip("_")


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

        for kind in COLLECTIVE_KINDS:
            impl = getattr(tx, f"{kind}_prim_impl", None)
            if impl is not None:
                kinds[impl.id] = kind
    except Exception:
        pass
    try:
        import thunder.distributed.prims as dp

        for kind in COLLECTIVE_KINDS:
            kinds[getattr(dp, kind).id] = kind
    except Exception:
        pass
    return kinds


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
    except Exception:
        return None


def _stage_label(trace: Any, i: int) -> str:
    prov = trace.get_provenance() if hasattr(trace, "get_provenance") else None
    if prov is None:
        return "computation" if i == 0 else f"stage {i}"
    text = str(prov).strip().removeprefix("# Constructed by ").strip()
    return re.sub(r"\s*\(took \d+ milliseconds\)", "", text)


def _param_names(jitted: Any, trace: Any) -> dict[str, str]:
    """Trace argument name -> qualified parameter/buffer name.

    From the prologue's own records when it has them (exact; a function that takes several modules gets each
    name prefixed by its argument, ``teacher.fc1.weight``), else by thunder's naming of module tensors.
    """
    reads = _prologue_reads(jitted)
    if reads:
        several = len(reads) > 1
        return {
            proxy: f"{r.arg}.{qual}" if several else qual for r in reads for qual, (proxy, _s, _d) in r.tensors.items()
        }
    return _param_names_by_sanitized_name(jitted, trace)


def _param_names_by_sanitized_name(obj: Any, trace: Any) -> dict[str, str]:
    named = getattr(obj, "named_parameters", None)
    if named is None:
        return {}
    by_sanitized: dict[str, str] = {}
    try:
        items = list(obj.named_parameters()) + list(obj.named_buffers())
    except Exception:
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
    except Exception:
        return 0


def _dist_world_size() -> int:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:
        return 1
