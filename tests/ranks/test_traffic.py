"""Traffic within and between hosts, from ledgers: the plan's accounting applied to what ranks really sent."""

from __future__ import annotations

from thunderviz.parallel.plan import hybrid_communication, inter_host_bytes
from thunderviz.reports.traffic import host_traffic
from thunderviz.trace.ledger import Ledger, LedgerEntry
from thunderviz.trace.wire import ring_bytes


def _entry(kind: str, nbytes: int, group: int, mesh_group: str = "") -> LedgerEntry:
    return LedgerEntry(0, "backward", 0, kind, "b", (nbytes // 4,), "float32", nbytes, group, mesh_group=mesh_group)


def _ledgers(entries: list[LedgerEntry], world: int) -> dict[str, dict[int, Ledger]]:
    return {"model": {r: Ledger(r, list(entries)) for r in range(world)}}


HOSTS = {0: "a", 1: "a", 2: "b", 3: "b"}


def test_fsdp_over_every_rank_crosses_hosts_with_all_it_sends() -> None:
    entries = [_entry("all_gather", 1000, 4), _entry("reduce_scatter", 4000, 4), _entry("wait", 0, 4)]
    t = host_traffic(_ledgers(entries, 4), HOSTS)
    per_rank = ring_bytes("all_gather", 1000, 4) + ring_bytes("reduce_scatter", 4000, 4)
    assert (t.per_rank, t.within_host, t.hosts) == (per_rank, 0, 2)
    assert t.across_hosts == inter_host_bytes(per_rank, 4, 2)
    assert "each host sends 5.9 KiB to the others" in t.describe()


def test_hybrid_keeps_its_shard_group_inside_the_host_and_sends_the_reduced_shards_out() -> None:
    # 2 x 2: gather 1000 B shards and reduce-scatter 4000 B in the shard group, all-reduce the 2000 B reduced shard
    entries = [
        _entry("all_gather", 1000, 2, "shard"),
        _entry("reduce_scatter", 4000, 2, "shard"),
        _entry("all_reduce", 2000, 2, "replica"),
    ]
    t = host_traffic(_ledgers(entries, 4), HOSTS)
    inside = ring_bytes("all_gather", 1000, 2) + ring_bytes("reduce_scatter", 4000, 2)
    assert t.within_host == inside and t.per_rank == inside + ring_bytes("all_reduce", 2000, 2)
    # the plan's prediction from FSDP on one host's 2 ranks (which reduce-scatters 4000 B) says the same
    per_rank, _, across = hybrid_communication(inside, 0, 4000, 0, replicas=2, shard=2)
    assert (t.per_rank, t.across_hosts) == (per_rank, across)


def test_one_host_sends_nothing_across() -> None:
    t = host_traffic(_ledgers([_entry("all_reduce", 4000, 2)], 2), {0: "a", 1: "a"})
    assert (t.within_host, t.across_hosts, t.hosts) == (t.per_rank, 0, 1)
    assert t.describe().endswith("all within its host (one host)")
    assert host_traffic({}, HOSTS) is None
