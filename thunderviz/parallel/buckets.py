"""Which parameters share one collective: the bucket plan, as plain data (no thunder, no process group).

Why buckets: every collective pays a fixed cost (a rendezvous, a kernel or a gloo round trip, a Python call in the
trace) whatever its size, so one collective per parameter — 53 for a 4-block GPT — costs far more than a few large
ones. What goes together:

- FSDP (``bucketing_strategy``):
  - ``"NONE"``: one bucket per parameter (today's one all_gather / reduce_scatter per parameter);
  - ``"LAYER"``: one bucket per module that owns parameters directly (a ``Linear``'s weight and bias);
  - ``"BLOCK"``: one bucket per *block*. A block is a child of the outermost ``nn.ModuleList`` / ``nn.Sequential``
    whose children are at least two modules of one class, each holding parameters — a transformer's list of decoder
    blocks, a ResNet stage's residual blocks. Parameters outside every block (embeddings, final norm, head) form one
    *root* bucket, as ``fully_shard`` applied per block and then to the root does in torch's FSDP2. A model without
    such a container has only the root bucket.
- DDP: gradients are packed in the order backward produces them, a bucket closing once it holds at least
  ``bucket_size_in_mb`` (``0``: one per gradient), as ``torch.nn.parallel.DistributedDataParallel`` does.

Buckets never mix dtypes, devices or process groups: a collective moves one flat buffer of one dtype. A model with
one bf16 submodule gets that submodule's parameters in buckets of their own (the bucket label is the same; the key
differs).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from thunderviz.parallel.option_values import Bucketing, Parallelism
from thunderviz.trace.buckets import ROOT_LABEL

if TYPE_CHECKING:  # plain Python: the plan reads modules, it never needs torch's code
    from torch import nn

__all__ = [
    "CommConfig",
    "bucket_label",
    "find_blocks",
    "group_in_order",
    "size_capped",
]


@dataclass(frozen=True)
class CommConfig:
    """How one distributed parameter is communicated; attached to the parameter when a strategy sets it up.

    ``param_name`` is the qualified name inside the set-up module ``owner`` (``owner_id`` keeps two set-up modules'
    buckets apart when one jitted function takes both). ``label`` names the FSDP bucket (see ``bucket_label``) and
    ``bucketing`` says how it was chosen (``None`` for DDP, whose buckets are size-capped at trace time);
    ``reshard_after_forward`` is ZERO3 for this parameter (backward gathers it again from its shard);
    ``bucket_cap_bytes`` is the DDP bucket size (``0``: one gradient per all_reduce), ``first_bucket_cap_bytes`` an
    optional smaller cap for the first one; ``reduce_dtype`` (a torch dtype name such as ``float32``, or None for the
    gradient's own) is what the gradient bucket is cast to for its reduction.
    """

    param_name: str
    owner: str
    owner_id: int
    parallelism: Parallelism
    label: str = ROOT_LABEL
    bucketing: Bucketing | None = None
    reshard_after_forward: bool = False
    bucket_cap_bytes: int = 0
    first_bucket_cap_bytes: int = 0
    reduce_dtype: str | None = None

    @property
    def key(self) -> str:
        """Names this parameter of this set-up module uniquely in a process (a trace can print it)."""
        return f"{self.owner_id}:{self.param_name}"


def _is_repeated(container: nn.Module) -> bool:
    children = list(container.children())
    if len(children) < 2:
        return False
    first = type(children[0])
    return all(type(c) is first for c in children) and all(any(True for _ in c.parameters()) for c in children)


def find_blocks(module: nn.Module) -> list[str]:
    """The qualified names of ``module``'s blocks (see the module docstring), in module order."""
    from torch import nn

    blocks: list[str] = []

    def visit(prefix: str, m: nn.Module) -> None:
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and _is_repeated(m):
            blocks.extend(f"{prefix}{name}" for name, _ in m.named_children())
            return  # the outermost repeated container wins: its children are the blocks
        for name, child in m.named_children():
            visit(f"{prefix}{name}.", child)

    visit("", module)
    return blocks


def bucket_label(param_name: str, bucketing: Bucketing | str, blocks: Sequence[str] = ()) -> str:
    """The FSDP bucket a parameter belongs to under ``bucketing``; parameters with equal labels share a bucket."""
    try:
        bucketing = Bucketing(bucketing)
    except ValueError:
        choices = ", ".join(b.value for b in Bucketing)
        raise ValueError(f"bucketing must be one of {choices}, got {bucketing!r}") from None
    if bucketing is Bucketing.NONE:
        return param_name
    if bucketing is Bucketing.LAYER:
        owner, _, _ = param_name.rpartition(".")
        return owner or ROOT_LABEL
    best = ""
    for block in blocks:
        if param_name.startswith(block + ".") and len(block) > len(best):
            best = block
    return best or ROOT_LABEL


def group_in_order(items: Iterable[tuple[Hashable, object]]) -> list[tuple[Hashable, list[object]]]:
    """Group ``(key, item)`` pairs by key; groups in order of their first item, items in the order given."""
    groups: dict[Hashable, list[object]] = {}
    for key, item in items:
        groups.setdefault(key, []).append(item)
    return list(groups.items())


def size_capped(
    sizes: Sequence[tuple[Hashable, int]], cap_bytes: int, first_cap_bytes: int | None = None
) -> list[list[int]]:
    """DDP buckets: indices into ``sizes`` (``(key, nbytes)`` in gradient-ready order) grouped per key.

    A bucket closes once it holds at least its cap (``first_cap_bytes`` for each key's first bucket when given,
    as torch DDP's smaller first bucket starts communication early); ``cap_bytes <= 0`` gives one bucket per entry.
    Buckets are returned in the order their last member becomes ready.
    """
    open_: dict[Hashable, list[int]] = {}
    open_bytes: dict[Hashable, int] = {}
    closed_count: dict[Hashable, int] = {}
    done: list[list[int]] = []
    for i, (key, nbytes) in enumerate(sizes):
        members = open_.setdefault(key, [])
        members.append(i)
        open_bytes[key] = open_bytes.get(key, 0) + nbytes
        n_closed = closed_count.get(key, 0)
        cap = cap_bytes
        if cap > 0 and first_cap_bytes and n_closed == 0:
            cap = min(first_cap_bytes, cap_bytes)
        if cap <= 0 or open_bytes[key] >= cap:
            done.append(members)
            open_[key] = []
            open_bytes[key] = 0
            closed_count[key] = n_closed + 1
    leftovers = [m for m in open_.values() if m]
    done.extend(leftovers)
    return sorted(done, key=lambda b: b[-1])
