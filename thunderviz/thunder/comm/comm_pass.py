"""Rewriting thunder's execution traces so parameter collectives go in buckets, early, and are waited for late.

Why a pass on the *execution* traces: thunder 0.2.6 turns each distributed parameter into one collective (forward
``all_gather``, backward ``reduce_scatter`` / ``all_reduce`` from ``synchronize``'s VJP), and its own bucketing
passes (``FSDPCommBucketing``, ``apply_bucketing_to_grad_allreduce``) never run on our path: the first reads
attributes of ``thunder.distributed.fsdp``'s module, the second looks for ``dist_prims.WAIT`` in a trace whose waits
were already claimed by the torch executor. The final forward and backward traces are where every executor
(torch, nvFuser, torch.compile) has made its choices, so moving collectives there cannot disturb a fusion, and
thunder offers exactly this hook: ``Transform.transform_trace_post_optimization``, called on the forward and then
the backward trace of every new cache entry.

What the pass does (``CommTransform``), one module per step so that each step's reasons sit beside its code:

- ``gathers``: the forward (and, for ZERO3, backward) ``all_gather``s of one bucket (``parallel.buckets``) become one
  collective, issued one bucket ahead of first use.
- ``reductions``: the backward ``reduce_scatter`` (FSDP) / ``all_reduce`` (DDP) of one bucket's gradients become one
  collective, divided by the world size once, issued as the last of them appears and waited for when the next
  bucket is issued (a reduce_scatter) or before the return (an all_reduce); under hybrid sharding each reduced shard
  is all-reduced across its replica group; under no_backward_sync sharded buckets are accumulated, not reduced.
- ``zero3_saves``: ZERO3's forward saves shards instead of tensors made from unsharded weights, and backward gathers
  them again to recompute those tensors.
- ``ops`` holds the operators these steps insert (packs and unpacks), ``bucket_code`` what they share (reading a
  trace, a bucket's members and code), and ``fusion_regions`` opens the fusion regions before the rewrite and fuses
  again after it.

Parameters are recognised by the shard's proxy name, recorded while tracing (``note_param``); collectives of
anything else are left alone, and so is a trace with no configured parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from thunder.core.proxies import Proxy
from thunder.core.trace import TraceTag, from_trace
from thunder.core.transform_common import Transform

from thunderviz.thunder.comm.bucket_code import ParamRecord, strip_dels
from thunderviz.thunder.comm.collectives import executed_collective_ids
from thunderviz.thunder.comm.fusion_regions import open_regions, refuse
from thunderviz.thunder.comm.gathers import rewrite_gathers
from thunderviz.thunder.comm.reductions import rewrite_reductions
from thunderviz.thunder.comm.zero3_saves import (
    Zero3Plan,
    drop_weight_saves,
    resharded_weights,
    restore_weight_saves,
)
from thunderviz.thunder.compat import ensure_supported_thunder
from thunderviz.trace.buckets import Bucket

ensure_supported_thunder()  # everything below reads thunder 0.2.6's trace format

__all__ = [
    "CommTransform",
    "ParamRecord",
    "comm_transform_of",
    "ensure_comm_transform",
]


class CommTransform(Transform):
    """Buckets and schedules the collectives of the parameters thunderviz distributed (see the module doc).

    One instance lives in a jitted object's ``compile_data.transforms``; ``note_param`` fills it while thunder
    traces, and each new cache entry's forward and backward traces go through ``transform_trace_post_optimization``.
    ``buckets`` holds the layout of the last entry built, for tests, reports and the ledger.
    """

    def __init__(self) -> None:
        self.pending: dict[str, ParamRecord] = {}
        self.pending_kept: list[Any] = []
        self.current: dict[str, ParamRecord] = {}
        self.forward_flat_args: list[str | None] | None = None
        self.zero3: Zero3Plan | None = None
        self.buckets: dict[str, list[Bucket]] = {}
        #: the entry being built was traced under no_backward_sync: its backward accumulates, never reduces
        self.accumulating = False
        self.accumulated: list[Bucket] = []

    def note_param(self, shard_name: str, record: ParamRecord) -> None:
        self.pending[shard_name] = record

    def note_kept(self, proxies: Sequence[Any]) -> None:
        """Proxies of gathered parameters that backward must find saved, never recompute (ZERO2)."""
        self.pending_kept.extend(proxies)

    def transform_traces_pre_prologue(
        self, prologue_trace: Any, computation_trace: Any, epilogue_trace: Any, **kwargs: Any
    ) -> tuple[Any, Any, Any]:
        # A ZERO2 parameter first read inside a checkpointed region was gathered inside it, so thunder's checkpoint
        # lookaside tagged its gathered value *recompute in backward* along with the region: backward would gather
        # it again (ZERO3's cost without being asked). Gathered parameters are not activations: untag them.
        from thunder.core.proxies import ProxyTag

        for proxy in self.pending_kept:
            proxy.tags.discard(ProxyTag.RECOMPUTE_IN_BACKWARD)
        self.pending_kept = []
        # Tracing just finished: what it recorded belongs to the cache entry being built now.
        self.current, self.pending = self.pending, {}
        self.forward_flat_args = None
        self.zero3 = None
        self.buckets = {}
        self.accumulated = []
        from thunder.distributed import get_skip_data_parallel_grad_sync

        self.accumulating = bool(get_skip_data_parallel_grad_sync())
        return prologue_trace, computation_trace, epilogue_trace

    def transform_trace_post_optimization(self, computation_trace: Any, **kwargs: Any) -> Any:
        if not self.current:
            return computation_trace
        if TraceTag.BACKWARD in computation_trace.tags:
            return self._backward(computation_trace)
        return self._forward(computation_trace)

    def _forward(self, trace: Any) -> Any:
        ret = trace.bound_symbols[-1]
        if ret.args and isinstance(ret.args[0], dict) and "flat_args" in ret.args[0]:
            self.forward_flat_args = [getattr(a, "name", None) for a in ret.args[0]["flat_args"]]
        new_trace = from_trace(trace)
        bsyms, fusers = open_regions(strip_dels(trace.bound_symbols))
        bsyms, gathers = rewrite_gathers(new_trace, bsyms, self.current, "forward")
        self.buckets["forward"] = gathers
        if not gathers:
            return trace
        resharded = resharded_weights(bsyms, gathers, self.current)
        if resharded and TraceTag.AUGMENTED_FORWARD in trace.tags:
            bsyms, self.zero3 = drop_weight_saves(bsyms, resharded)
        new_trace, bsyms = refuse(new_trace, bsyms, fusers)
        return _finish(new_trace, bsyms, backward=False, buckets=gathers)

    def _backward(self, trace: Any) -> Any:
        new_trace = from_trace(trace)
        bsyms, fusers = open_regions(strip_dels(trace.bound_symbols))
        if self.zero3 is not None:
            bsyms = restore_weight_saves(new_trace, bsyms, self.zero3)
        bsyms, gathers = rewrite_gathers(new_trace, bsyms, self.current, "backward")
        grad_records: dict[str, ParamRecord] = {}
        outs = bsyms[-1].args[0] if bsyms[-1].args else ()
        if self.forward_flat_args is not None and isinstance(outs, (tuple, list)):
            # The backward returns one gradient per forward input, in the order of the forward's flat_args.
            for name, out in zip(self.forward_flat_args, outs, strict=False):
                if name in self.current and isinstance(out, Proxy):
                    grad_records[out.name] = self.current[name]
        bsyms, reductions = rewrite_reductions(new_trace, bsyms, grad_records, "backward", accumulate=self.accumulating)
        self.accumulated = [b for b in reductions if b.kind == "accumulate"]
        reductions = [b for b in reductions if b.kind != "accumulate"]
        self.buckets["backward"] = gathers + reductions
        if not gathers and not reductions and not self.accumulated:
            return trace
        new_trace, bsyms = refuse(new_trace, bsyms, fusers)
        return _finish(new_trace, bsyms, backward=True, buckets=gathers + reductions, accumulated=self.accumulated)


def _finish(
    new_trace: Any, bsyms: list[Any], *, backward: bool, buckets: list[Bucket], accumulated: Sequence[Bucket] = ()
) -> Any:
    from thunder.core.trace import TraceProvenance
    from thunder.executors.passes import del_last_used

    new_trace.bound_symbols = bsyms
    done = del_last_used(new_trace, clear_mutable_collections=backward)
    # Positions in the final trace (``del``s included), where captures and ledgers will look for them.
    issued: dict[str, int] = {}
    waited: dict[str, int] = {}
    wait_id = executed_collective_ids()["wait"]
    for i, b in enumerate(done.bound_symbols):
        for p in b.flat_proxy_outs:
            issued.setdefault(p.name, i)
        if b.sym.id == wait_id and b.flat_proxy_args:
            waited[b.flat_proxy_args[0].name] = i
    for bucket in buckets:
        bucket.issue_index = issued[bucket.future]
        bucket.wait_index = waited[bucket.future]
    for bucket in accumulated:  # no collective: the one op that adds the bucket to its accumulators
        bucket.issue_index = bucket.wait_index = issued[bucket.future]
    done._thunderviz_buckets = list(buckets)  # read back by compile_state.trace_buckets (capture)
    done._thunderviz_accumulated = list(accumulated)  # compile_state.trace_accumulated
    kinds: dict[str, int] = {}
    for b in [*buckets, *accumulated]:
        kinds[b.kind] = kinds.get(b.kind, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in kinds.items())
    done.set_provenance(TraceProvenance(f"thunderviz communication buckets ({summary})"))
    return done


def comm_transform_of(compile_data: Any) -> Any | None:
    """The ``CommTransform`` in a compile data's transforms, or None."""
    for t in getattr(compile_data, "transforms", None) or ():
        if isinstance(t, CommTransform):
            return t
    return None


def ensure_comm_transform(compile_data: Any) -> Any:
    """The compile data's ``CommTransform``, appended to its transforms on first use.

    thunder iterates that very list after tracing, so a transform appended while tracing still runs for this entry.
    """
    found = comm_transform_of(compile_data)
    if found is not None:
        return found
    transforms = compile_data.transforms
    if not isinstance(transforms, list):
        from thunderviz.errors import UnsupportedThunderError

        raise UnsupportedThunderError(
            f"thunderviz adds its communication pass to the jitted function's transforms, but they are a"
            f" {type(transforms).__name__}, not a list. Pass `transforms=[...]` as a list to `thunder.jit`."
        )
    t = CommTransform()
    transforms.append(t)
    return t
