"""The plan's plain arithmetic: the candidates, how one is chosen, budgets as people write them, extrapolation."""

from __future__ import annotations

import pytest

from thunderviz.parallel.option_values import Bucketing, CheckpointPolicy, Parallelism, Sharding
from thunderviz.parallel.plan import (
    LINK_COSTS,
    PREFERENCE,
    ChoiceRow,
    LinkCost,
    candidate_name,
    candidate_specs,
    choose,
    extrapolate,
    hybrid_communication,
    inter_host_bytes,
    link_cost,
    parse_memory,
    smallest_fitting,
    strategy_of,
)
from thunderviz.trace.wire import ring_bytes


def test_every_candidate_at_every_world_size_in_preference_order() -> None:
    specs = candidate_specs([8, 64])
    assert [(s.name, s.world_size) for s in specs] == [(n, w) for w in (8, 64) for n in PREFERENCE]
    by_name = {s.name: s.options for s in specs if s.world_size == 8}
    assert by_name["ddp"].parallelism is Parallelism.DDP
    z3 = by_name["fsdp-zero3-layer"]
    assert (z3.parallelism, z3.sharding_strategy, z3.bucketing_strategy) == (
        Parallelism.FSDP,
        Sharding.ZERO3,
        Bucketing.LAYER,
    )
    assert all(candidate_name(s.options) == s.name for s in specs)
    assert not any(s.checkpointing for s in specs)  # no checkpointing dimension without the blocks' policy


def test_checkpointed_candidates_beside_every_strategy() -> None:
    policy = CheckpointPolicy(names=("Block",))
    specs = candidate_specs([8], checkpoint=policy)
    assert [s.name for s in specs] == [*PREFERENCE, *(n + "+ac" for n in PREFERENCE)]
    for s in specs:
        assert s.checkpointing == s.name.endswith("+ac")
        assert s.options.activation_checkpointing_policy == (policy if s.checkpointing else None)
        assert candidate_name(s.options) == s.name and strategy_of(s.name) in PREFERENCE
    with pytest.raises(ValueError, match="has none the plan can find"):
        candidate_specs([8], ["fsdp-zero3-block+ac"])


@pytest.mark.parametrize(
    ("sizes", "names", "match"),
    [((), PREFERENCE, "at least one world size"), ((0,), PREFERENCE, ">= 1"), ((2,), ("fsdp-zero2-none",), "not a")],
)
def test_bad_candidate_requests_say_what_to_use(sizes, names, match) -> None:
    with pytest.raises(ValueError, match=match):
        candidate_specs(sizes, names)


def test_ring_bytes_per_rank() -> None:
    assert ring_bytes("all_gather", 100, 4) == 300  # (W-1) x shard
    assert ring_bytes("reduce_scatter", 400, 4) == 300  # (W-1)/W of the input
    assert ring_bytes("all_reduce", 400, 4) == 600  # 2(W-1)/W
    assert ring_bytes("all_reduce", 400, 1) == 0
    assert ring_bytes("broadcast", 400, 4) == 400  # the root sends its input once
    with pytest.raises(ValueError, match="unknown collective"):
        ring_bytes("all_to_all", 1, 2)


def _row(
    name: str,
    peak: int,
    comm: int,
    world: int = 2,
    checkpointing: bool = False,
    collectives: int = 1,
    link=None,
    recompute: float = 0.0,
) -> ChoiceRow:
    seconds = (link or link_cost("cpu")).seconds(comm, collectives)
    return ChoiceRow(name, world, peak, comm, collectives, seconds, checkpointing, recompute_seconds=recompute)


def test_choose_takes_least_communication_that_fits_ties_by_preference() -> None:
    rows = [
        _row("ddp", 100, 10),
        _row("fsdp-zero2-block", 60, 10),
        _row("fsdp-zero2-layer", 55, 10),
        _row("fsdp-zero3-block", 40, 15),
    ]
    assert choose(rows, None) == 0  # everything fits: DDP ties ZERO2 on bytes and wins by preference
    assert choose(rows, 99) == 1  # DDP does not fit; BLOCK before LAYER at equal bytes
    assert choose(rows, 50) == 3
    assert choose(rows, 39) is None
    assert smallest_fitting(rows) == 3


