"""Rank side: joining the process group, and leaving it. ``warm_up`` (imports ahead of the first cell),
``bind_rendezvous`` (rank 0's listening socket), ``set_up`` (torchrun environment, socket interface, process group
with our timeout, namespace, cell hooks), ``check_process_group`` (is the group still usable?) and ``reset`` (an
in-place restart).

The process group is created here, not by Fabric, so that its timeout is ours: it is what bounds a rank that waits
in a collective its peers never enter. Fabric then finds it initialised and reuses it. Importing this module is
cheap: torch, thunder and IPython load inside the calls.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from datetime import timedelta
from typing import Any

from thunderviz.cell.failures import RankConnectionError
from thunderviz.cell.protocol import RankSetup
from thunderviz.pool.rendezvous import bind_listener, hostname_address, torchrun_environment
from thunderviz.rank.cell_hooks import install_cell_hooks
from thunderviz.rank.cell_targets import CellSnapshot
from thunderviz.rank.state import STATE, user_namespace

__all__ = ["bind_rendezvous", "check_process_group", "reset", "set_up", "warm_up"]


def warm_up() -> None:
    """Import what a first cell needs (Fabric, the strategies, trace capture), before anyone asks: no process group,
    no CUDA (``torch.cuda`` stays uninitialised until the first cell's set-up)."""
    import lightning.fabric  # noqa: F401


# -- the rendezvous


def bind_rendezvous(address: str) -> int:
    """Rank 0, before ``set_up``: listen on ``address`` on a port the OS picks and keep the socket, so nothing can
    take the port before the store serves on it. Returns the port."""
    _close_rendezvous_socket()
    STATE.rendezvous_socket = bind_listener(address)
    return STATE.rendezvous_socket.getsockname()[1]


def _close_rendezvous_socket() -> None:
    if STATE.rendezvous_socket is not None:
        STATE.rendezvous_socket.close()
        STATE.rendezvous_socket = None


def _store(setup: RankSetup) -> Any:
    """The ``TCPStore`` of this process group: rank 0 serves on the socket ``bind_rendezvous`` kept."""
    import torch.distributed as dist

    timeout = timedelta(seconds=float(setup.timeout_s))
    if setup.rank != 0:
        return dist.TCPStore(setup.master_addr, setup.master_port, setup.world_size, False, timeout)
    if STATE.rendezvous_socket is None:
        raise RuntimeError("set_up(rank=0) needs bind_rendezvous() first")
    fd = STATE.rendezvous_socket.detach()  # the store owns (and closes) the descriptor from here on
    STATE.rendezvous_socket = None
    return dist.TCPStore(
        setup.master_addr,
        setup.master_port,
        setup.world_size,
        True,
        timeout,
        wait_for_workers=False,
        master_listen_fd=fd,
        use_libuv=True,
    )


# -- the network interface, and what to say when the peers cannot be reached


def _socket_interfaces(setup: RankSetup) -> dict[str, str]:
    """Tell gloo and NCCL which interface to use, unless the engine's environment already does.

    Without it gloo advertises whatever the hostname resolves to, which on Debian is 127.0.1.1: peers on other
    hosts then cannot connect.
    """
    chosen = {}
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if variable not in os.environ and setup.socket_ifname:
            os.environ[variable] = chosen[variable] = setup.socket_ifname
    return chosen


def _connection_advice(setup: RankSetup, exc: BaseException, chosen: dict[str, str], elapsed_s: float) -> str:
    """The message of a set-up that could not connect: where it tried, through which interface, and the fix.

    ``elapsed_s`` is said when it is well past the timeout: gloo retries a refused connection past it (measured: a
    10 s timeout gave up after 53 s, a 4 s one after 23 s), and the user waited that long, not the timeout."""
    host = socket.gethostname()
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    ifname = os.environ.get("GLOO_SOCKET_IFNAME") if setup.backend == "gloo" else os.environ.get("NCCL_SOCKET_IFNAME")
    variable = "GLOO_SOCKET_IFNAME" if setup.backend == "gloo" else "NCCL_SOCKET_IFNAME"
    who = "chosen by thunderviz" if variable in chosen else "set in the engine's environment"
    parts = [
        f"rank {setup.rank} on host {host} could not join the {setup.backend} process group within "
        f"{setup.timeout_s:.0f} s"
        + (f" (it gave up after {elapsed_s:.0f} s)" if elapsed_s > 1.5 * setup.timeout_s else "")
        + f" ({type(exc).__name__}: {first_line}).",
        f"The rendezvous is {setup.master_addr}:{setup.master_port} (rank 0's address facing the controller);",
        f"this rank reaches the controller through interface {setup.socket_ifname or 'unknown'};",
        f"{variable}={ifname} ({who})." if ifname else f"{variable} is not set.",
    ]
    resolved = hostname_address()
    if resolved and ipaddress.ip_address(resolved).is_loopback and setup.num_nodes > 1:
        parts.append(
            f"The hostname {host} resolves to {resolved}, a loopback address (Debian's default /etc/hosts "
            "line): peers cannot connect to an address advertised from it."
        )
    fix = (
        f"Fix: make {variable} name the interface that reaches the other hosts"
        + (f" (here {setup.socket_ifname})" if setup.socket_ifname else "")
        + f", or unset it so thunderviz chooses; and check that {setup.master_addr}:{setup.master_port} and the "
        "peers' ports are reachable from this host (firewall)."
    )
    return " ".join([*parts, fix])


# -- joining and leaving


def set_up(setup: RankSetup) -> None:
    """Set the torchrun environment, import torch and thunder, join the process group, fill the namespace, and
    install the cell hooks.

    Raises:
        RankConnectionError: the store or the peers could not be reached (names the address, interface and fix).
    """
    os.environ.update(
        torchrun_environment(
            rank=setup.rank,
            local_rank=setup.local_rank,
            world_size=setup.world_size,
            local_world_size=setup.local_world_size,
            node_rank=setup.node_rank,
            master_addr=setup.master_addr,
            master_port=setup.master_port,
            threads=setup.threads,
        )
    )
    chosen = _socket_interfaces(setup)
    import torch
    import torch.distributed as dist

    from thunderviz.thunder.compat import import_thunder

    if setup.threads:
        torch.set_num_threads(setup.threads)

    if setup.backend == "nccl":
        torch.cuda.set_device(setup.local_rank)
        device = torch.device("cuda", setup.local_rank)
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        dist.destroy_process_group()
    started = time.monotonic()
    try:
        dist.init_process_group(
            backend=setup.backend,
            store=_store(setup),
            rank=setup.rank,
            world_size=setup.world_size,
            timeout=timedelta(seconds=float(setup.timeout_s)),
        )
    except (RuntimeError, OSError, TimeoutError) as exc:  # DistNetworkError/DistStoreError are RuntimeErrors
        raise RankConnectionError(_connection_advice(setup, exc, chosen, time.monotonic() - started)) from exc
    STATE.setup = setup
    STATE.fabric = STATE.fabric_spec = None
    user_namespace().update(
        torch=torch,
        thunder=import_thunder(),
        rank=setup.rank,
        local_rank=setup.local_rank,
        world_size=setup.world_size,
        device=device,
        fabric=None,
    )
    install_cell_hooks()
    _plain_tracebacks()


def _plain_tracebacks() -> None:
    """Format this rank's tracebacks without colours.

    Why: the kernel strips the colours anyway (``failures.remote_traceback``), and highlighting is most of the cost
    of formatting one: a 34-frame thunder traceback took 3.7 s the first time (pygments' lexer) and 0.44 s after, and
    0.015 s without colours. A rank still formatting its error when ``driver.PEER_GRACE_S`` ends is stopped as a
    peer of the rank that failed first, so the cell then showed one rank's error and the other's interruption where
    both had raised the same error.
    """
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.colors = "nocolor"


def check_process_group(timeout_s: float) -> bool:
    """True when every rank still answers a barrier; after a failed cell this tells whether the group is usable."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return False
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
        else:
            dist.barrier()
        return True
    except Exception:
        return False


def reset() -> None:
    """An in-place restart, for clusters whose engines we cannot replace: leave the process group, empty the
    namespace (``%reset``), forget the strategy. ``set_up`` follows."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    from IPython import get_ipython

    get_ipython().reset(new_session=False)
    STATE.fabric = STATE.fabric_spec = None
    STATE.before = CellSnapshot()
