"""The communication pass (``thunderviz.thunder.comm``: ``comm_pass`` and its steps) on real thunder traces of small
models, in one process.

The seam: thunder builds a cache entry — tracing, autodiff, the executors' passes and every transform's
``transform_trace_post_optimization``, the communication pass among them — in
``compile_data.get_computation_and_inputs``, which runs the prologue but never the computation. The parameters are
sharded as rank 0 of 2 would hold them (FSDP) or left whole (DDP) and tagged with ``ProcessGroup(0, 2)``: a bare
handle with a size and no backend, so the traces hold real collectives over a world of 2 while nothing can
communicate (running one would raise). A recording transform ahead of the pass keeps the traces the pass was given,
so the same pass can be run again on them under other bucket plans (``_rerun``): three traced models cover
NONE / LAYER / BLOCK, ZERO2 / ZERO3 and DDP's size caps.

What the 2-rank runs (``tests/strategies/test_comm_2rank.py``) check end to end with numbers, these check on the
trace itself: which parameters share a bucket, that bucket k+1 is issued just before bucket k is waited for, that
waits sit right before first use (forward) or right before the return (backward reductions), what ZERO3 gathers in
backward and saves in forward, and where DDP's size-capped buckets close.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import thunder
import torch
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceTag
from thunder.core.transform_common import Transform
from torch import nn
from torch.distributed import ProcessGroup

from thunderviz.parallel.buckets import CommConfig, bucket_label, find_blocks
from thunderviz.parallel.strategy_options import parse_options
from thunderviz.thunder import compile_state, hooks, param_tags
from thunderviz.thunder.comm import distribute
from thunderviz.thunder.comm.comm_pass import CommTransform, ParamRecord, comm_transform_of
from thunderviz.thunder.comm.gathers import rewrite_gathers
from thunderviz.thunder.comm.ops import _pack_gather_impl, _pack_scatter_impl, _unpack_gather_impl
from thunderviz.thunder.comm.reductions import rewrite_reductions
from thunderviz.thunder.comm.setup import configure_comm
from thunderviz.trace.buckets import Bucket

WORLD = 2
MIB = 1024 * 1024

# What a trace may hold between a collective's issue and its wait, or between a wait and the first use of what it
# brought, without that being compute the collective should have overlapped or waited behind.
GATHER_BOOKKEEPING = {
    "thunderviz_pack_for_all_gather",
    "torch_all_gather_prim_impl",
    "torch_wait_prim_impl",
    "thunderviz_unpack_all_gather",
    "python_del",
}
AFTER_REDUCTION_WAITS = {
    "torch_wait_prim_impl",
    "thunderviz_unpack_views",
    "python_del",
    "clear_mutable_collection",
    "python_return",
}
REDUCE_ISSUE = {
    "thunderviz_pack_for_reduce_scatter",
    "thunderviz_pack_for_all_reduce",
    "torch_reduce_scatter_prim_impl",
    "torch_all_reduce_prim_impl",
    "python_del",
}


# -- the models ----------------------------------------------------------------------------------------------------


class Block(nn.Module):
    """First dims 7 and 6: sharding over 2 ranks pads fc1 and norm (7 -> 8) but not fc2."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 7)
        self.norm = nn.LayerNorm(7)
        self.fc2 = nn.Linear(7, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.tanh(self.fc1(x)))
        return self.fc2(h.to(self.fc2.weight.dtype)).float()


class Net(nn.Module):
    """An embedding, a list of two blocks (BLOCK's buckets) and a head; ``blocks.1.fc2`` is bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(9, 6)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(6, 9, bias=False)
        self.blocks[1].fc2.to(torch.bfloat16)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class Tower(nn.Module):
    """DDP: ``wide.weight`` alone is over 1 MiB (torch DDP's first bucket); ``out`` is bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 300)
        self.wide = nn.Linear(300, 1000)
        self.out = nn.Linear(1000, 4).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.wide(torch.tanh(self.inp(x))))
        return self.out(h.to(torch.bfloat16)).float()


NET_PARAMS = [n for n, _ in Net().named_parameters()]


# -- tracing without communicating --------------------------------------------------------------------------------


class _Recorder(Transform):
    """Keeps the forward and backward execution traces as thunder hands them to the transforms after it."""

    def __init__(self) -> None:
        self.forward: Any = None
        self.backward: Any = None

    def transform_trace_post_optimization(self, computation_trace: Any, **kwargs: Any) -> Any:
        if TraceTag.BACKWARD in computation_trace.tags:
            self.backward = computation_trace
        else:
            self.forward = computation_trace
        return computation_trace


