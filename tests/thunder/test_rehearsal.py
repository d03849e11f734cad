"""The meta-device rehearsal: it allocates nothing, counts storages as MemTracker does, and its extrapolation over
repeated blocks equals rehearsing the whole model, byte for byte (the proof ``thunder.memory.rehearsal`` refers to)."""

from __future__ import annotations

import pytest
import torch

from thunderviz.demos.models import ResidualMLP, TinyGPT
from thunderviz.parallel.extrapolation import CUTS, extrapolate_peak
from thunderviz.parallel.plan import candidate_specs, extrapolate
from thunderviz.strategies.planning import block_checkpoint_policy
from thunderviz.thunder.memory.meta_model import block_container, cut_blocks, meta_twin
from thunderviz.thunder.memory.rehearsal import rehearse
from thunderviz.thunder.memory.storage_tracker import StorageTracker
from thunderviz.trace.memory import CATEGORIES

pytestmark = pytest.mark.timeout(900)

BATCH = torch.randn(64, 16)


def test_meta_twin_allocates_nothing_and_keeps_ties() -> None:
    model = TinyGPT(n_layer=2, tie_weights=True)
    twin = meta_twin(model)
    assert all(t.is_meta for t in [*twin.parameters(), *twin.buffers()])
    assert twin.lm_head.weight is twin.wte.weight
    assert not model.wte.weight.is_meta  # the original is untouched


def test_cut_blocks_keeps_names_and_classes() -> None:
    model = ResidualMLP(n_layer=5)
    assert block_container(model) == ("blocks", 5)
    cut = cut_blocks(model, 2)
    assert [n for n, _ in cut.named_children()] == ["inp", "blocks", "out"]
    assert len(cut.blocks) == 2 and type(cut.blocks[1]) is type(model.blocks[1])
    with pytest.raises(ValueError, match="has 5 blocks, not 6"):
        cut_blocks(model, 6)


def test_tracker_counts_a_storage_once_and_forgets_it_when_freed() -> None:
    tracker = StorageTracker(cuda_rounding=False)
    with tracker:
        a = torch.empty(256, device="meta")  # 1 KiB
        view = a.view(16, 16)
        b = a * 2
        assert tracker.total == 2048 and tracker.current["temporaries"] == 2048
        tracker.label(b, "saved activations")
        del a, view
        assert tracker.total == 1024 and tracker.current == dict.fromkeys(CATEGORIES, 0) | {"saved activations": 1024}
    assert tracker.peak.peak_bytes == 2048


def test_tracker_counts_a_storage_resized_to_nothing_as_freed_then() -> None:
    """What ``MemTracker`` counts too, and how the communication pass frees its buffers (``comm.ops._free``)."""
    original = torch.UntypedStorage.resize_
    tracker = StorageTracker(cuda_rounding=False)
    with tracker:
        a = torch.empty(256, device="meta")
        held = a.view(-1)  # another owner, as a collective's work object may be
        a.untyped_storage().resize_(0)
        assert tracker.total == 0
        _ = torch.empty(128, device="meta")
        assert tracker.total == 512
        del a, held
        assert tracker.total == 512
    assert tracker.peak.peak_bytes == 1024
    assert torch.UntypedStorage.resize_ is original  # put back on exit


