"""What a rank puts on the wire: the one accounting of communication every view and the plan use.

A collective's *sent bytes* on a rank are what that rank sends to the others under a ring algorithm, as torch's
NCCL and gloo backends run large collectives, over a group of ``W`` ranks:

- ``all_gather`` of a shard of ``n`` bytes: ``(W - 1) * n`` (the rank forwards every other rank's shard once);
- ``reduce_scatter`` of an input of ``n`` bytes: ``(W - 1) / W * n`` (one chunk per ring step);
- ``all_reduce`` of a buffer of ``n`` bytes: ``2 (W - 1) / W * n`` (a reduce-scatter, then an all-gather);
- ``broadcast`` of ``n`` bytes: ``n`` (a pipelined ring: every rank but the last forwards the whole buffer);
- on one rank nothing moves.

*Bytes sent per step* are the sum over one step's collectives (forward and backward traces) on one rank; a run's
number is its busiest rank's. The ledger (``trace.ledger.Ledger.sent_bytes``), the comparison verdicts
(``trace.diff``), the plan's candidates (``thunder.memory.rehearsal``), the "which strategy?" table and the host traffic
split all count with ``ring_bytes``; the size of the tensor a collective takes (``LedgerEntry.bytes``) is a
different fact and is never summed as "sent". Why one rule: the verdict once summed each collective's input, the
table the ring formula, and one page said ZERO2 sends 1.5x and 1.0x DDP's bytes at once.
"""

from __future__ import annotations

__all__ = ["SENDING_KINDS", "ring_bytes"]

#: The collectives that put bytes on the wire (a wait sends nothing).
SENDING_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")


def ring_bytes(kind: str, nbytes: int, group_size: int) -> int:
    """Bytes one rank sends for one collective whose input on this rank is ``nbytes``, over ``group_size`` ranks
    (see the module docstring).

    Raises:
        ValueError: ``kind`` is not one of ``SENDING_KINDS``.
    """
    w = group_size
    if kind not in SENDING_KINDS:
        raise ValueError(f"ring_bytes: unknown collective kind {kind!r}; the kinds are {', '.join(SENDING_KINDS)}")
    if w <= 1:
        return 0
    if kind == "all_gather":
        return (w - 1) * nbytes
    if kind == "reduce_scatter":
        return (w - 1) * nbytes // w
    if kind == "broadcast":
        return nbytes
    return 2 * (w - 1) * nbytes // w