@dataclass
class Pass:
    """What the communication pass made: the forward and backward traces, their buckets, ZERO3's recompute plan."""

    forward: Any
    backward: Any
    buckets: dict[str, list[Bucket]]
    zero3: Any


@dataclass
class Traced(Pass):
    """One model traced by thunder, the pass included: also the traces the pass was given, and its records."""

    model: nn.Module
    jitted: Any
    records: dict[str, ParamRecord]  # shard proxy name -> record
    forward_in: Any
    backward_in: Any


def _trace_without_communicating(
    model: nn.Module,
    batch: torch.Tensor,
    parallelism: str,
    sharding: str = "ZERO2",
    bucketing: str = "BLOCK",
    options: dict[str, Any] | None = None,
) -> Traced:
    hooks.install_sync_hook()
    group = ProcessGroup(0, WORLD)  # a size and no backend: a collective run on it would raise
    for _, param in model.named_parameters():
        full = tuple(param.shape)
        if parallelism == "fsdp":
            param.data, padding = distribute.shard_tensor(param.data, 0, WORLD)
            param_tags.tag_param(
                param, param_tags.SyncKind.FULLY_SHARDED, group=group, padding=padding, full_shape=full
            )
        else:
            param_tags.tag_param(param, param_tags.SyncKind.REPLICATED, group=group, padding=0, full_shape=full)
    recorder = _Recorder()
    jitted = thunder.jit(model, transforms=[recorder])
    if parallelism == "ddp":
        hooks.mark_module_ddp(model, jitted, group, 25.0)
    knobs = {"sharding_strategy": sharding, "bucketing_strategy": bucketing} if parallelism == "fsdp" else {}
    configure_comm(model, parse_options(parallelism, {**knobs, **(options or {})}))
    cd = thunder.compile_data(jitted)
    entry, _inputs, _ = cd.get_computation_and_inputs(batch)
    transform = comm_transform_of(cd)
    assert recorder.forward is not None and recorder.backward is not None
    return Traced(
        forward=entry.computation_traces[-1],
        backward=entry.backward_traces[-1],
        buckets=dict(transform.buckets),
        zero3=transform.zero3,
        model=model,
        jitted=jitted,
        records=dict(transform.current),
        forward_in=recorder.forward,
        backward_in=recorder.backward,
    )


def _rerun(traced: Traced, change: Callable[[CommConfig], dict[str, Any]]) -> Pass:
    """The pass again, as thunder calls it, on the same traces with each parameter's plan changed by ``change``."""
    t = CommTransform()
    for shard, rec in traced.records.items():
        t.note_param(shard, dataclasses.replace(rec, config=dataclasses.replace(rec.config, **change(rec.config))))
    t.transform_traces_pre_prologue(None, None, None)
    forward = t.transform_trace_post_optimization(traced.forward_in)
    backward = t.transform_trace_post_optimization(traced.backward_in)
    return Pass(forward, backward, dict(t.buckets), t.zero3)


def _relabel(traced: Traced, bucketing: str) -> Pass:
    blocks = find_blocks(traced.model)
    return _rerun(traced, lambda c: {"label": bucket_label(c.param_name, bucketing, blocks), "bucketing": bucketing})