def test_the_link_decides_zero2_layer_against_zero3_block() -> None:
    """ZERO2-LAYER sends fewer bytes in more collectives than ZERO3-BLOCK: litgpt-gpt2's plan at world 2 has
    531 KB in 30 collectives against 761 KB in 9. On a latency-bound link (gloo on CPU) ZERO3-BLOCK is faster, as
    ``bench/memory_plan.py`` measured; with a large model on NCCL the bytes decide and ZERO2-LAYER is."""

    def pair(link: LinkCost, scale: int) -> list[ChoiceRow]:
        return [
            _row("fsdp-zero2-layer", 55, 531_456 * scale, collectives=30, link=link),
            _row("fsdp-zero3-block", 40, 761_472 * scale, collectives=9, link=link),
        ]

    assert choose(pair(LINK_COSTS["cpu"], 1), 60) == 1
    assert choose(pair(LINK_COSTS["cuda"], 1), 60) == 1  # small messages: latency-bound on NCCL too
    assert choose(pair(LINK_COSTS["cuda"], 10_000), 60) == 0  # 5 GB against 7.6 GB: the bytes decide
    assert choose(pair(LINK_COSTS["cuda"], 10_000), 50) == 1  # unless only ZERO3 fits


def test_ddp_whenever_it_fits_however_many_buckets_it_issues() -> None:
    """DDP moves ZERO2's bytes and nothing in forward; its all_reduce count is its bucket size's choice (a 7B
    model's 14 GB in 25 MB buckets is some 560), not a reason to gather in forward."""
    rows = [_row("ddp", 100, 10_000, collectives=560), _row("fsdp-zero2-block", 60, 10_000, collectives=64)]
    assert choose(rows, None) == 0
    assert choose(rows, 99) == 1


def test_link_costs_price_collectives_and_bytes() -> None:
    link = LinkCost(latency_s=1e-3, bytes_per_s=1e6)
    assert link.seconds(2_000_000, 3) == pytest.approx(2.003)
    assert link_cost("cuda") is LINK_COSTS["cuda"]
    with pytest.raises(ValueError, match="the devices are cpu, cuda"):
        link_cost("tpu")
    with pytest.raises(ValueError, match="bandwidth > 0"):
        LinkCost(latency_s=1e-3, bytes_per_s=0)


def test_checkpointing_chosen_when_it_is_the_fastest_that_fits() -> None:
    # communication plus recomputation: ZERO2+AC recomputes for longer than ZERO3's second gather takes
    slow = [_row("fsdp-zero3-layer", 50, 15), _row("fsdp-zero2-block+ac", 30, 10, checkpointing=True, recompute=1.0)]
    assert choose(slow, 60) == 0
    assert choose(slow, 40) == 1
    # a cheap recomputation beats a gather of more bytes
    cheap = [
        _row("fsdp-zero3-block", 50, 10**7),
        _row("fsdp-zero2-block+ac", 30, 10, checkpointing=True, recompute=1e-3),
    ]
    assert choose(cheap, 60) == 1
    # the same strategy checkpointed or not: unchecked first (it is never slower)
    same = [_row("fsdp-zero2-block+ac", 30, 10, checkpointing=True), _row("fsdp-zero2-block", 50, 10)]
    assert choose(same, 60) == 1
    # plain DDP first whenever it fits; checkpointed DDP is weighed by its time
    ddp = [_row("ddp+ac", 30, 10, checkpointing=True, recompute=1.0), _row("fsdp-zero2-block", 50, 10)]
    assert choose(ddp, 60) == 1