def test_a_fusion_regions_pointwise_chain_takes_memory_only_where_a_matmul_reads_it_or_it_is_returned() -> None:
    """Inductor fuses pointwise chains into one kernel; extern kernels (matmul) need their inputs in memory."""
    tracker = StorageTracker(cuda_rounding=False)
    x = torch.empty(256, device="meta")  # 1 KiB, made before: not counted
    w = torch.empty(256, 256, device="meta")

    def region(x, w):
        h = (x * 2).sin().exp()  # three virtual intermediates
        g = h.view(1, 256).cos()  # a view of a virtual one, then another virtual one
        return g @ w, h  # g is read by mm: in memory; h is returned: in memory

    with tracker:
        out, h = tracker.fused_region(region, (x, w))
        # at the matmul, the fused kernel before it has written g (the mm reads it) and h (returned later): with the
        # matmul's output, 3 KiB; then g dies with the region
        assert tracker.peak.peak_bytes == 3 * 1024 and tracker.total == 2 * 1024
        del out, h
        assert tracker.total == 0

    def chain(x):
        a = x * 2
        b = a.sin()
        return b.exp()  # a and b live until here, read by nothing after: inductor writes only the result

    tracker = StorageTracker(cuda_rounding=False)
    with tracker:
        kept = tracker.fused_region(chain, (x,))
        assert tracker.peak.peak_bytes == 1024 and tracker.total == 1024
        tracker.reset_peak()
        plain = chain(x)  # outside a region (thunder's torch executor), every intermediate is a tensor
        assert tracker.peak.peak_bytes == 1024 + 3 * 1024
    assert kept.shape == plain.shape


def test_cuda_rounding_is_the_allocators_512_byte_blocks() -> None:
    tracker = StorageTracker(cuda_rounding=True)
    with tracker:
        _ = torch.empty(3, device="meta")
        assert tracker.total == 512


def test_a_rehearsal_that_reuses_an_earlier_trace_counts_what_a_fresh_one_counts(monkeypatch) -> None:
    """thunder's interpreter is most of a rehearsal, and rehearsals of one program repeat it: a plan's ZERO2 and ZERO3
    of one cut, its BLOCK and LAYER, the auto strategy predicting what a plan predicted. So a rehearsal keeps its
    interpreted trace (compile reuse, marked ``QUIET``) and a later one of the same program reuses it: ZERO3 LAYER
    after ZERO2 BLOCK here, which interpret to the same trace. It counts byte for byte, moment by moment what a
    rehearsal that interprets counts, and it stays out of the cell's compile log and the reuse counters."""
    from thunderviz.thunder.reuse import compile_reuse

    model = ResidualMLP(n_layer=2)
    z2, z3 = (candidate_specs([2], [n])[0].options for n in ("fsdp-zero2-block", "fsdp-zero3-layer"))
    compile_reuse.take_events()
    before = compile_reuse.stats()
    rehearse(model, BATCH, options=z2, world_size=2, capture_traces=False)
    quiet = compile_reuse.stats().quiet_hits
    reused = rehearse(model, BATCH, options=z3, world_size=2, capture_traces=False)
    after = compile_reuse.stats()
    assert after.quiet_hits == quiet + 1
    assert (after.hits, after.misses, after.last) == (before.hits, before.misses, before.last)
    assert compile_reuse.take_events() == []
    monkeypatch.setenv(compile_reuse.ENV_VARIABLE, "0")
    fresh = rehearse(model, BATCH, options=z3, world_size=2, capture_traces=False)
    assert compile_reuse.stats().quiet_hits == quiet + 1  # interpreted: reuse is off
    assert reused.memory == fresh.memory and reused.timeline == fresh.timeline
    assert (reused.comm_bytes, reused.collectives) == (fresh.comm_bytes, fresh.collectives)
    assert [(b.kind, b.label, b.params) for b in reused.buckets] == [(b.kind, b.label, b.params) for b in fresh.buckets]


# The rehearsals below share thunder's interpreted traces through compile reuse (each test stands alone; in this
# order they reuse more): ResidualMLP(n_layer=2) with ``BATCH`` at world size 2 under FSDP is interpreted once, and
# the cuts of ResidualMLP(n_layer=6) the extrapolation rehearses are what the progress test's plan rehearses.


