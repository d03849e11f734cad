"""Topology and backend choice: which engine is which rank, on which host, with which process-group backend.

Public and pure (no processes, no ipyparallel), so every situation (uneven hosts, GPUs per host, bad flags) is
checked by plain unit tests. The magics import the same choices and validators, so a flag cannot accept what the
engine refuses.

Ranks are grouped by host, in the order hosts first appear among the sorted engine ids: local ranks are contiguous
and rank 0 lives on the first host, as torchrun numbers them. Every host must run the same number of engines
(Fabric's ``devices`` x ``num_nodes``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thunderviz.cell.failures import RankUsageError

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "EngineIdentity",
    "RankLayout",
    "check_local_backend",
    "layout_ranks",
    "local_cuda_devices",
    "resolve_backend",
    "validate_pool_args",
]

#: ``auto``: NCCL with one GPU per local rank when every host has enough, else gloo.
BACKENDS = ("auto", "gloo", "nccl")
#: Seconds a rank may wait in a collective before the cell fails (the process group's timeout).
DEFAULT_TIMEOUT_S = 60.0


def validate_pool_args(nproc: Any, backend: Any, timeout: Any) -> tuple[int, str, float]:
    """Check the pool's arguments before anything starts; returns them normalised.

    Raises:
        RankUsageError: naming the bad argument and an example of a good one.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise RankUsageError(f"nproc must be a whole number of ranks, got {nproc!r}; pass e.g. --nproc 2")
    if nproc < 1:
        raise RankUsageError(f"nproc must be at least 1, got {nproc}; pass e.g. --nproc 2")
    if backend not in BACKENDS:
        raise RankUsageError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        raise RankUsageError(f"timeout must be a number of seconds, got {timeout!r}") from None
    if not timeout > 0:
        raise RankUsageError(
            f"timeout must be positive, got {timeout}; it bounds how long a rank waits in a collective"
        )
    return nproc, backend, timeout


def local_cuda_devices() -> int:
    """CUDA devices visible to this process (0 without torch or CUDA). Imports torch: call only for ``nccl``."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def resolve_backend(backend: str, nproc_per_host: int, cuda_devices: int) -> str:
    """The backend the ranks use: ``auto`` becomes nccl (one GPU per local rank) or gloo.

    Raises:
        RankUsageError: ``nccl`` without CUDA, or with fewer GPUs than local ranks.
    """
    if backend == "auto":
        return "nccl" if cuda_devices >= nproc_per_host and cuda_devices > 0 else "gloo"
    if backend == "nccl":
        if cuda_devices == 0:
            raise RankUsageError(
                "--backend nccl needs CUDA, and no CUDA device is visible here. Use --backend gloo (CPU ranks) "
                "or --backend auto."
            )
        if nproc_per_host > cuda_devices:
            raise RankUsageError(
                f"--backend nccl gives each local rank its own GPU, but {nproc_per_host} ranks were asked for on a "
                f"host with {cuda_devices} GPU(s). Use --nproc {cuda_devices} or fewer, or --backend gloo."
            )
    return backend


def check_local_backend(backend: str, nproc: int) -> None:
    """Fail before starting local ranks when ``--backend nccl`` cannot work here (``auto`` always can)."""
    if backend == "nccl":
        resolve_backend(backend, nproc, local_cuda_devices())


@dataclass(frozen=True)
class EngineIdentity:
    """What an engine says about itself (``rank.identity.identify``, pickled back to the kernel): enough to place
    it, to kill it by pid, and the address and interface it reaches the controller through (its cluster-facing
    side); ``None`` for those when no route to the controller was found."""

    engine_id: int
    host: str
    pid: int
    cuda_devices: int
    cpus: int
    address: str | None = None
    interface: str | None = None


@dataclass(frozen=True)
class RankLayout:
    """Engines as ranks: ``engines[rank]`` is that rank's engine, grouped by host (``hosts`` in rank order)."""

    engines: tuple[EngineIdentity, ...]
    hosts: tuple[str, ...]
    local_world_size: int

    @property
    def world_size(self) -> int:
        return len(self.engines)

    @property
    def num_nodes(self) -> int:
        return len(self.hosts)

    @property
    def rank_to_engine(self) -> dict[int, int]:
        return {rank: e.engine_id for rank, e in enumerate(self.engines)}

    @property
    def rank_hosts(self) -> dict[int, str]:
        return {rank: e.host for rank, e in enumerate(self.engines)}

    @property
    def rank_pids(self) -> dict[int, int]:
        return {rank: e.pid for rank, e in enumerate(self.engines)}

    def local_rank(self, rank: int) -> int:
        return rank % self.local_world_size

    def node_rank(self, rank: int) -> int:
        return rank // self.local_world_size

    @property
    def cuda_devices_per_host(self) -> int:
        """The fewest GPUs any engine sees (what ``auto`` can count on everywhere)."""
        return min(e.cuda_devices for e in self.engines)

    def describe_hosts(self) -> str:
        """E.g. ``2 on node-a, 2 on node-b`` (for messages)."""
        return ", ".join(f"{sum(1 for e in self.engines if e.host == h)} on {h}" for h in self.hosts)

    @property
    def master_address(self) -> str:
        """Where the rendezvous listens: rank 0's address facing the controller.

        Raises:
            RankUsageError: several hosts, but rank 0 reaches the controller over loopback (others could not reach it).
        """
        address = self.engines[0].address or "127.0.0.1"
        if self.num_nodes > 1 and ipaddress.ip_address(address).is_loopback:
            raise RankUsageError(
                f"The ranks span {self.num_nodes} hosts ({self.describe_hosts()}), but rank 0 on {self.hosts[0]} "
                f"reaches the controller over loopback ({address}), so the other hosts could not reach its "
                "rendezvous. Start the controller on a cluster-facing address (`ipcontroller --ip=ADDRESS` or "
                "`ipcluster start --ip=ADDRESS`)."
            )
        return address

    @property
    def threads_per_rank(self) -> int:
        """Rank 0's host's CPUs shared by its local ranks (torch would otherwise start one thread per CPU each)."""
        return max(1, self.engines[0].cpus // self.local_world_size)


def layout_ranks(identities: Mapping[int, EngineIdentity]) -> RankLayout:
    """Number the engines as ranks, grouped by host in order of first appearance among sorted engine ids.

    Raises:
        RankUsageError: no engines, or hosts with different engine counts (Fabric needs the same on every node).
    """
    if not identities:
        raise RankUsageError("There are no engines to use as ranks; start at least one (e.g. --nproc 2).")
    ids = sorted(identities)
    hosts: list[str] = []
    for eid in ids:
        if identities[eid].host not in hosts:
            hosts.append(identities[eid].host)
    ordered = tuple(identities[eid] for host in hosts for eid in ids if identities[eid].host == host)
    per_host = {host: sum(1 for e in ordered if e.host == host) for host in hosts}
    if len(set(per_host.values())) != 1:
        raise RankUsageError(
            f"Every host must run the same number of engines for Fabric, got {dict(sorted(per_host.items()))}."
            " Start the cluster with the same engine count per node."
        )
    return RankLayout(engines=ordered, hosts=tuple(hosts), local_world_size=per_host[hosts[0]])
