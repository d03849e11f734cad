"""Where FSDP keeps gradients between micro-batches under ``fabric.no_backward_sync``: one ``GradAccumulator`` per
sharded parameter.

Why outside the trace: an accumulating backward must not reduce_scatter (that is the point), but the unsharded
gradient it computes cannot go to ``param.grad`` either — autograd requires a shard-shaped gradient for a shard. So
the communication pass's gradient buckets (``thunder.comm.reductions``) have the accumulating backward add each
bucket's unsharded gradients into these accumulators and return no gradient for those parameters, and the next
synchronizing backward's bucket packs add what was accumulated before the one reduce_scatter of that bucket. The cost
is memory: every sharded parameter's unsharded gradient, i.e. a full copy of the gradients on every rank
(``world_size`` times the sharded gradients), kept from the first accumulating micro-batch until that synchronizing
backward.

Sums are kept in the gradient's dtype, or in ``reduce_dtype`` when that is wider (fp32 sums for bf16 gradients):
the accumulated sum is the quantity whose precision ``reduce_dtype`` asks for. A gradient whose division by the
world size was fused where the pass could not fold it arrives already divided; it is kept in a sum of its own.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["GradAccumulator", "accumulation_dtype", "any_pending", "lookup", "register"]


def accumulation_dtype(grad_dtype: torch.dtype, reduce_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a parameter's accumulated gradient is summed in: the wider of its own and the reduce dtype."""
    if reduce_dtype is None or torch.finfo(reduce_dtype).bits <= torch.finfo(grad_dtype).bits:
        return grad_dtype
    return reduce_dtype


class GradAccumulator:
    """One parameter's unsharded gradient summed over accumulating micro-batches (``None`` when nothing pends)."""

    #: how many accumulators in this process hold a sum: every synchronizing backward asks whether one was left out,
    #: and scanning ~100 parameters for it cost ~1 ms of host time per step (bench/gpu_step_breakdown.py)
    holding = 0

    def __init__(self, param_name: str, key: str) -> None:
        self.param_name = param_name
        self.key = key
        self.undivided: torch.Tensor | None = None
        self.divided: torch.Tensor | None = None

    @property
    def pending(self) -> bool:
        return self.undivided is not None or self.divided is not None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.undivided, self.divided) if t is not None)

    @torch.no_grad()
    def add(self, grad: torch.Tensor, *, divided: bool, dtype: torch.dtype) -> None:
        current = self.divided if divided else self.undivided
        if not self.pending:
            GradAccumulator.holding += 1
        if current is None:
            current = grad.detach().to(dtype, copy=True)
        else:
            current.add_(grad.detach().to(dtype))
        if divided:
            self.divided = current
        else:
            self.undivided = current

    def take(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(undivided sum, divided sum), and forget them: the synchronizing backward reduces them now."""
        out = (self.undivided, self.divided)
        self.clear()
        return out

    def clear(self) -> None:
        if self.pending:
            GradAccumulator.holding -= 1
        self.undivided = self.divided = None

    def __del__(self) -> None:
        if self.pending:
            GradAccumulator.holding -= 1


def any_pending() -> bool:
    """Whether any accumulator in this process holds a sum (cheap: no parameter is visited)."""
    return GradAccumulator.holding > 0


#: key -> accumulator; the parameter holds the accumulator (``param_tags.set_accumulator``), traces name it by key (a
#: string prints into a trace; an object would not), so a trace never keeps a parameter's state alive.
_REGISTRY: weakref.WeakValueDictionary[str, GradAccumulator] = weakref.WeakValueDictionary()


def register(accumulator: GradAccumulator, key: str) -> GradAccumulator:
    _REGISTRY[key] = accumulator
    return accumulator


def lookup(key: str) -> GradAccumulator:
    try:
        return _REGISTRY[key]
    except KeyError:
        raise RuntimeError(
            f"thunderviz: the gradient accumulator {key!r} a trace refers to no longer exists (its parameter was"
            " freed). Set the model up again with fabric.setup and call it anew."
        ) from None