@pytest.mark.parametrize("name", ["fsdp-zero2-block", "fsdp-zero3-layer"])
def test_one_fsdp_rehearsal_counts_other_world_sizes_exactly(name: str) -> None:
    """Counting the shards at another world size gives what rehearsing at that world size gives (no padding)."""
    from thunderviz.thunder.memory.rehearsal import rehearse_worlds, scalable_world_sizes

    model = ResidualMLP(n_layer=2)  # every first dimension divisible by 2 and 4
    assert scalable_world_sizes(model, (2, 4)) and not scalable_world_sizes(model, (3,))
    spec = candidate_specs([2], [name])[0]
    both = rehearse_worlds(model, BATCH, options=spec.options, world_sizes=(2, 4), capture_traces=False)
    alone = rehearse(model, BATCH, options=spec.options, world_size=4, capture_traces=False)
    assert both[4].memory == alone.memory
    assert (both[4].comm_bytes, both[4].collectives) == (alone.comm_bytes, alone.collectives)
    assert both[4].memory.peak_bytes < both[2].memory.peak_bytes


@pytest.mark.parametrize("sharding", ["ZERO2", "ZERO3"])
def test_layer_laid_out_on_block_traces_equals_tracing_layer(sharding: str) -> None:
    """One trace, two bucketings: the communication pass run again on the optimized traces gives what tracing with
    LAYER gives (memory, communication, the backward's buckets)."""
    from thunderviz.thunder.memory.rehearsal import rehearse_all

    model = ResidualMLP(n_layer=2)
    specs = candidate_specs([2], [f"fsdp-{sharding.lower()}-block", f"fsdp-{sharding.lower()}-layer"])
    block, layer = rehearse_all(
        model, BATCH, options=[s.options for s in specs], world_sizes=(2,), capture_traces=False
    )
    alone = rehearse(model, BATCH, options=specs[1].options, world_size=2, capture_traces=False)
    assert layer[2].memory == alone.memory and layer[2].memory != block[2].memory
    assert (layer[2].comm_bytes, layer[2].collectives) == (alone.comm_bytes, alone.collectives)
    assert [(b.kind, b.label, b.params) for b in layer[2].buckets] == [
        (b.kind, b.label, b.params) for b in alone.buckets
    ]


def test_a_plan_across_hosts_adds_hybrid_candidates_with_one_hosts_memory() -> None:
    """A hybrid rank holds what an FSDP rank of its host holds (the replica all_reduce works in place), sends that
    FSDP's bytes plus the all_reduce of its reduced shards, and its host sends the reduced gradients once; so does
    a checkpointed one. (The plan is ``ResidualMLP(n_layer=2)`` with ``BATCH``, shared with the 4-rank hybrid test.)"""
    import thunderviz
    from tests.helpers.host_plan import BATCH_SHAPE, plan_across_hosts

    assert tuple(BATCH.shape) == BATCH_SHAPE
    plan = plan_across_hosts()
    one_host = plan.candidate("fsdp-zero2-block", 2)
    hybrid = plan.candidate("hybrid-zero2-block", 4)
    assert hybrid.options.device_mesh == (2, 2)
    assert hybrid.peak_bytes == one_host.peak_bytes and hybrid.breakdown == one_host.breakdown
    checkpointed = plan.candidate("hybrid-zero2-block+ac", 4)
    assert checkpointed.peak_bytes == plan.candidate("fsdp-zero2-block+ac", 2).peak_bytes < hybrid.peak_bytes
    # 2 x 2: each rank all-reduces its half of the reduced gradients over 2 replicas (2(R-1)/R of it: all of it),
    # and each host's 2 ranks send that out of the host: the reduced gradients once.
    assert hybrid.comm_bytes == one_host.comm_bytes + one_host.reduced_bytes // 2
    assert hybrid.inter_host_bytes == one_host.reduced_bytes > 0
    assert one_host.inter_host_bytes == 0
    ddp = plan.candidate("ddp", 4)
    assert ddp.inter_host_bytes == ddp.comm_bytes > hybrid.inter_host_bytes
    assert plan.recommended_for(4) is hybrid
    assert "hybrid-zero2-block x4 (mesh 2x2)" in plan.table() and "per host across hosts" in plan.table()
    # the "which strategy?" table carries it: hybrid's host sends fewer bytes to the other host than DDP's
    rows = {r.name: r for r in thunderviz.compare_runs(plan=plan).rows}
    assert rows["hybrid-zero2-block (plan)"].across_hosts == hybrid.inter_host_bytes
    assert rows["ddp (plan)"].across_hosts == ddp.inter_host_bytes
    assert "per host across hosts" in str(thunderviz.compare_runs(plan=plan))


