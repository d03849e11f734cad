"""Rank side: who this engine is, asked once per set-up (``identify``), before it has a rank.

The answer (``topology.EngineIdentity``) is what the kernel needs to number the engines as ranks grouped by host,
to kill one by pid, and to know which address and interface of each engine face the cluster (the ones that reach
the controller). Importing this module is cheap: torch loads inside ``identify``.
"""

from __future__ import annotations

import os
import socket

from thunderviz.pool.rendezvous import route_to
from thunderviz.pool.topology import EngineIdentity

__all__ = ["identify"]


def identify(engine_id: int, controller_host: str = "127.0.0.1", controller_port: int = 0) -> EngineIdentity:
    """This engine's identity; ``engine_id`` is the id the kernel's client knows it by (it is echoed back so the
    answer is complete on its own)."""
    try:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # torch broken on this host: set_up reports the import error per rank
        cuda_devices = 0
    try:
        address, interface = route_to(controller_host, controller_port)
    except OSError:
        address, interface = None, None
    return EngineIdentity(
        engine_id=engine_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        cuda_devices=int(cuda_devices),
        cpus=os.cpu_count() or 1,
        address=address,
        interface=interface,
    )
