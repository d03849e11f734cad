"""A bucket as it appears in a trace: which parameters one packed collective carried, where it was issued and
awaited. Plain data, read by the trace model, the trace file, the ledger and the graphs; how buckets are *planned*
(which parameters go together) is ``thunderviz.parallel.buckets``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thunderviz.trace.units import format_bytes

__all__ = ["ACCUMULATE_KIND", "BUCKET_KINDS", "MESH_GROUP_WORDS", "ROOT_LABEL", "Bucket", "is_bucket_group"]

#: The collectives a bucket can be packed for.
BUCKET_KINDS = ("all_gather", "reduce_scatter", "all_reduce")
#: The kind of a gradient bucket a no_backward_sync backward accumulates instead of reducing (no collective).
ACCUMULATE_KIND = "accumulate"

#: How a name says which group of a hybrid mesh a collective runs over (``Bucket.mesh_group``).
MESH_GROUP_WORDS = {"shard": " in the shard group", "replica": " across replicas"}

#: The label of the bucket holding parameters outside every block (BLOCK) or owned by the set-up module itself.
ROOT_LABEL = "(root)"


@dataclass
class Bucket:
    """One collective's worth of parameters, as the communication pass laid it out in a trace.

    ``kind`` is the collective (``all_gather``, ``reduce_scatter`` or ``all_reduce``; ``accumulate`` for a gradient
    bucket kept without communication, ``TraceSnapshot.accumulated``), ``trace`` ``forward`` or
    ``backward``, ``params`` the parameters' qualified names in buffer order, ``bytes`` what this rank puts into the
    collective, ``issue_index`` / ``wait_index`` the positions of the collective and its wait among the trace's
    bound symbols (their distance is the compute the communication can overlap). ``mesh_group`` says which ranks
    the collective runs over under hybrid sharding: ``shard`` (the ranks sharing one set of shards, by default one
    host) or ``replica`` (the ranks holding the same shard, one per shard group: the inter-host traffic); empty
    when it runs over every rank.
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
    mesh_group: str = ""

    # -- one short name everywhere: the parameter list is for details, never for a label

    @property
    def title(self) -> str:
        """``blocks.0``, ``root``, ``bucket #0`` (DDP numbers its buckets)."""
        if self.label == ROOT_LABEL:
            return "root"
        return f"bucket {self.label}" if self.label.startswith("#") else self.label

    @property
    def group(self) -> str:
        """``all_gather blocks.0``: the graph node (and the module name of the ops) of this bucket's communication;
        hybrid sharding's replica all_reduce is ``all_reduce blocks.0 across replicas``."""
        return f"{self.kind} {self.title}" + (" across replicas" if self.mesh_group == "replica" else "")

    @property
    def summary(self) -> str:
        """``blocks.0 (12 params, 97.6 KiB)``; a reduction carries gradients: ``blocks.0 (12 grads, 97.6 KiB)``."""
        what = "params" if self.kind == "all_gather" else "grads"
        return f"{self.title} ({len(self.params)} {what}, {format_bytes(self.bytes)})"

    @property
    def short_name(self) -> str:
        """``all_gather blocks.0 (12 params, 97.6 KiB)``: how every summary, headline and tooltip names it."""
        return f"{self.kind} {self.summary}{MESH_GROUP_WORDS.get(self.mesh_group, '')}"

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
            **({"mesh_group": self.mesh_group} if self.mesh_group else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Bucket:
        """The inverse of ``to_dict`` for trusted data (trace files are read through ``trace_file``'s checks)."""
        return cls(**{k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in d.items()})  # type: ignore[arg-type]


def is_bucket_group(name: str | None) -> bool:
    """Whether a module group name is a bucket's (``all_gather blocks.0``), not a model module's."""
    return bool(name) and name.split(" ", 1)[0] in BUCKET_KINDS and " " in name  # type: ignore[union-attr]
