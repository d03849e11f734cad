"""Setting the ranks up, kernel side: who each engine is, and what each rank is told to join the process group.

``RankEngine`` runs these at the start of a pool and after each restart (``pool.engine``): every engine answers
``rank.calls.identify`` with its ``EngineIdentity`` (bounded: an engine that died or is busy is named, not waited on
forever), ``topology.layout_ranks`` numbers them by host, and each rank gets its ``protocol.RankSetup`` (torchrun's
environment, its socket interface, the rendezvous, the backend and our timeout).
"""

from __future__ import annotations

import time

from thunderviz.cell.protocol import RankSetup
from thunderviz.errors import RankError
from thunderviz.pool.cluster import RankCluster, controller_address
from thunderviz.pool.topology import EngineIdentity, RankLayout
from thunderviz.rank import calls as inside_rank

__all__ = ["IDENTIFY_TIMEOUT_S", "SETUP_TIMEOUT_S", "identify_engines", "rank_setups"]

#: How long the ranks get to join the process group (and to reset in place) before set-up gives up.
SETUP_TIMEOUT_S = 180.0
#: How long every engine gets to say who it is before set-up gives up on it.
IDENTIFY_TIMEOUT_S = 60.0


def identify_engines(cluster: RankCluster, ids: list[int]) -> dict[int, EngineIdentity]:
    """Ask every engine who it is (bounded); an engine that died or does not answer is named in a RankError."""
    from ipyparallel.error import RemoteError

    client = cluster.client
    controller = controller_address(client)
    requests = {eid: client[eid].apply_async(inside_rank.identify, eid, *controller) for eid in ids}
    deadline = time.monotonic() + IDENTIFY_TIMEOUT_S
    identities: dict[int, EngineIdentity] = {}
    problems = []
    for eid, request in requests.items():
        try:
            identity = request.get(max(0.1, deadline - time.monotonic()))
            if not isinstance(identity, EngineIdentity) or identity.engine_id != eid:
                problems.append(
                    f"engine {eid} answered identify() with {identity!r}, not its EngineIdentity: it runs another "
                    "thunderviz than this kernel; restart it from this environment"
                )
                continue
            identities[eid] = identity
        except TimeoutError:
            problems.append(f"engine {eid} did not answer within {IDENTIFY_TIMEOUT_S:.0f} s (busy?)")
        except RemoteError as exc:
            problems.append(f"engine {eid}: {exc.ename}: {exc.evalue}")
        except Exception as exc:
            problems.append(f"engine {eid}: {type(exc).__name__}: {exc}")
    if problems:
        raise RankError(
            f"Could not set up ranks on the engines of the {cluster.description}: {'; '.join(problems)}. "
            "Make sure every engine is alive and idle, then run the cell again."
        )
    return identities


def rank_setups(
    layout: RankLayout, *, master_addr: str, master_port: int, backend: str, timeout_s: float
) -> dict[int, RankSetup]:
    """What each rank of ``layout`` is told to join the process group, by rank."""
    return {
        rank: RankSetup(
            rank=rank,
            local_rank=layout.local_rank(rank),
            world_size=layout.world_size,
            local_world_size=layout.local_world_size,
            node_rank=layout.node_rank(rank),
            num_nodes=layout.num_nodes,
            master_addr=master_addr,
            master_port=master_port,
            backend=backend,
            timeout_s=timeout_s,
            threads=layout.threads_per_rank,
            socket_ifname=layout.engines[rank].interface,
        )
        for rank in sorted(layout.rank_to_engine)
    }