def test_plan_for_cuda_from_cpu_assumes_the_ranks_executors_and_finds_the_largest_micro_batch() -> None:
    """Planned for CUDA on this CPU machine, the candidates are rehearsed with the fusion executor the CUDA ranks will
    choose (triton present there), and the header says so. With a budget, the recommended candidate's
    ``max_micro_batch`` is the largest multiple of the example's batch that fits: its checked peak fits, one more
    batch does not; the other's is estimated and says so."""
    import thunderviz
    from thunderviz.strategies.planning import PER_SAMPLE, _scaled_input

    model, kwargs = ResidualMLP(n_layer=2), {"world_sizes": (2,), "device": "cuda", "progress": False}
    kwargs["candidates"] = ("fsdp-zero2-block", "fsdp-zero3-block")
    free = thunderviz.plan(model, BATCH, **kwargs).candidate("fsdp-zero2-block")
    assert "torchcompile" in free.executors and free.max_micro_batch is None  # no budget, no micro-batch
    budget = free.peak_bytes + int(2.5 * sum(free.breakdown[k] for k in PER_SAMPLE))
    plan = thunderviz.plan(model, BATCH, memory_per_rank=budget, **kwargs)
    assert "executors: sdpa, torchcompile" in plan.table() and "this machine has no CUDA" in plan.table()
    c = plan.recommended
    assert c.name == "fsdp-zero2-block", plan.table()  # both fit; ZERO2 sends less
    assert c.max_micro_batch is not None and c.max_micro_batch >= 2, plan.table()
    assert c.max_micro_batch_peak <= budget and f"max micro-batch x{c.max_micro_batch}" in plan.table()
    # the other candidate's is the first estimate from its per-sample bytes, not rehearsed (a lower bound here)
    other = plan.candidate("fsdp-zero3-block")
    assert other.fits and other.max_micro_batch_peak is None and other.max_micro_batch >= 1, plan.table()
    assert f"max micro-batch >= x{other.max_micro_batch} (estimated, not rehearsed)" in plan.table()
    larger = thunderviz.plan(model, _scaled_input(BATCH, c.max_micro_batch + 1), **kwargs).candidate(c.name)
    assert larger.peak_bytes > budget
    assert plan.with_budget(budget * 2).recommended.max_micro_batch is None  # found for the plan's own budget


@pytest.mark.parametrize("name", ["fsdp-zero3-block", "ddp", "fsdp-zero3-block+ac"])
def test_extrapolation_over_blocks_equals_the_whole_rehearsal(name: str) -> None:
    """ZERO3 + BLOCK is the case where one block is not enough (the root bucket is gathered next to it, and a
    block's hand-over reaches two blocks ahead); with every block checkpointed the peak sits elsewhere. The
    extrapolation from the cuts (``parallel.extrapolation.CUTS``), moment by moment, must give exactly what
    rehearsing all 6 blocks gives: every category, every measured group, the phase, and the bytes sent."""
    model = ResidualMLP(n_layer=6)
    spec = candidate_specs([2], [name], checkpoint=block_checkpoint_policy(model))[0]
    kwargs = {"options": spec.options, "world_size": 2, "capture_traces": False}
    whole = rehearse(model, BATCH, **kwargs)
    cut = {k: rehearse(cut_blocks(model, k), BATCH, **kwargs) for k in CUTS}
    peak = extrapolate_peak({k: r.timeline for k, r in cut.items()}, 6)
    assert peak is not None
    assert (peak.breakdown, peak.groups, peak.phase) == (
        whole.memory.breakdown,
        whole.memory.groups,
        whole.memory.phase,
    )
    sent = {k: {"comm": r.comm_bytes, "collectives": r.collectives} for k, r in cut.items()}
    assert extrapolate(sent, 6) == {"comm": whole.comm_bytes, "collectives": whole.collectives}
    assert whole.memory.peak_bytes > cut[4].memory.peak_bytes > cut[3].memory.peak_bytes


