"""A bucket as it appears in a trace: which parameters one packed collective carried, where it was issued and
awaited. Plain data, read by the trace model, the trace file, the ledger and the graphs; how buckets are *planned*
(which parameters go together) is ``thunderviz.parallel.buckets``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ACCUMULATE_KIND", "BUCKET_KINDS", "ROOT_LABEL", "Bucket"]

#: The collectives a bucket can be packed for.
BUCKET_KINDS = ("all_gather", "reduce_scatter", "all_reduce")
#: The kind of a gradient bucket a no_backward_sync backward accumulates instead of reducing (no collective).
ACCUMULATE_KIND = "accumulate"

#: The label of the bucket holding parameters outside every block (BLOCK) or owned by the set-up module itself.
ROOT_LABEL = "(root)"


@dataclass
class Bucket:
    """One collective's worth of parameters, as the communication pass laid it out in a trace.

    ``kind`` is the collective (``all_gather``, ``reduce_scatter`` or ``all_reduce``; ``accumulate`` for a gradient
    bucket kept without communication, ``TraceSnapshot.accumulated``), ``trace`` ``forward`` or
    ``backward``, ``params`` the parameters' qualified names in buffer order, ``bytes`` what this rank puts into the
    collective, ``issue_index`` / ``wait_index`` the positions of the collective and its wait among the trace's
    bound symbols (their distance is the compute the communication can overlap).
    """

    kind: str
    trace: str
    label: str
    params: list[str]
    bytes: int
    dtype: str
    issue_index: int = -1
    wait_index: int = -1
    sends: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    reshard_after_forward: bool = False
    future: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "trace": self.trace,
            "label": self.label,
            "params": list(self.params),
            "bytes": self.bytes,
            "dtype": self.dtype,
            "issue_index": self.issue_index,
            "wait_index": self.wait_index,
            "sends": list(self.sends),
            "results": list(self.results),
            "reshard_after_forward": self.reshard_after_forward,
            "future": self.future,
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Bucket:
        """The inverse of ``to_dict`` for trusted data (trace files are read through ``trace_file``'s checks)."""
        return cls(**{k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in d.items()})  # type: ignore[arg-type]
