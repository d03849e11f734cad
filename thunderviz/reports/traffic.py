"""What a run sends within hosts and between them, from every rank's ledger and the host each rank ran on.

Why here and in these terms: across hosts the link is the slow one, and hybrid sharding exists to keep the heavy
collectives off it; a report that only says "bytes per step" cannot show that. The accounting is the
plan's (``parallel.plan.inter_host_bytes``, ``hybrid_communication``) and every view's (``trace.wire``), so a
measured run and its prediction use the same words: ring algorithms; a collective whose group lies inside one host
never leaves it; a ring over a group that spans hosts leaves each host once per ring step, so each host sends what
one rank of the group sends, once for every such group it has ranks in (hybrid's replica groups: one per rank of
the host).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thunderviz.trace.units import format_bytes
from thunderviz.trace.wire import SENDING_KINDS

__all__ = ["HostTraffic", "host_traffic"]


@dataclass(frozen=True)
class HostTraffic:
    """Per step: ``per_rank`` what the busiest rank sends, ``within_host`` how much of that goes over groups inside
    its host, ``across_hosts`` what the busiest host sends to the others; ``hosts`` how many hosts ran ranks."""

    per_rank: int
    within_host: int
    across_hosts: int
    hosts: int

    def describe(self) -> str:
        """``each rank sends 395.6 KiB per step, 263.8 KiB of it within its host; each host sends 263.8 KiB to the
        others``."""
        if self.hosts <= 1:
            return f"each rank sends {format_bytes(self.per_rank)} per step, all within its host (one host)"
        return (
            f"each rank sends {format_bytes(self.per_rank)} per step, {format_bytes(self.within_host)} of it within"
            f" its host; each host sends {format_bytes(self.across_hosts)} to the others"
        )


def _members(rank: int, world: int, entry: Any) -> range | list[int]:
    """The ranks of the group ``rank`` ran ``entry`` in: hybrid's shard group (consecutive ranks), its replica
    group (one rank of each shard group), or every rank."""
    size = entry.group_size or world
    if entry.mesh_group == "shard":
        first = rank // size * size
        return range(first, first + size)
    if entry.mesh_group == "replica":
        shard = world // size
        return [rank % shard + k * shard for k in range(size)]
    return range(world)


def host_traffic(ledgers: Mapping[str, Mapping[int, Any]], rank_hosts: Mapping[int, str]) -> HostTraffic | None:
    """The run's ``HostTraffic`` (None without ledgers or hosts). ``ledgers[name][rank]`` as in ``RunReport``."""
    if not ledgers or not rank_hosts:
        return None
    world = len(rank_hosts)
    sent: dict[int, int] = {}
    within: dict[int, int] = {}
    out_of_host: dict[str, int] = {}
    for by_rank in ledgers.values():
        for rank, ledger in by_rank.items():
            host = rank_hosts.get(rank)
            for e in ledger.entries:
                if e.kind not in SENDING_KINDS or e.bytes is None:
                    continue
                members = _members(rank, world, e)
                n = e.sent_bytes(world)
                sent[rank] = sent.get(rank, 0) + n
                hosts = {rank_hosts.get(r) for r in members}
                if len(hosts) == 1:
                    within[rank] = within.get(rank, 0) + n
                elif rank == min(r for r in members if rank_hosts.get(r) == host):
                    # one rank per host and group counts the group's ring leaving the host
                    out_of_host[host] = out_of_host.get(host, 0) + n  # type: ignore[index]
    if not sent:
        return None
    busiest = max(sent, key=lambda r: sent[r])
    return HostTraffic(
        per_rank=sent[busiest],
        within_host=within.get(busiest, 0),
        across_hosts=max(out_of_host.values(), default=0),
        hosts=len(set(rank_hosts.values())),
    )
