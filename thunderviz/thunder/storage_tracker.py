"""Dispatch-level accounting of tensor memory for a rehearsal on the meta device, every byte labelled by its kind.

The scheme is torch's own ``MemTracker``'s (a ``TorchDispatchMode`` that sees every op's outputs, one weak reference
per *storage* so views cost nothing and a tensor counts until its last reference dies), so the prediction counts
exactly what a measurement counts. What it adds: a label per storage in the plan's vocabulary
(``trace.memory.CATEGORIES``), given where the storage is made or changes role —

- ``parameters`` (and buffers), ``optimizer state`` and ``inputs``: registered before the step;
- ``gathered parameters``: the result of an ``all_gather`` and what the communication pass unpacks it into;
- ``communication buffers``: what goes into a collective packed (the gathered flat buffer once unpacked, the
  reduce-scatter input);
- ``gradients``: a collective's reduced result, and whatever reaches ``param.grad``;
- ``saved activations``: what autograd keeps for backward (read from the graph when forward ends);
- ``temporaries``: everything else,

and in parallel the split MemTracker itself would report (``trace.memory.MEASURED_GROUPS``), so the report can
compare like with like. Sizes are rounded as the target's allocator rounds them (CUDA: 512-byte blocks, as
``MemTracker`` and the caching allocator do; CPU: exact).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from thunderviz.trace.memory import CATEGORIES, MEASURED_GROUPS, PHASES, MemoryEstimate

__all__ = ["StorageTracker"]

#: Labels a storage keeps once it has them: a parameter saved for backward is still a parameter.
_STICKY = frozenset({"parameters", "optimizer state", "gradients", "gathered parameters", "inputs"})
_CUDA_BLOCK = 512


class StorageTracker(TorchDispatchMode):
    """Tracks every storage made while it is active (and those registered), labelled; keeps the peak's split.

    ``count_devices`` are the device types whose memory counts: the meta device always (the rehearsal's stand-in
    for the target) and the target's host device when the target is the CPU (the optimizer's step counters live
    there). ``phase`` is set by the caller (``PHASES``); ``reset_peak`` starts a new window at the current total.
    """

    def __init__(self, *, cuda_rounding: bool, count_devices: Iterable[str] = ("meta",)) -> None:
        super().__init__()
        self.cuda_rounding = cuda_rounding
        self.count_devices = frozenset(count_devices)
        self.phase = PHASES[0]
        self._info: dict[int, list[Any]] = {}  # id(storage) -> [bytes, category, group, weakref]
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.current_groups = dict.fromkeys(MEASURED_GROUPS, 0)
        self.total = 0
        self.active = False
        self.peak: MemoryEstimate = self._snapshot()

    def __enter__(self) -> StorageTracker:
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.active = False
        super().__exit__(*exc)

    # -- labels ------------------------------------------------------------------------------------------------

    def _bytes(self, st: torch.UntypedStorage) -> int:
        n = st.nbytes()
        if self.cuda_rounding and n:
            n = -(-n // _CUDA_BLOCK) * _CUDA_BLOCK
        return n

    def _forget(self, key: int, _ref: Any = None) -> None:
        info = self._info.pop(key, None)
        if info is not None:
            n, category, group, _ = info
            self.current[category] -= n
            self.current_groups[group] -= n
            self.total -= n

    def label(self, t: Any, category: str, group: str | None = None, *, force: bool = False) -> None:
        """Count ``t``'s storage (once) as ``category``; relabel a known one unless its label is sticky.

        Does nothing while the tracker is not active (the rehearsal's first, compiling step is not counted).
        """
        if not self.active or not isinstance(t, torch.Tensor) or t.device.type not in self.count_devices:
            return
        st = t.untyped_storage()
        key = id(st)
        info = self._info.get(key)
        if group is None:
            group = "optimizer" if self.phase == "optimizer step" else "activations and temporaries"
        if info is None:
            n = self._bytes(st)
            self._info[key] = [n, category, group, weakref.ref(st, lambda ref, k=key: self._forget(k))]
            self.current[category] += n
            self.current_groups[group] += n
            self.total += n
            self._maybe_peak()
            return
        n, old, old_group, _ = info
        if old != category and (force or old not in _STICKY):
            self.current[old] -= n
            self.current[category] += n
            info[1] = category
        if group != old_group and (force or old_group == "activations and temporaries"):
            self.current_groups[old_group] -= n
            self.current_groups[group] += n
            info[2] = group

    def label_all(
        self, tensors: Iterable[Any], category: str, group: str | None = None, *, force: bool = False
    ) -> None:
        for t in tensors:
            self.label(t, category, group, force=force)

    def category_of(self, t: torch.Tensor) -> str | None:
        info = self._info.get(id(t.untyped_storage()))
        return info[1] if info is not None else None

    # -- the peak ----------------------------------------------------------------------------------------------

    def _snapshot(self) -> MemoryEstimate:
        return MemoryEstimate(
            peak_bytes=self.total,
            breakdown=dict(self.current),
            groups=dict(self.current_groups),
            phase=self.phase,
        )

    def _maybe_peak(self) -> None:
        if self.total > self.peak.peak_bytes:
            self.peak = self._snapshot()

    def reset_peak(self) -> None:
        """Start a new window: the peak from here on (what ``torch.cuda.reset_peak_memory_stats`` does)."""
        self.peak = self._snapshot()

    # -- every op ----------------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, lambda t: self.label(t, "temporaries"), out)
        if func is torch.ops.aten.split_with_sizes_copy.out:
            # The communication pass's unpack of a gathered bucket: the pieces are the unsharded parameters, the
            # flat buffer they come from was only the collective's.
            self.label_all((kwargs or {}).get("out", ()), "gathered parameters")
            self.label(args[0], "communication buffers", force=True)
        return out
