"""Which thunder symbols are collectives: the one table from symbol id to collective kind.

Execution traces hold the torch executor's implementations (``torch_all_gather_prim_impl`` ...), earlier stages the
distributed prims (``all_gather`` ...); both map to the kinds of the trace model (``trace.model.COLLECTIVE_KINDS``).
The snapshot reads the table to mark collectives, the communication pass to find the ones it rewrites.

Thunder is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import functools
from typing import Any

from thunderviz.trace.model import COLLECTIVE_KINDS

__all__ = ["collective_kinds", "executed_collective_ids"]


@functools.cache
def executed_collective_ids() -> dict[str, Any]:
    """Collective kind -> symbol id of the torch executor's implementation: what execution traces hold."""
    import thunder.executors.torchex as torchex

    ids = {}
    for kind in COLLECTIVE_KINDS:
        impl = getattr(torchex, f"{kind}_prim_impl", None)
        if impl is not None:
            ids[kind] = impl.id
    return ids


@functools.cache
def collective_kinds() -> dict[Any, str]:
    """Symbol id -> collective kind, for the torch executor's implementations and the distributed prims."""
    import torch.distributed

    kinds = {sid: kind for kind, sid in executed_collective_ids().items()}
    if torch.distributed.is_available():  # thunder defines its distributed prims only then
        import thunder.distributed.prims as dist_prims

        for kind in COLLECTIVE_KINDS:
            kinds[getattr(dist_prims, kind).id] = kind
    return kinds