def _batch() -> torch.Tensor:
    return torch.randint(0, 9, (4, 3), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def zero2() -> Traced:
    torch.manual_seed(0)
    return _trace_without_communicating(Net(), _batch(), "fsdp", "ZERO2", "BLOCK")


@pytest.fixture(scope="module")
def zero3() -> Traced:
    torch.manual_seed(0)
    return _trace_without_communicating(Net(), _batch(), "fsdp", "ZERO3", "BLOCK")


@pytest.fixture(scope="module")
def ddp() -> Traced:
    torch.manual_seed(0)
    return _trace_without_communicating(Tower(), torch.randn(5, 8), "ddp")


# -- reading traces ------------------------------------------------------------------------------------------------


def _names(trace: Any) -> list[str]:
    return [b.sym.name for b in trace.bound_symbols]


def _producer(trace: Any, name: str) -> int:
    return next(i for i, b in enumerate(trace.bound_symbols) if name in {p.name for p in b.flat_proxy_outs})


def _consumers(trace: Any, name: str) -> list[int]:
    return [
        i
        for i, b in enumerate(trace.bound_symbols)
        if b.sym.name != "python_del" and name in {p.name for p in b.flat_proxy_args}
    ]


def _between(trace: Any, start: int, stop: int) -> set[str]:
    return set(_names(trace)[start + 1 : stop])


def _dtype(p: Any) -> str:
    return str(p.dtype).rpartition(".")[2]


def _layout(buckets: list[Bucket], kind: str) -> set[tuple[str, str, frozenset[str]]]:
    return {(b.label, b.dtype, frozenset(b.params)) for b in buckets if b.kind == kind}


def _issue_and_wait(trace: Any, bucket: Bucket) -> tuple[int, int]:
    """Where the bucket's collective and its wait are in the trace, found from the trace itself."""
    issue = _producer(trace, bucket.future)
    (wait,) = [i for i in _consumers(trace, bucket.future) if trace.bound_symbols[i].sym.name == "torch_wait_prim_impl"]
    assert (issue, wait) == (bucket.issue_index, bucket.wait_index), f"bucket {bucket.label}: recorded positions"
    return issue, wait


def _collectives(trace: Any) -> dict[str, int]:
    kinds = ("all_gather", "reduce_scatter", "all_reduce", "wait")
    return {k: n for k in kinds if (n := sum(name == f"torch_{k}_prim_impl" for name in _names(trace)))}


# -- bucket layout -------------------------------------------------------------------------------------------------

ROOT = frozenset({"emb.weight", "head.weight"})
BLOCK0 = frozenset(n for n in NET_PARAMS if n.startswith("blocks.0."))
BLOCK1_F32 = frozenset(f"blocks.1.{m}.{w}" for m in ("fc1", "norm") for w in ("weight", "bias"))
BLOCK1_BF16 = frozenset({"blocks.1.fc2.weight", "blocks.1.fc2.bias"})
EXPECTED_LAYOUT = {
    "NONE": {(n, "bfloat16" if n.startswith("blocks.1.fc2") else "float32", frozenset({n})) for n in NET_PARAMS},
    "LAYER": {("emb", "float32", frozenset({"emb.weight"})), ("head", "float32", frozenset({"head.weight"}))}
    | {
        (
            f"blocks.{i}.{m}",
            "bfloat16" if (i, m) == (1, "fc2") else "float32",
            frozenset({f"blocks.{i}.{m}.weight", f"blocks.{i}.{m}.bias"}),
        )
        for i in range(2)
        for m in ("fc1", "norm", "fc2")
    },
    "BLOCK": {
        ("(root)", "float32", ROOT),
        ("blocks.0", "float32", BLOCK0),
        ("blocks.1", "float32", BLOCK1_F32),
        ("blocks.1", "bfloat16", BLOCK1_BF16),  # one block, two dtypes: two collectives under one label
    },
}


@pytest.mark.parametrize("bucketing", ["NONE", "LAYER", "BLOCK"])
def test_which_parameters_share_a_bucket(zero2, bucketing):
    got = _relabel(zero2, bucketing)
    expected = EXPECTED_LAYOUT[bucketing]
    assert _layout(got.buckets["forward"], "all_gather") == expected
    assert _layout(got.buckets["backward"], "reduce_scatter") == expected  # every parameter here is trainable
    # One collective per bucket, each moving one dtype: the shards packed together are of the bucket's dtype.
    assert _collectives(got.forward) == {"all_gather": len(expected), "wait": len(expected)}
    assert _collectives(got.backward) == {"reduce_scatter": len(expected), "wait": len(expected)}
    shards = {p.name: p for p in zero2.forward_in.args if isinstance(p, TensorProxy)}
    for b in got.buckets["forward"]:
        assert {_dtype(shards[s]) for s in b.sends} == {b.dtype}
        assert b.bytes == sum(shards[s].numel * shards[s].dtype.bytes for s in b.sends)


def test_the_strategy_plan_is_what_the_pass_ran_in_the_pipeline(zero2):
    """thunder itself ran the pass while building the cache entry: its output is the last trace of the entry."""
    assert _layout(zero2.buckets["forward"], "all_gather") == EXPECTED_LAYOUT["BLOCK"]
    assert compile_state.trace_buckets(zero2.forward) == zero2.buckets["forward"]
    assert compile_state.trace_buckets(zero2.backward) == zero2.buckets["backward"]
    # Before the pass: one all_gather / reduce_scatter per parameter, as synchronize made them.
    n = len(NET_PARAMS)
    assert _collectives(zero2.forward_in) == {"all_gather": n, "wait": n}
    assert _collectives(zero2.backward_in) == {"reduce_scatter": n, "wait": n}
    assert "thunderviz communication buckets (4 all_gather)" in str(zero2.forward.get_provenance())


def test_a_trace_without_planned_parameters_is_left_alone(zero2):
    bsyms = list(zero2.forward_in.bound_symbols)
    assert rewrite_gathers(zero2.forward_in, bsyms, {}, "forward") == (bsyms, [])
    bsyms = list(zero2.backward_in.bound_symbols)
    assert rewrite_reductions(zero2.backward_in, bsyms, {}, "backward") == (bsyms, [])
    untouched = CommTransform()
    untouched.transform_traces_pre_prologue(None, None, None)
    assert untouched.transform_trace_post_optimization(zero2.forward_in) is zero2.forward_in


# -- forward: prefetch one bucket ahead, wait right before first use ------------------------------------------------


def _check_prefetch_and_waits(trace: Any, gathers: list[Bucket]) -> None:
    """Gathers in order of use: bucket k+1 issued just before bucket k's wait, each wait right before first use."""
    gathers = sorted(gathers, key=lambda b: b.wait_index)
    where = {id(b): _issue_and_wait(trace, b) for b in gathers}
    for this, nxt in itertools.pairwise(gathers):
        (_, wait), (issue_next, _) = where[id(this)], where[id(nxt)]
        # Bucket k+1 is in flight before bucket k is waited for, and issued no earlier than that: one bucket ahead.
        assert issue_next < wait, f"{nxt.label} is not prefetched before {this.label} is waited for"
        assert _between(trace, issue_next, wait) <= GATHER_BOOKKEEPING, f"{nxt.label} is issued too early"
    for b in gathers:
        _, wait = where[id(b)]
        first_use = min(i for r in b.results for i in _consumers(trace, r) if i > wait)
        assert _between(trace, wait, first_use) <= GATHER_BOOKKEEPING, f"{b.label} waited for before it is needed"


@pytest.mark.parametrize("bucketing", ["NONE", "LAYER", "BLOCK"])
def test_forward_prefetches_one_bucket_ahead_and_waits_before_first_use(zero2, bucketing):
    got = _relabel(zero2, bucketing)
    names = _names(got.forward)
    first_compute = min(i for i, n in enumerate(names) if n not in GATHER_BOOKKEEPING | {"unpack_trivial"})
    assert min(b.issue_index for b in got.buckets["forward"]) < first_compute
    _check_prefetch_and_waits(got.forward, got.buckets["forward"])


# -- backward: reductions issued as their last gradient appears; a reduce_scatter waited for when the next is issued --


def _check_reductions(trace: Any, reductions: list[Bucket]) -> None:
    """Each bucket issued right after its last gradient exists. An all_reduce (DDP: its bucket is the gradients) is
    waited for just before the return; a reduce_scatter right before the next bucket is packed (its input, the
    unsharded gradients, is freed then: one in flight) and the last one just before the return."""
    assert reductions
    ret = len(trace.bound_symbols) - 1
    assert trace.bound_symbols[ret].sym.name == "python_return"
    returned = {p.name for p in trace.bound_symbols[ret].flat_proxy_args}
    ordered = sorted(reductions, key=lambda b: b.issue_index)
    # before a reduce_scatter is issued, the one before it is waited for
    bookkeeping = REDUCE_ISSUE | (AFTER_REDUCTION_WAITS if ordered[0].kind == "reduce_scatter" else set())
    for b in ordered:
        issue, _ = _issue_and_wait(trace, b)
        assert set(b.results) <= returned
        last_ready = max(_producer(trace, s) for s in b.sends)
        assert last_ready < issue
        assert _between(trace, last_ready, issue) <= bookkeeping, f"{b.label}: issued later than its gradients exist"
    if {b.kind for b in reductions} == {"all_reduce"}:
        first_wait = min(_issue_and_wait(trace, b)[1] for b in reductions)
        assert _between(trace, first_wait - 1, ret) <= AFTER_REDUCTION_WAITS, "compute after a reduction's wait"
        assert max(b.issue_index for b in reductions) < first_wait
        return
    for b, after in zip(ordered, [*ordered[1:], None], strict=True):
        issue, wait = _issue_and_wait(trace, b)
        assert issue < wait, b.label
        if after is None:
            assert _between(trace, wait - 1, ret) <= AFTER_REDUCTION_WAITS, "compute after the last reduction's wait"
        else:
            pack = after.issue_index
            assert wait < pack, f"{b.label}: waited for after the next bucket was issued"
            assert _between(trace, wait, pack) <= AFTER_REDUCTION_WAITS | REDUCE_ISSUE, f"{b.label}: waited early"


def test_fsdp_reductions_wait_one_bucket_in_flight(zero2):
    reductions = zero2.buckets["backward"]
    assert {b.kind for b in reductions} == {"reduce_scatter"}
    _check_reductions(zero2.backward, reductions)
    # Issued in the order backward completes the gradients: the last block's first, the embedding's last.
    order = [(b.label, b.dtype) for b in sorted(reductions, key=lambda b: b.issue_index)]
    assert order == [("blocks.1", "bfloat16"), ("blocks.1", "float32"), ("blocks.0", "float32"), ("(root)", "float32")]


def test_gradients_are_divided_by_the_world_size_once_per_bucket(zero2):
    """synchronize's VJP divides each gradient by the world size; the pass folds those divisions into the pack."""

    def divisions(trace: Any) -> int:
        return sum(b.sym.name == "true_divide" and b.args[1:] == (WORLD,) for b in trace.bound_symbols)

    packs = [b for b in zero2.backward.bound_symbols if b.sym.name == "thunderviz_pack_for_reduce_scatter"]
    assert len(packs) == len(zero2.buckets["backward"])
    assert all(p.args[1:3] == (WORLD, True) for p in packs)  # world, divide
    assert divisions(zero2.backward_in) - divisions(zero2.backward) == len(NET_PARAMS)


# -- ZERO3 ---------------------------------------------------------------------------------------------------------


def _derived_from(trace: Any, roots: set[str]) -> set[str]:
    """Names computed from nothing but ``roots`` (the unsharded weights, their views, casts and transposes)."""
    derived = set(roots)
    for b in trace.bound_symbols:
        args = [p.name for p in b.flat_proxy_args]
        if args and all(a in derived for a in args):
            derived.update(p.name for p in b.flat_proxy_outs)
    return derived


def _saved_from_unsharded_weights(traced_pass: Pass) -> tuple[list[str], set[str]]:
    gathered = {r for b in traced_pass.buckets["forward"] for r in b.results}
    saved = [t.name for t in compile_state.saved_tensors(traced_pass.forward)]
    derived = _derived_from(traced_pass.forward, gathered)
    return [n for n in saved if n in derived], set(saved)


def test_zero3_forward_saves_shards_not_unsharded_weights(zero2, zero3):
    assert all(b.reshard_after_forward for b in zero3.buckets["forward"])
    assert not any(b.reshard_after_forward for b in zero2.buckets["forward"])
    kept2, _ = _saved_from_unsharded_weights(zero2)
    kept3, saved3 = _saved_from_unsharded_weights(zero3)
    assert kept2, "ZERO2 keeps unsharded weights for backward (else this check proves nothing)"
    assert kept3 == []
    regathered = {s for b in zero3.buckets["backward"] if b.kind == "all_gather" for s in b.sends}
    assert regathered and regathered <= saved3 & set(zero3.records)  # shards, which backward gathers again


@pytest.mark.parametrize("bucketing", ["BLOCK", "NONE"])
def test_zero3_backward_gathers_the_shards_again_in_buckets(zero3, bucketing):
    got = zero3 if bucketing == "BLOCK" else _relabel(zero3, "NONE")
    gathers = [b for b in got.buckets["backward"] if b.kind == "all_gather"]
    assert gathers
    trace = got.backward
    shards = set(zero3.records)
    assert {s for b in gathers for s in b.sends} <= shards, "backward gathers something other than parameter shards"
    _check_prefetch_and_waits(trace, gathers)
    # What forward stopped saving is recomputed from the gathered weights right before backward first needs it.
    assert got.zero3 is not None and got.zero3.removed
    recomputed = {o.name for chain in got.zero3.chains.values() for b in chain for o in b.flat_proxy_outs}
    for name in got.zero3.removed:
        made = _producer(trace, name)
        first_use = min(i for i in _consumers(trace, name) if i > made)
        between = [trace.bound_symbols[i] for i in range(made + 1, first_use)]
        assert all(
            b.sym.name in GATHER_BOOKKEEPING or {o.name for o in b.flat_proxy_outs} <= recomputed for b in between
        ), f"{name} is recomputed long before backward uses it"
    # Every weight backward needs is gathered once, in as many collectives as buckets.
    params = [p for b in gathers for p in b.params]
    assert len(params) == len(set(params))
    assert _collectives(trace)["all_gather"] == len(gathers)
    if bucketing == "BLOCK":
        labels = {(b.label, b.dtype) for b in gathers}
        assert labels == {
            ("(root)", "float32"),
            ("blocks.0", "float32"),
            ("blocks.1", "float32"),
            ("blocks.1", "bfloat16"),
        }
    # ZERO3's forward is ZERO2's plus nothing: the same gathers, prefetched the same way.
    assert _layout(got.buckets["forward"], "all_gather") == EXPECTED_LAYOUT[bucketing]
    assert not _saved_from_unsharded_weights(got)[0]


def test_zero2_backward_gathers_nothing(zero2):
    assert [b for b in zero2.buckets["backward"] if b.kind == "all_gather"] == []
    assert "all_gather" not in _collectives(zero2.backward)


# -- DDP: size-capped buckets in gradient-ready order -----------------------------------------------------------------


def _ready_order(traced: Traced) -> list[str]:
    """Parameter names in the order the backward trace (before the pass) completes their gradients."""
    bw = traced.backward_in
    shard_to_param = {s: rec.config.param_name for s, rec in traced.records.items()}
    assert sorted(shard_to_param.values()) == sorted(n for n, _ in traced.model.named_parameters())
    ready: dict[str, int] = {}
    # Each all_reduce sends ``grad / world``; the gradient is ready where the undivided gradient is produced.
    grad_of = {}
    fw_args = [getattr(a, "name", None) for a in traced.forward_in.bound_symbols[-1].args[0]["flat_args"]]
    for name, out in zip(fw_args, bw.bound_symbols[-1].args[0], strict=False):
        if name in shard_to_param and out is not None:
            grad_of[out.name] = shard_to_param[name]
    for b in bw.bound_symbols:
        if b.sym.name == "torch_wait_prim_impl" and b.flat_proxy_outs[0].name in grad_of:
            fut = b.flat_proxy_args[0].name
            send = bw.bound_symbols[_producer(bw, fut)].flat_proxy_args[0]
            undivided = bw.bound_symbols[_producer(bw, send.name)].flat_proxy_args[0]
            ready[grad_of[b.flat_proxy_outs[0].name]] = _producer(bw, undivided.name)
    return sorted(ready, key=ready.get)


def _sizes(traced: Traced) -> dict[str, tuple[str, int]]:
    return {
        n: (str(p.dtype).rpartition(".")[2], p.numel() * p.element_size()) for n, p in traced.model.named_parameters()
    }


def _check_size_capped(traced: Traced, got: list[Bucket], cap: int, first_cap: int) -> None:
    """Per dtype, in ready order: a bucket closes as soon as it holds its cap (the first one: ``first_cap``)."""
    ready = _ready_order(traced)
    sizes = _sizes(traced)
    for dtype in {d for d, _ in sizes.values()}:
        mine = sorted((b for b in got if b.dtype == dtype), key=lambda b: ready.index(b.params[0]))
        assert [p for b in mine for p in b.params] == [p for p in ready if sizes[p][0] == dtype]
        for k, b in enumerate(mine):
            limit = first_cap if k == 0 and first_cap else cap
            nbytes = [sizes[p][1] for p in b.params]
            assert b.bytes == sum(nbytes)
            if limit <= 0:
                assert len(b.params) == 1
            elif k < len(mine) - 1:
                assert sum(nbytes) >= limit > sum(nbytes[:-1]), f"bucket {k} of {dtype} closed at the wrong gradient"
            else:
                assert sum(nbytes[:-1]) < limit, f"the last bucket of {dtype} should have closed earlier"


def test_ddp_defaults_make_a_first_bucket_of_1_mib_then_25_mib(ddp):
    """configure_comm's defaults: the first bucket closes at 1 MiB (torch DDP's), the rest at 25 MiB, per dtype."""
    configs = {rec.config.param_name: rec.config for rec in ddp.records.values()}
    assert {(c.bucket_cap_bytes, c.first_bucket_cap_bytes) for c in configs.values()} == {(25 * MIB, MIB)}
    got = ddp.buckets["backward"]
    assert {b.kind for b in got} == {"all_reduce"} and ddp.buckets["forward"] == []
    ready = _ready_order(ddp)
    # wide.weight (1.2 MB) closes the first float32 bucket; the bfloat16 out layer is a bucket of its own.
    f32 = [p for p in ready if not p.startswith("out.")]
    split = f32.index("wide.weight") + 1
    assert [(b.dtype, b.params) for b in sorted(got, key=lambda b: b.issue_index)] == [
        ("bfloat16", [p for p in ready if p.startswith("out.")]),
        ("float32", f32[:split]),
        ("float32", f32[split:]),
    ]
    assert set(f32[:split]) <= {"wide.weight", "wide.bias"}
    _check_size_capped(ddp, got, 25 * MIB, MIB)
    _check_reductions(ddp.backward, got)


@pytest.mark.parametrize(("cap", "first_cap"), [(16_000, 4_000), (16_000, 0), (2 * MIB, 0), (0, 0)])
def test_ddp_buckets_are_size_capped_in_gradient_ready_order(ddp, cap, first_cap):
    got = _rerun(ddp, lambda c: {"bucket_cap_bytes": cap, "first_bucket_cap_bytes": first_cap})
    buckets = got.buckets["backward"]
    _check_size_capped(ddp, buckets, cap, first_cap)
    _check_reductions(got.backward, buckets)
    assert _collectives(got.backward) == {"all_reduce": len(buckets), "wait": len(buckets)}
    if cap == 0:
        assert sorted(len(b.params) for b in buckets) == [1] * len(NET_PARAMS_TOWER)
    if cap == 2 * MIB:
        assert len(buckets) == 2  # everything float32 together, bfloat16 apart


NET_PARAMS_TOWER = [n for n, _ in Tower().named_parameters()]


# -- the operators the pass inserts: buffer layout ------------------------------------------------------------------


def test_gathered_buffer_unpacks_into_each_parameter():
    """Rank r's packed shards, gathered rank after rank, unpack into every (padded) full parameter."""
    fulls = [torch.arange(14.0).reshape(7, 2), torch.arange(100.0, 106.0), torch.arange(200.0, 204.0).reshape(2, 2)]
    per_rank = [[distribute.shard_tensor(t, r, WORLD)[0] for t in fulls] for r in range(WORLD)]
    sent = [_pack_gather_impl(shards, "b", ()) for shards in per_rank]
    gathered = torch.cat(sent)  # what all_gather returns
    shapes = tuple((math.ceil(t.shape[0] / WORLD) * WORLD, *t.shape[1:]) for t in fulls)
    unpacked = _unpack_gather_impl(gathered, sent[0], shapes, WORLD, "b")
    for full, got in zip(fulls, unpacked, strict=True):
        torch.testing.assert_close(got[: full.shape[0]], full)
        assert not got[full.shape[0] :].any()  # padding rows
    # Both buffers freed by the unpack although this test still holds them, as gloo's worker thread may.
    assert gathered.untyped_storage().nbytes() == 0 and sent[0].untyped_storage().nbytes() == 0


def _gather_owners(rank: int, world: int, n: int, unpack: bool) -> tuple[int, int]:
    """Of ``n`` bucket gathers on this rank, once wait() has returned: without ``unpack``, how many sent or gathered
    buffers outlived their last Python reference (someone else still owned them); with it, how many still had bytes
    after the unpack."""
    import weakref

    import torch.distributed as dist

    if not dist.is_initialized():  # on the session's rank pair an earlier job may have created it
        dist.init_process_group("gloo")
    shapes = ((4 * world, 64), (2 * world,))
    outlived, left = 0, 0
    for _ in range(n):
        sent = _pack_gather_impl([torch.randn(4, 64), torch.randn(2)], "b", ())
        out = torch.empty(world * sent.numel())
        handle = dist.all_gather_into_tensor(out, sent, async_op=True)
        handle.wait()
        del handle
        if not unpack:  # leave the buffers to reference counting, as before the unpack freed them
            refs = [weakref.ref(t.untyped_storage()) for t in (sent, out)]
            del sent, out
            outlived += any(r() is not None for r in refs)
            continue
        _unpack_gather_impl(out, sent, shapes, world, "b")
        left += out.untyped_storage().nbytes() + sent.untyped_storage().nbytes() > 0
    return outlived, left


def test_gathered_buffer_outlives_wait_on_gloo_unless_the_unpack_frees_it():
    """The race the unpack's free closes: gloo's worker thread may still own an all_gather's input and output after
    wait(), so without the free they would die at that thread's whim (seen as a shard or a bucket more in a measured
    peak)."""
    from tests.helpers.rank_pool import run_on_pool

    unfreed, _ = zip(*run_on_pool(_gather_owners, 500, False, timeout=240), strict=True)
    assert sum(unfreed) > 0, f"no buffer outlived its last reference in 1000 gathers: {unfreed}"
    _, left = zip(*run_on_pool(_gather_owners, 500, True, timeout=240), strict=True)
    assert left == (0, 0)


@pytest.mark.parametrize("rows", [8, 3], ids=["rows-split-evenly", "rows-split-unevenly"])
def test_reduce_scatter_buffer_gives_each_rank_its_part_of_every_gradient(rows):
    # rows split evenly take one _chunk_cat; unevenly (a shard cuts a row) the flat reshape, which _chunk_cat's
    # padding would not match
    grads = [torch.arange(rows * WORLD * 2.0).reshape(rows, WORLD * 2), torch.arange(100.0, 104.0)]
    buffer = _pack_scatter_impl(grads, WORLD, True, "b", ())
    for rank, chunk in enumerate(buffer.chunk(WORLD)):  # reduce_scatter hands rank r chunk r
        expected = torch.cat([g.reshape(-1).chunk(WORLD)[rank] for g in grads]) / WORLD
        torch.testing.assert_close(chunk, expected)


# -- reduce_dtype and no_backward_sync ------------------------------------------------------------------------------


def _returned_names(trace: Any) -> list[str | None]:
    return [getattr(p, "name", None) for p in trace.bound_symbols[-1].args[0]]


def test_reduce_dtype_casts_each_gradient_bucket_for_its_collective_and_back(zero2):
    """``reduce_dtype="float32"``: the bf16 bucket is packed and reduced in float32, its gradients come back bf16;
    the float32 buckets are not cast at all."""
    got = _rerun(zero2, lambda c: {"reduce_dtype": "float32"})
    reductions = got.buckets["backward"]
    assert {b.dtype for b in reductions} == {"float32"}
    (bf16,) = [b for b in reductions if set(b.params) == BLOCK1_BF16]
    numel = sum(math.prod(zero2.model.get_parameter(p).shape) * WORLD for p in bf16.params)  # unsharded gradients
    assert bf16.bytes == 4 * numel
    packs = [b for b in got.backward.bound_symbols if b.sym.name == "thunderviz_pack_for_reduce_scatter"]
    assert sorted(b.args[5] or "none" for b in packs) == ["float32", "none", "none", "none"]  # the bf16 one only
    unpacks = [b for b in got.backward.bound_symbols if b.sym.name == "thunderviz_unpack_views"]
    assert {_dtype(o) for u in unpacks for o in u.flat_proxy_outs} == {"float32", "bfloat16"}  # gradients' own
    assert {
        _dtype(b.flat_proxy_outs[0]) for b in got.backward.bound_symbols if b.sym.name.startswith("torch_reduce")
    } == {"float32"}


def test_an_accumulating_backward_reduces_nothing_and_returns_no_sharded_gradient(zero2):
    """Traced under no_backward_sync: each bucket's unsharded gradients go to the accumulators in one op, no
    reduce_scatter or wait is left, and the backward returns None where it returned the sharded gradients."""
    t = CommTransform()
    for shard, rec in zero2.records.items():
        t.note_param(shard, rec)
    with hooks.skip_grad_sync():
        t.transform_traces_pre_prologue(None, None, None)
    assert t.accumulating
    t.transform_trace_post_optimization(zero2.forward_in)
    backward = t.transform_trace_post_optimization(zero2.backward_in)
    assert _collectives(backward) == {}
    assert t.buckets["backward"] == []
    expected = EXPECTED_LAYOUT["BLOCK"]
    assert {(b.label, b.dtype, frozenset(b.params)) for b in t.accumulated} == expected
    assert [b.kind for b in t.accumulated] == ["accumulate"] * len(expected)
    adds = [b for b in backward.bound_symbols if b.sym.name == "thunderviz_accumulate_unsharded_grads"]
    assert len(adds) == len(expected)
    assert compile_state.trace_accumulated(backward) == t.accumulated
    synced = _returned_names(zero2.backward)
    assert sum(n is not None for n in synced) == len(NET_PARAMS)  # every parameter's sharded gradient
    assert _returned_names(backward) == [None] * len(synced)


def test_accumulated_gradients_are_added_once_to_the_next_reduction():
    from thunderviz.thunder.comm import accumulation
    from thunderviz.thunder.comm.ops import _accumulate_impl

    accs = [accumulation.register(accumulation.GradAccumulator(f"p{i}", f"test:{i}"), f"test:{i}") for i in range(2)]
    first = [torch.arange(16.0).reshape(8, 2), torch.arange(100.0, 104.0)]
    _accumulate_impl(first, ("test:0", "test:1"), False, ("float32", "float64"), "b")
    _accumulate_impl(first, ("test:0", "test:1"), False, ("float32", "float64"), "b")
    assert accs[1].undivided.dtype == torch.float64 and all(a.pending for a in accs)
    now = [torch.ones(8, 2), torch.ones(4)]
    buffer = _pack_scatter_impl(now, WORLD, True, "b", (), "float32", ("test:0", "test:1"))
    expected = _pack_scatter_impl([n + 2 * f for n, f in zip(now, first, strict=True)], WORLD, True, "b", ())
    torch.testing.assert_close(buffer, expected)
    assert buffer.dtype == torch.float32 and not any(a.pending for a in accs)  # taken: the next window starts empty
    # A gradient that arrived divided by the world size (its division fused away from the pass) is kept apart and
    # added as it is to a pack of divided gradients.
    _accumulate_impl([first[0] / WORLD], ("test:0",), True, ("float32",), "b")
    got = _pack_scatter_impl([now[0] / WORLD], WORLD, False, "b", (), None, ("test:0",))
    torch.testing.assert_close(got, _pack_scatter_impl([(now[0] + first[0]) / WORLD], WORLD, False, "b", ()))