def test_choose_within_one_world_size() -> None:
    rows = [_row("ddp", 100, 10, world=2), _row("ddp", 100, 30, world=8)]
    assert choose(rows, None, world_size=8) == 1 and choose(rows, None, world_size=4) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GiB", 80 * 2**30), ("40 GB", 40 * 10**9), ("512MiB", 512 * 2**20), (1234, 1234), ("1.5 KiB", 1536)],
)
def test_memory_sizes(text, expected) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["80 gigs", "", "-1GB", 0, True, None])
def test_bad_memory_sizes_name_the_format(bad) -> None:
    with pytest.raises(ValueError, match="memory_per_rank"):
        parse_memory(bad)


def test_affine_extrapolation_is_exact_in_integers() -> None:
    values = {2: {"a": 100, "b": 7}, 3: {"a": 130, "b": 7}}
    assert extrapolate(values, 32) == {"a": 100 + 30 * 30, "b": 7}
    with pytest.raises(ValueError, match="exactly two"):
        extrapolate({2: {"a": 1}}, 5)
    with pytest.raises(ValueError, match="whole number"):
        extrapolate({2: {"a": 0}, 4: {"a": 1}}, 5)


# -- past one host ---------------------------------------------------------------------------------------------------


def test_hybrid_candidates_exist_only_where_the_world_spans_hosts() -> None:
    specs = candidate_specs([2, 4, 6, 5], ranks_per_host=2)
    hybrid = [(s.name, s.world_size, s.mesh) for s in specs if s.mesh is not None]
    assert hybrid == [
        ("hybrid-zero2-block", 4, (2, 2)),
        ("hybrid-zero3-block", 4, (2, 2)),
        ("hybrid-zero2-block", 6, (3, 2)),
        ("hybrid-zero3-block", 6, (3, 2)),
    ]  # none on one host (2), none where hosts cannot hold equal shard groups (5)
    assert all(candidate_name(s.options) == s.name for s in specs)
    assert [s.name for s in candidate_specs([4])] == list(PREFERENCE)  # without the hosts, no hybrid
    with pytest.raises(ValueError, match=r"ranks_per_host=N"):
        candidate_specs([4], ["hybrid-zero2-block"])


def test_hybrid_sends_its_hosts_fsdp_plus_one_all_reduce_of_the_reduced_shards_across_hosts() -> None:
    # FSDP on one host's 4 ranks sends 1000 B in 6 collectives and reduce-scatters 800 B in 3; across 2 hosts each
    # rank all-reduces its 200 B shard (2(R-1)/R of it = 200 B), and the host's 4 ranks lead 4 rings out of it.
    assert hybrid_communication(1000, 6, 800, 3, replicas=2, shard=4) == (1200, 9, 800)
    assert hybrid_communication(1000, 6, 800, 3, replicas=4, shard=4) == (1300, 9, 1200)
    # Collectives over every rank: a ring leaves each host once, so a host sends what one rank sends.
    assert inter_host_bytes(1000, world_size=4, ranks_per_host=2) == 1000
    assert inter_host_bytes(1000, world_size=2, ranks_per_host=2) == 0
    assert inter_host_bytes(1000, world_size=8, ranks_per_host=None) == 0


def test_across_hosts_the_fewest_bytes_between_hosts_win_even_over_ddp() -> None:
    def row(name: str, peak: int, comm: int, across: int) -> ChoiceRow:
        return ChoiceRow(name, 4, peak, comm, 3, link_cost("cpu").seconds(comm, 3), inter_host_bytes=across)

    rows = [
        row("ddp", 900, 1500, 1500),
        row("fsdp-zero2-block", 600, 1500, 1500),
        row("hybrid-zero2-block", 700, 1700, 1000),
        row("hybrid-zero3-block", 650, 2200, 1000),
    ]
    assert rows[choose(rows, None)].name == "hybrid-zero2-block"
    assert rows[choose(rows, 680)].name == "hybrid-zero3-block"  # the lighter hybrid where the other does not fit
    assert rows[choose(rows, 620)].name == "fsdp-zero2-block"
