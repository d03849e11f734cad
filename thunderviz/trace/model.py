"""The trace model: what thunderviz keeps of a thunder trace, as plain dataclasses.

Thunder's trace objects hold live proxies, process groups and executors: they cannot be pickled, sent from a rank
process, or opened a week later. These classes hold what a person needs (ops, tensors, producer -> consumer edges,
collectives, source lines, a memory estimate) and nothing live, so they pickle as they are and every layer above
(ledger, diff, graphs, widgets) can work on them without thunder installed.

Where they come from and go to lives elsewhere, one job per module:
``thunderviz.thunder.capture.traces`` reads them from thunder's objects (the only part that imports thunder),
``thunderviz.trace.file`` writes and reads them as versioned, validated JSON.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from thunderviz.trace.buckets import Bucket

__all__ = [
    "BOOKKEEPING_OPS",
    "COLLECTIVE_KINDS",
    "TENSOR_KINDS",
    "OpRecord",
    "SourceRef",
    "TensorRef",
    "TraceBundle",
    "TraceSnapshot",
    "short_dtype",
    "short_op_name",
]

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

#: The values of ``OpRecord.collective``: the communication kinds thunder's distributed prims have, and ``wait``.
COLLECTIVE_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "wait")

#: The values of ``TensorRef.kind``; ``future`` is the result of an asynchronous collective until its ``wait``.
TENSOR_KINDS = ("tensor", "future", "collection", "number", "other")

_DTYPE_BYTES = {
    "bool": 1,
    "bool8": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
    "complex32": 4,
    "int64": 8,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
}


def short_dtype(dtype: str | None) -> str:
    """``float32`` -> ``f32``, ``bfloat16`` -> ``bf16``: the compact form used in graph labels."""
    if dtype is None:
        return "?"
    m = re.fullmatch(r"(float|int|uint|bfloat|complex)(\d+)", dtype)
    if m:
        return {"float": "f", "int": "i", "uint": "u", "bfloat": "bf", "complex": "c"}[m.group(1)] + m.group(2)
    return {"bool": "b8", "bool8": "b8"}.get(dtype, dtype)


@dataclass(frozen=True)
class TensorRef:
    """One value an op reads or writes. ``shape``/``dtype`` are None for non-tensors (collections, numbers).

    ``kind`` is one of ``TENSOR_KINDS``.
    """

    name: str
    kind: str = "tensor"
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
        return f"{short_dtype(self.dtype)}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class SourceRef:
    """Where an op came from in Python. Thunder records this for forward ops only (not for backward)."""

    file: str
    line: int
    code: str = ""

    def short(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass
class OpRecord:
    """One bound symbol of a trace; ``index`` is its position in ``TraceSnapshot.ops``.

    ``collective`` is one of ``COLLECTIVE_KINDS`` or None; ``module`` is the module path the op is attributed to
    (see ``thunderviz.trace.attribution``).
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
    #: a backward op that recomputes a forward op (activation checkpointing, ZERO3):
    #: ``thunder.capture.snapshot.recomputed_ops``
    recomputed: bool = False
    #: a fusion region (torch.compile's, nvFuser's): the ops it runs as one kernel call, in order. Drawn as one node
    #: that names them, inside the module its ops belong to (or named for the modules it spans).
    fused: tuple[str, ...] = ()
    #: a fusion region's ops themselves (``index`` = position in the region; inputs, outputs, module), when captured:
    #: what attribution reads to place the region and what the graph draws when the region is opened
    inner: tuple[OpRecord, ...] = ()

    @property
    def is_fusion(self) -> bool:
        return bool(self.fused)

    @property
    def is_collective(self) -> bool:
        return self.collective is not None and self.collective != "wait"

    @property
    def is_wait(self) -> bool:
        return self.collective == "wait"

    @property
    def is_bookkeeping(self) -> bool:
        return self.op in BOOKKEEPING_OPS


