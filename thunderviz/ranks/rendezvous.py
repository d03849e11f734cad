"""How ranks find each other: the torchrun environment block and the rendezvous port.

Shared by both ways thunderviz makes ranks: the persistent engines (``inside_rank.set_up``) and the one-shot
spawner (``spawn.run_ranks``). Fabric and torch read these variables exactly as torchrun sets them, so processes
created by us look "created externally" to Fabric.
"""

from __future__ import annotations

import socket

__all__ = ["free_port", "torchrun_environment"]


def torchrun_environment(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    threads: int | None = None,
) -> dict[str, str]:
    """The variables torchrun sets for one rank (plus ``OMP_NUM_THREADS`` when ``threads`` is given)."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "NODE_RANK": str(node_rank),
        "MASTER_ADDR": str(master_addr),
        "MASTER_PORT": str(master_port),
    }
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (another process may take it before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
