"""Hybrid sharding's process groups: where the ranks are, and the shard and replica groups of a mesh.

The decision (which mesh) is ``parallel.decisions.decide_mesh``, plain Python; this module gathers the facts it needs
(each rank's host, told by the ranks themselves, so it holds for torchrun, Slurm and the rank pool alike) and builds
the groups with torch's own ``init_device_mesh``, as FSDP2's 2-D mesh does, so a ``DeviceMesh`` a user builds for the
same shape names the same ranks.
"""

from __future__ import annotations

import socket

import torch.distributed as tdist

from thunderviz.parallel.decisions import MeshFacts

__all__ = ["MeshGroups", "mesh_facts", "mesh_groups"]

#: (world group, device type, mesh) -> groups: building a mesh is a collective over every rank and its groups live
#: as long as the process group does, so a re-run cell (or a ZERO2 -> hybrid switch) reuses them instead of
#: creating more.
_CACHE: dict[tuple[int, str, tuple[int, int]], MeshGroups] = {}


class MeshGroups:
    """This rank's shard group (consecutive ranks sharing one set of shards) and replica group (one rank of each
    shard group: the ranks holding the same shard), and the ``DeviceMesh`` they come from."""

    def __init__(self, device_mesh: object, shard: tdist.ProcessGroup, replica: tdist.ProcessGroup) -> None:
        self.device_mesh = device_mesh
        self.shard = shard
        self.replica = replica


def mesh_facts(group: tdist.ProcessGroup | None = None) -> MeshFacts:
    """Every rank's host name, by rank (a collective: every rank calls it at the same point)."""
    hosts: list[str | None] = [None] * tdist.get_world_size(group)
    tdist.all_gather_object(hosts, socket.gethostname(), group=group)
    return MeshFacts(tuple(str(h) for h in hosts))


def mesh_groups(mesh: tuple[int, int], device_type: str) -> MeshGroups:
    """The groups of a ``(replicas, shard_size)`` mesh over the default process group (a collective the first
    time a mesh is asked for in this process group)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = tdist.distributed_c10d._get_default_group()
    key = (id(world), device_type, tuple(mesh))
    if key not in _CACHE:
        dm = init_device_mesh(device_type, tuple(mesh), mesh_dim_names=("replicate", "shard"))
        _CACHE[key] = MeshGroups(dm, dm.get_group("shard"), dm.get_group("replicate"))
    return _CACHE[key]