@dataclass
class TraceSnapshot:
    """One thunder trace, frozen.

    ``edges`` are ``(producer_index, consumer_index, tensor_name)`` from thunder's own producer/consumer maps.
    ``param_names`` maps trace argument names (``t_blocks_0_attn_proj_weight``) to the module's qualified
    parameter names (``blocks.0.attn_proj.weight``): proxy names lose dots and odd characters, the grouping
    needs the real path. ``return_names`` keeps positions (None for non-proxy outputs) so backward gradients
    can be matched to the forward inputs they belong to. ``saved_for_backward`` (forward traces) lists the tensors
    the forward keeps alive for backward; ``buckets`` are the collectives thunderviz's communication pass packed,
    each naming its parameters and pointing at its collective and wait ops (``parallel.buckets.Bucket``);
    ``accumulated`` (a backward traced under ``fabric.no_backward_sync``) the gradient buckets it adds to the
    unsharded accumulators instead of reducing them (kind ``accumulate``; their bytes stay allocated between
    micro-batches).
    """

    label: str
    ops: list[OpRecord]
    edges: list[tuple[int, int, str]] = field(default_factory=list)
    arg_names: list[str] = field(default_factory=list)
    return_names: list[str | None] = field(default_factory=list)
    param_names: dict[str, str] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    saved_for_backward: list[TensorRef] = field(default_factory=list)
    buckets: list[Bucket] = field(default_factory=list)
    accumulated: list[Bucket] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def collectives(self) -> list[OpRecord]:
        return [op for op in self.ops if op.collective is not None]

    @property
    def fusion_regions(self) -> list[OpRecord]:
        """The fusion regions of this trace (what a fusion executor made of the ops inside them)."""
        return [op for op in self.ops if op.fused]

    @property
    def recomputed_ops(self) -> int:
        """How many ops of this (backward) trace recompute forward ops instead of reading saved tensors."""
        return sum(1 for op in self.ops if op.recomputed)

    def tensor_inputs(self) -> list[TensorRef]:
        """The trace's tensor arguments that are not parameters, in argument order: a forward trace's batch."""
        wanted = [a for a in self.arg_names if a not in self.param_names]
        found: dict[str, TensorRef] = {}
        for op in self.ops:
            for t in (*op.outputs, *op.inputs):
                if t.name in wanted and t.kind == "tensor" and t.shape is not None:
                    found.setdefault(t.name, t)
        return [found[n] for n in wanted if n in found]

    def buckets_by_issue(self) -> dict[int, Bucket]:
        """Op index of each bucket's collective -> the bucket (what it sends, whose parameters)."""
        return {b.issue_index: b for b in self.buckets}

    def bucket_of(self, op_index: int) -> Bucket | None:
        """The bucket whose collective or wait is the op at ``op_index`` (None for anything else)."""
        for b in self.buckets:
            if op_index in (b.issue_index, b.wait_index):
                return b
        return None

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

    @property
    def saved_for_backward(self) -> dict[str, int]:
        """What the forward keeps alive for backward on this rank: ``{"tensors": n, "bytes": b}``."""
        saved = self.forward.saved_for_backward
        return {"tensors": len(saved), "bytes": sum(t.bytes or 0 for t in saved)}

    @property
    def accumulated_gradients(self) -> dict[str, int]:
        """What a no_backward_sync backward keeps between micro-batches on this rank: ``{"buckets", "params",
        "bytes"}`` (the unsharded gradients of every sharded parameter it accumulates)."""
        acc = self.backward.accumulated if self.backward is not None else []
        return {
            "buckets": len(acc),
            "params": sum(len(b.params) for b in acc),
            "bytes": sum(b.bytes for b in acc),
        }

    def gradient_params(self) -> dict[str, str]:
        """Backward tensor name -> qualified name of the parameter it is the gradient of.

        The backward trace returns one gradient per forward argument, in the same positions.
        """
        if self.backward is None or len(self.backward.return_names) != len(self.forward.arg_names):
            return {}
        return {
            g: self.forward.param_names[a]
            for g, a in zip(self.backward.return_names, self.forward.arg_names, strict=True)
            if g is not None and a in self.forward.param_names
        }

    def traces(self) -> dict[str, TraceSnapshot]:
        out = {"forward": self.forward}
        if self.backward is not None:
            out["backward"] = self.backward
        return out


def short_op_name(op: str) -> str:
    """``torch_all_gather_prim_impl`` -> ``all_gather``; ``torch.ops.aten.embedding_backward`` ->
    ``embedding_backward``: how graphs, search and diffs name an op (the trace model's, so a diff can count ops
    by the names a view shows without importing the renderer)."""
    name = op.rsplit(".", 1)[-1] if op.startswith("torch.ops.") else op
    name = re.sub(r"^torch_(prims_)?", "", name)
    return re.sub(r"(_prim)?_impl$", "", name)
