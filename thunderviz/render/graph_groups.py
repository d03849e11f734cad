"""Which ops one node of a trace graph stands for: a group per module block, and the ops that matter first.

``render.graph`` draws one node per block (``blocks.0``, ``lm_head``): ``group_ops`` splits a trace's ops into those
groups (a bucket's communication is a group of its own, see ``trace.attribution``), ``group_holding`` says which group
draws a module that a fusion region runs with others, and ``op_summary`` names a group's ops by what costs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from thunderviz.trace.attribution import SPAN, region_modules, top_group
from thunderviz.trace.buckets import Bucket
from thunderviz.trace.model import OpRecord, TraceSnapshot, short_op_name

__all__ = ["Group", "group_holding", "group_ops", "op_importance", "op_summary"]

# What a block's summary names first: the ops that cost (matmul, attention, embedding), then norms, softmax and
# reductions, then elementwise math; views and reshapes last (a block's commonest ops, and the least telling).
_HEAVY = ("linear", "matmul", "mm", "bmm", "addmm", "attention", "sdpa", "flash", "conv", "embedding")
_NORMS = (
    "norm",
    "var_mean",
    "rsqrt",
    "softmax",
    "gelu",
    "erf",
    "relu",
    "silu",
    "tanh",
    "entropy",
    "nll",
    "sum",
    "mean",
    "exp",
    "log",
)
_VIEWS = (
    "unsqueeze",
    "squeeze",
    "expand",
    "reshape",
    "view",
    "permute",
    "transpose",
    "shallow_copy",
    "broadcast",
    "slice",
    "split",
    "contiguous",
    "cat",
    "getitem",
    "flatten",
    "stride",
    "convert_element_type",
    "clone",
)


@dataclass
class Group:
    """The ops of one collapsed block, in trace order; ``bucket`` is set for a bucket's communication (its pack,
    collective, wait and unpack: one node of its own, see ``trace.attribution``)."""

    id: str
    name: str
    ops: list[OpRecord] = field(default_factory=list)
    bucket: Bucket | None = None

    @property
    def collectives(self) -> list[OpRecord]:
        return [op for op in self.ops if op.is_collective]

    @property
    def waits(self) -> list[OpRecord]:
        return [op for op in self.ops if op.is_wait]

    @property
    def compute(self) -> list[OpRecord]:
        return [op for op in self.ops if op.collective is None]

    @property
    def recomputed(self) -> list[OpRecord]:
        """Ops that recompute forward values in backward (activation checkpointing, ZERO3): drawn dashed."""
        return [op for op in self.ops if op.recomputed]

    @property
    def work(self) -> list[OpRecord]:
        """The compute ops as a person counts them: each fusion region whose ops were captured as those ops."""
        return [i for op in self.compute for i in ([x for x in op.inner if not x.is_bookkeeping] or [op])]

    @property
    def regions(self) -> list[OpRecord]:
        return [op for op in self.ops if op.fused]

    @property
    def spans(self) -> list[str]:
        """The modules this group's fusion regions run (several for a region named ``blocks.3 -> lm_head``), in order;
        [] for a group of one module's ops."""
        mods = dict.fromkeys(m for op in self.regions for m in region_modules(op))
        return list(mods) if SPAN in self.name or len(mods) > 1 else []


def op_importance(name: str) -> int:
    """0 for the ops that cost (matmul, attention, ...), 1 norms and reductions, 2 elementwise, 3 views/reshapes."""
    if any(k in name for k in _HEAVY):
        return 0
    if any(name == k or name.startswith(k) for k in _VIEWS):
        return 3
    return 1 if any(k in name for k in _NORMS) else 2


def op_summary(ops: list[OpRecord]) -> list[tuple[str, int]]:
    """``[("linear", 4), ("matmul", 2), ("softmax", 1), ...]``: counts by short op name, the ops that matter first
    (``op_importance``), then by count."""
    counts = Counter(short_op_name(op.op) for op in ops)
    return sorted(counts.items(), key=lambda kv: (op_importance(kv[0]), -kv[1], kv[0]))


def group_ops(snapshot: TraceSnapshot, *, include_bookkeeping: bool = False) -> list[Group]:
    """Split the trace's ops into collapsed groups, ordered by the median position of their compute ops.

    Not by their first op: FSDP issues every all_gather at the top of the forward trace, in parameter-name
    order, and thunder hoists a few cheap ops (a mask's ``arange``, a weight's ``unsqueeze``) far ahead of
    their block; the median is where the block's work actually happens.
    """
    by_name: dict[str, list[OpRecord]] = {}
    for op in snapshot.ops:
        if op.is_bookkeeping and not include_bookkeeping:
            continue
        by_name.setdefault(top_group(op.module), []).append(op)

    def position(ops: list[OpRecord]) -> float:
        idx = [op.index for op in ops if op.collective is None] or [op.index for op in ops]
        return idx[len(idx) // 2]

    names = sorted(by_name, key=lambda n: position(by_name[n]))
    buckets = {b.group: b for b in snapshot.buckets if len(b.params) > 1}
    return [Group(id=f"g{i}", name=n, ops=by_name[n], bucket=buckets.get(n)) for i, n in enumerate(names)]


def group_holding(groups: list[Group], name: str) -> str | None:
    """The group a module is drawn in: its own, else the group whose fusion regions run most of its ops (``ln_f`` is
    in ``blocks.3 -> lm_head``); None when no group holds it."""
    if any(g.name == name for g in groups):
        return name
    holding = {g.name: sum(top_group(i.module) == name for op in g.regions for i in op.inner) for g in groups}
    best = max(holding, key=lambda n: holding[n], default=None)
    return best if best is not None and holding[best] else None
