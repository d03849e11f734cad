"""What a run trains, as far as comparing strategies goes: the model, one rank's batch, the optimizer, the world.

Why a fact of its own: the "which strategy?" table and the demo page's "Runs compared" rank runs against each other,
and a ranking only means something between runs that did the same work. A DDP cell with SGD is lean next to a ZERO2
cell with AdamW because SGD keeps no state, not because DDP is; a page that called it "the leanest peak per rank"
contradicted the plan, which had just said DDP with AdamW does not fit. Runs are compared within one workload, and a
plan's candidates join the runs whose workload the plan predicted. Plain data: reports and plans carry it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from thunderviz.trace.units import format_count

__all__ = ["Workload", "tensor_text"]


def tensor_text(dtype: str, shape: Iterable[int]) -> str:
    """``int64[2, 16]``: how a workload spells one input (dtype as ``torch.int64`` or ``int64``)."""
    name = str(dtype).rsplit(".", 1)[-1].rstrip("_")
    return f"{name}[{', '.join(str(int(d)) for d in shape)}]"


@dataclass(frozen=True)
class Workload:
    """One run's work. ``model`` is the trained module's class name, ``parameters`` its parameters' elements as built
    (unsharded), ``batch`` one rank's tensor inputs per step (``tensor_text``), ``optimizer`` the class of the
    optimizer that stepped (``""``: no optimizer step), ``world_size`` the ranks. Two runs are compared when their
    workloads are equal."""

    model: str
    parameters: int
    batch: tuple[str, ...]
    optimizer: str
    world_size: int

    def describe(self) -> str:
        """``TinyGPT (53.1k parameters), batch int64[2, 16], AdamW, 2 ranks``."""
        batch = " + ".join(self.batch) or "no tensor input"
        return (
            f"{self.model} ({format_count(self.parameters)} parameters), batch {batch},"
            f" {self.optimizer or 'no optimizer step'}, {self.world_size} rank{'' if self.world_size == 1 else 's'}"
        )

    def differences(self, other: Workload) -> list[str]:
        """What sets ``other`` apart from this workload, in words (``["SGD instead of AdamW"]``); empty when equal."""
        out = []
        if (self.model, self.parameters) != (other.model, other.parameters):
            out.append(
                f"{other.model} of {format_count(other.parameters)} parameters instead of {self.model} of"
                f" {format_count(self.parameters)}"
            )
        if self.batch != other.batch:
            out.append(f"batch {' + '.join(other.batch) or 'none'} instead of {' + '.join(self.batch) or 'none'}")
        if self.optimizer != other.optimizer:
            out.append(f"{other.optimizer or 'no optimizer step'} instead of {self.optimizer or 'no optimizer step'}")
        if self.world_size != other.world_size:
            out.append(f"{other.world_size} ranks instead of {self.world_size}")
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "parameters": self.parameters,
            "batch": list(self.batch),
            "optimizer": self.optimizer,
            "world_size": self.world_size,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Workload:
        return cls(
            model=str(d["model"]),
            parameters=int(d["parameters"]),  # type: ignore[call-overload]
            batch=tuple(str(b) for b in d.get("batch") or ()),  # type: ignore[union-attr]
            optimizer=str(d.get("optimizer", "")),
            world_size=int(d["world_size"]),  # type: ignore[call-overload]
        )
