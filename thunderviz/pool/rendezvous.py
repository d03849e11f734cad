"""Both sides (kernel and rank): how ranks find each other: the torchrun environment block, the rendezvous socket, and
the interface to use.

Shared by both ways thunderviz makes ranks: the persistent engines (``rank.calls.set_up``) and the one-shot
spawner (``spawn.run_ranks``). Fabric and torch read these variables exactly as torchrun sets them, so processes
created by us look "created externally" to Fabric.

Why the engines do not pick a port by probing: a port found free and closed again can be taken by another process
before the store binds it. Rank 0 binds a listening socket on its cluster-facing address (never every interface)
and keeps it; torch's ``TCPStore`` then serves on that very socket (``master_listen_fd``).
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = [
    "bind_listener",
    "free_port",
    "hostname_address",
    "interface_of",
    "one_host_environment",
    "route_to",
    "torchrun_environment",
]


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


def one_host_environment(rank: int, world_size: int, port: int, threads: int | None = None) -> dict[str, str]:
    """``torchrun_environment`` for ``world_size`` ranks on this machine, meeting on loopback at ``port`` (the
    one-shot spawner and the test suite's rank pair)."""
    return torchrun_environment(
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        local_world_size=world_size,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=port,
        threads=threads,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (another process may take it before it is used: the one-shot spawner
    accepts that on loopback, as torchrun does; the engines use ``bind_listener`` instead)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_listener(address: str) -> socket.socket:
    """A TCP socket listening on ``address`` (one interface, never all) on a port the OS picks; the caller keeps it."""
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((address, 0))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


def interface_of(address: str) -> str | None:
    """The name of the network interface that carries ``address`` on this machine (``lo`` for 127.0.0.1)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6) and addr.address.split("%")[0] == address:
                return name
    return None


def route_to(host: str, port: int) -> tuple[str, str | None]:
    """The local address (and its interface) this machine uses to reach ``host:port``.

    A UDP ``connect`` only asks the routing table; nothing is sent.
    """
    family, kind, proto, _, target = socket.getaddrinfo(host, port or 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as s:
        s.connect(target)
        address = s.getsockname()[0]
    return address, interface_of(address)


def hostname_address() -> str | None:
    """What this machine's hostname resolves to (Debian maps it to 127.0.1.1 by default), or None."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