def test_plan_reports_progress_once_per_traced_rehearsal() -> None:
    """``thunderviz.plan`` takes tens of seconds: it ticks after each traced rehearsal, naming what it covered, and
    the total is known from the first tick (DDP and ZERO2's two bucketings share traces: 2 traces x 2 cuts)."""
    import thunderviz

    ticks: list[tuple[int, int, str]] = []
    plan = thunderviz.plan(
        ResidualMLP(n_layer=6),
        BATCH,
        world_sizes=(2,),
        device="cpu",
        candidates=("ddp", "fsdp-zero2-block", "fsdp-zero2-layer"),
        progress=lambda done, total, what: ticks.append((done, total, what)),
    )
    assert [t[:2] for t in ticks] == [(1, 4), (2, 4), (3, 4), (4, 4)], ticks
    assert ticks[0][2] == "ddp x2 (3 of 6 blocks)"
    assert ticks[1][2] == "fsdp-zero2-block, fsdp-zero2-layer x2 (3 of 6 blocks)"
    assert ticks[3][2].endswith("x2 (4 of 6 blocks)") and len(plan.candidates) == 3


def test_a_checkpointed_llamas_runs_that_begin_unlike_are_aligned_by_their_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpointed Llama's backward runs do not begin alike where the plan assumes CUDA's executors (a middle
    block's begins with another op than the last block's: seen on Llama-2-7B), which sent such candidates to a whole
    rehearsal, minutes at 7B. Aligned by their ops, ZERO2's extrapolation is the whole rehearsal byte for byte (DDP's,
    measured, one 512-byte gradient block over: ``ExtrapolatedPeak``). Where an alignment is refused, that candidate
    is rehearsed whole once more (two cuts and one whole model traced) and the progress says why."""
    from litgpt import GPT, Config

    import thunderviz
    from thunderviz.parallel import extrapolation

    config = Config.from_name(
        "Llama-2-7b-hf", n_layer=5, n_embd=64, n_head=4, n_query_groups=4, intermediate_size=172, block_size=32
    )
    config.vocab_size = config.padded_vocab_size = 256
    with torch.device("meta"):
        model = GPT(config)
    x = torch.empty(1, 32, dtype=torch.long, device="meta")
    kwargs = {"precision": "bf16-true", "world_sizes": (64,), "device": "cuda", "candidates": ("fsdp-zero2-block+ac",)}
    (aligned,) = thunderviz.plan(model, x, progress=False, **kwargs).candidates
    assert (
        aligned.memory.how
        == "extrapolated from transformer.h cut to 3 and 4 of its 5 blocks; some runs aligned by their ops"
    )
    monkeypatch.setattr(extrapolation, "ALIGNED", 2.0)  # no alignment stands
    ticks: list[tuple[int, int, str]] = []
    (whole,) = thunderviz.plan(model, x, progress=lambda *t: ticks.append(t), **kwargs).candidates
    assert whole.memory.how == "rehearsed whole (cuts not alike)"
    assert ticks[-1] == (3, 3, "fsdp-zero2-block+ac x64 (whole model: the cuts' steps differ in shape)"), ticks
    assert aligned.memory.breakdown == whole.memory.breakdown and aligned.memory.groups == whole.memory.groups
