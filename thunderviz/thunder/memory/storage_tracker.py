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
- ``saved activations``: what autograd keeps for backward (read from the graph when forward ends), also a gathered
  parameter, a communication buffer or the batch that forward keeps (the memory account's order: ``trace.memory``);
  once saved, a storage stays saved, whatever views backward takes of it;
- ``temporaries``: everything else,

A storage that becomes a gradient (a collective's reduced result, or what reaches ``.grad``) after the peak but was
alive at it counts as ``gradients`` in the peak's breakdown: the gradients of the memory account
(``trace.memory.ACCOUNT``) are those alive at the peak whether or not they reached ``.grad`` yet, as the meter counts
them (``thunder.memory.meter``); under DDP the peak sits in backward before the bucket's all_reduce, and the bucket it
packed is what the ``.grad`` become views of. The peak's total and its MemTracker split (``groups``) do not change.

and in parallel the split MemTracker itself would report (``trace.memory.MEASURED_GROUPS``), so the report can
compare like with like. Sizes are rounded as the target's allocator rounds them (CUDA: 512-byte blocks, as
``MemTracker`` and the caching allocator do; CPU: exact).

Inside a ``torch.compile`` fusion region (``fused_region``; the rehearsal runs a region's ops one by one, see
``executors.uncompiled_fusions``) a tensor made by a pointwise or view op is *virtual*: inductor fuses such chains
into one kernel and never allocates the intermediate. It takes memory only when something needs it as a buffer: an
extern kernel (matmul, convolution, attention: ``_EXTERN``) runs while it is alive (the fused kernel before it
writes out everything a later op reads, the extern kernel's inputs included), or the region returns it; from then
on it counts like any temporary. Reductions and other ops inductor generates code for read virtual inputs without
materializing them, and their own outputs count. (The region's ops run as thunder's execution trace, which deletes
each intermediate after its last use, so "alive" is "read later".) Why: on an H200, once our comm pass re-fused a
block's backward into one region (``fusion_regions``), counting every intermediate of that region overstated the
step peak by 17% (predicted 1431 MiB against 1224 MiB measured for DDP; per-parameter regions had overstated it by
4%). With this rule the same plan predicts 1239 MiB (+1.2%), and ZERO2 BLOCK 1319 against 1352 MiB (-2.4%).

Several world sizes at once: under FSDP a storage is either *sharded* (a parameter shard, its gradient, its
optimizer state and the optimizer's temporaries, what an all_gather sends, what a reduce_scatter returns) or not
(everything computed from gathered weights: activations, full gradients, gathered weights). When no parameter needs
padding at any of the world sizes, running the step at one of them (``reference``) and counting every sharded
storage at ``bytes * reference / W`` for each other ``W`` gives, event by event, exactly what running at ``W`` would
count; ``peaks[W]`` is that world size's peak. ``tests/thunder/test_rehearsal.py`` checks it against a rehearsal at
``W`` itself.

The step's *timeline* (``timeline(W)``, a ``parallel.extrapolation.Timeline``) is the split at every moment a new
total was reached, not only at the peak, with the block computing at each moment: the block whose parameters (or
their gathered copies) the last op read, given by ``mark_blocks``. A pack of one block's shards, the all_gather of it
and the unpack carry that block's mark to the gathered parameters without being computation themselves. The plan
extrapolates a model cut to a few blocks from these (``parallel.extrapolation``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from thunderviz.parallel.extrapolation import MANY, Timeline
from thunderviz.trace.memory import CATEGORIES, MEASURED_GROUPS, PHASES, MemoryEstimate

__all__ = ["StorageTracker"]

#: Labels a storage keeps once it has them: a parameter saved for backward is still a parameter.
_STICKY = frozenset(
    {"parameters", "optimizer state", "gradients", "gathered parameters", "inputs", "saved activations"}
)
#: What autograd saving a storage for backward makes ``saved activations`` although its label is sticky: anything but
#: a parameter, a gradient or optimizer state, the memory account's order (``trace.memory``), which the meter applies
#: to what it measures (``thunder.memory.meter``): a ZERO2 gathered parameter forward keeps is saved for backward on
#: both sides.
_SAVED_OVER = frozenset({"gathered parameters", "inputs", "communication buffers", "temporaries"})
_CUDA_BLOCK = 512
_OTHER = "activations and temporaries"


#: aten ops inductor runs as library kernels on materialized buffers (the rest it generates code for, fusing inputs)
_EXTERN = frozenset(
    {"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "convolution", "convolution_backward", "cat"}
)
#: aten ops that are not tagged pointwise but that inductor fuses like one (copies, casts, fills)
_FUSED_LIKE_POINTWISE = frozenset(
    {"_to_copy", "clone", "copy", "fill", "full", "full_like", "zeros_like", "ones_like", "empty_like", "lift_fresh"}
)


def _virtual_output(func: Any) -> bool:
    """True when ``func``'s outputs stay inside a fused kernel (pointwise, view, cast)."""
    return torch.Tag.pointwise in func.tags or func.is_view or func._opname in _FUSED_LIKE_POINTWISE


def _reads_buffers(func: Any) -> bool:
    """True when ``func`` runs as an extern kernel that needs its tensor inputs in memory."""
    name = func._opname
    return name in _EXTERN or name.startswith(("_scaled_dot_product", "_flash_attention", "_efficient_attention"))


class _Count:
    """Running totals per category and per measured group, and the peak, for one world size."""

    def __init__(self) -> None:
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.groups = dict.fromkeys(MEASURED_GROUPS, 0)
        self.total = 0
        self.peak = self.snapshot(PHASES[0])
        self.peak_event = 0
        # the timeline's values at this world size (the moments themselves are the tracker's)
        self.moments: list[tuple[int, ...]] = []
        self.moment_groups: list[tuple[int, ...]] = []
        self.regrads: list[tuple[int, int, list[tuple[int, str]], int]] = []

    def became_gradient(self, n: int, old: str) -> None:
        """A storage alive at the peak, counted there as ``old``, is a gradient (see the module docstring)."""
        breakdown = dict(self.peak.breakdown)
        moved = min(n, breakdown[old])
        breakdown[old] -= moved
        breakdown["gradients"] += moved
        p = self.peak
        self.peak = MemoryEstimate(p.peak_bytes, breakdown, p.groups, p.phase, p.how)

    def add(self, n: int, category: str, group: str) -> None:
        self.current[category] += n
        self.groups[group] += n
        self.total += n

    def snapshot(self, phase: str) -> MemoryEstimate:
        return MemoryEstimate(self.total, dict(self.current), dict(self.groups), phase)

    def record(self) -> None:
        self.moments.append(tuple(self.current.values()))
        self.moment_groups.append(tuple(self.groups.values()))


def _category_at(history: list[tuple[int, str]], event: int) -> str | None:
    """A storage's category as it was at ``event`` (None: it did not exist yet)."""
    then = None
    for at, category in history:
        if at > event:
            break
        then = category
    return then


class StorageTracker(TorchDispatchMode):
    """Tracks every storage made while it is active (and those registered), labelled; keeps the peak's split.

    ``count_devices`` are the device types whose memory counts: the meta device always (the rehearsal's stand-in
    for the target) and the target's host device when the target is the CPU (the optimizer's step counters live
    there). ``phase`` is set by the caller (``PHASES``); ``reset_peak`` starts a new window at the current total.
    ``reference`` is the world size the step runs at and ``world_sizes`` every one counted (see the module doc);
    ``sharding`` says whether sharded storages exist at all (FSDP).
    """

    def __init__(
        self,
        *,
        cuda_rounding: bool,
        count_devices: Iterable[str] = ("meta",),
        reference: int = 1,
        world_sizes: Iterable[int] = (),
        sharding: bool = False,
    ) -> None:
        super().__init__()
        self.cuda_rounding = cuda_rounding
        self.count_devices = frozenset(count_devices)
        self._phase = PHASES[0]
        self._pending = False
        self.reference = reference
        self.sharding = sharding
        self.counts = {w: _Count() for w in dict.fromkeys([reference, *world_sizes])}
        # id(storage) -> [sizes per world size, category, group, weakref, sharded, [(event, category)]]
        self._info: dict[int, list[Any]] = {}
        self._event = 0  # counts the changes, so a storage's labels can be read as they were at the peak
        self.active = False
        # inside a fusion region: id(storage) -> weak reference of the storages no kernel has materialized yet
        self._region_depth = 0
        self._virtual: dict[int, Any] = {}
        # the timeline's moments (``timeline``) and the block each storage of a block's parameters belongs to
        self._moment_events: list[int] = []
        self._moment_phases: list[str] = []
        self._moment_marks: list[Any] = []
        self._moment_ops: list[str] = []
        self._op = ""
        self._block_of: dict[int, int | None] = {}
        self._mark: Any = None
        self.blocks = 0

    def __enter__(self) -> StorageTracker:
        self.active = True
        self._track_resize()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.resolve()
        self.active = False
        torch.UntypedStorage.resize_ = self._original_resize  # type: ignore[method-assign]
        super().__exit__(*exc)

    def _track_resize(self) -> None:
        """Follow ``UntypedStorage.resize_``, which no dispatch mode sees, as ``MemTracker`` does: the communication
        pass frees its buffers by resizing them to 0 (``comm.ops._free``), so their bytes go when that happens."""
        original = self._original_resize = torch.UntypedStorage.resize_
        tracker = self

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = original(st, size)
            tracker._resized(st)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]

    def _resized(self, st: torch.UntypedStorage) -> None:
        info = self._info.get(id(st))
        if info is None:
            return
        sizes, category, group, _, shard, _ = info
        new_sizes = self._sizes(st.nbytes(), shard)
        self.resolve()
        for w, count in self.counts.items():
            count.add(new_sizes[w] - sizes[w], category, group)
        info[0] = new_sizes
        self._pending = True

    @property
    def phase(self) -> str:
        """Where the step is (``PHASES``); a new phase first settles the last change (it happened in the old one)."""
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self.resolve()
        self._phase = value

    # -- what the reference world size sees (the common case: one world size) --------------------------------

    @property
    def total(self) -> int:
        return self.counts[self.reference].total

    @property
    def current(self) -> dict[str, int]:
        return self.counts[self.reference].current

    @property
    def peak(self) -> MemoryEstimate:
        return self.counts[self.reference].peak

    @property
    def peaks(self) -> dict[int, MemoryEstimate]:
        return {w: c.peak for w, c in self.counts.items()}

    # -- labels ------------------------------------------------------------------------------------------------

    def _sizes(self, raw: int, sharded: bool) -> dict[int, int]:
        out = {}
        for w in self.counts:
            n = raw * self.reference // w if sharded else raw
            if self.cuda_rounding and n:
                n = -(-n // _CUDA_BLOCK) * _CUDA_BLOCK
            out[w] = n
        return out

    def _forget(self, key: int, _ref: Any = None) -> None:
        self._block_of.pop(key, None)
        info = self._info.pop(key, None)
        if info is not None:
            self.resolve()
            sizes, category, group, _, _, _ = info
            self._event += 1
            for w, count in self.counts.items():
                count.add(-sizes[w], category, group)

    def _default_sharded(self, t: torch.Tensor) -> bool:
        """FSDP's optimizer step works on shards only: what it makes is sharded (but not a 1-element counter)."""
        return self.sharding and self.phase == "optimizer step" and t.numel() > 1

    def label(
        self,
        t: Any,
        category: str,
        group: str | None = None,
        *,
        force: bool = False,
        sharded: bool | None = None,
    ) -> None:
        """Count ``t``'s storage (once) as ``category``; relabel a known one unless its label is sticky.

        ``sharded``: the storage is one of FSDP's shards (see the module doc); default: known from where it is made.
        Does nothing while the tracker is not active (the rehearsal's first, compiling step is not counted).
        """
        if not self.active or not isinstance(t, torch.Tensor) or t.device.type not in self.count_devices:
            return
        st = t.untyped_storage()
        key = id(st)
        if key in self._virtual:
            return
        info = self._info.get(key)
        if group is None:
            group = "optimizer" if self.phase == "optimizer step" else _OTHER
        if info is None:
            shard = self.sharding and (sharded if sharded is not None else self._default_sharded(t))
            self._add(st, category, group, shard)
            return
        sizes, old, old_group, _, shard, history = info
        relabel = force or old not in _STICKY or (category == "saved activations" and old in _SAVED_OVER)
        new_category = category if old != category and relabel else old
        new_group = group if group != old_group and (force or old_group == _OTHER) else old_group
        new_shard = shard or bool(self.sharding and sharded)
        new_sizes = self._sizes(st.nbytes(), new_shard) if new_shard != shard else sizes
        if (new_category, new_group, new_shard) == (old, old_group, shard):
            return
        if new_category == "gradients" and old != "gradients":
            self.resolve()
            for w, count in self.counts.items():
                then = _category_at(history, count.peak_event)
                if then is not None and then != "gradients":
                    count.became_gradient(sizes[w], then)
                count.regrads.append((history[0][0], self._event + 1, list(history), sizes[w]))
        for w, count in self.counts.items():
            count.add(-sizes[w], old, old_group)
            count.add(new_sizes[w], new_category, new_group)
        self._event += 1
        history.append((self._event, new_category))
        info[0], info[1], info[2], info[4] = new_sizes, new_category, new_group, new_shard
        self._pending = True

    def _add(self, st: torch.UntypedStorage, category: str, group: str, shard: bool) -> None:
        key = id(st)
        sizes = self._sizes(st.nbytes(), shard)
        self._event += 1
        ref = weakref.ref(st, lambda ref, k=key: self._forget(k))
        self._info[key] = [sizes, category, group, ref, shard, [(self._event, category)]]
        for w, count in self.counts.items():
            count.add(sizes[w], category, group)
        self._pending = True

    def label_all(
        self, tensors: Iterable[Any], category: str, group: str | None = None, *, force: bool = False
    ) -> None:
        for t in tensors:
            self.label(t, category, group, force=force)

    def category_of(self, t: torch.Tensor) -> str | None:
        info = self._info.get(id(t.untyped_storage()))
        return info[1] if info is not None else None

    def _is_shard(self, t: Any) -> bool:
        info = self._info.get(id(t.untyped_storage())) if isinstance(t, torch.Tensor) else None
        return info is not None and info[4]

    # -- the peak ----------------------------------------------------------------------------------------------

    def resolve(self) -> None:
        """Take a new maximum if the last change made one (see the module docstring: changes are settled first)."""
        if not self._pending:
            return
        self._pending = False
        for count in self.counts.values():
            if count.total > count.peak.peak_bytes:
                count.peak = count.snapshot(self.phase)
                count.peak_event = self._event
        self._record()

    def _record(self) -> None:
        self._moment_events.append(self._event)
        self._moment_phases.append(self._phase)
        self._moment_marks.append(self._mark)
        self._moment_ops.append(self._op)
        for count in self.counts.values():
            count.record()

    def reset_peak(self) -> None:
        """Start a new window: the peak from here on (what ``torch.cuda.reset_peak_memory_stats`` does), and the
        timeline from here on."""
        self._pending = False
        self._moment_events, self._moment_phases, self._moment_marks, self._moment_ops = [], [], [], []
        for count in self.counts.values():
            count.peak = count.snapshot(self.phase)
            count.peak_event = self._event
            count.moments, count.moment_groups = [], []
        self._record()

    def timeline(self, world_size: int) -> Timeline:
        """Every moment of the window at ``world_size`` (see the module docstring)."""
        count = self.counts[world_size]
        return Timeline(
            self.blocks,
            list(self._moment_events),
            list(self._moment_phases),
            list(self._moment_marks),
            list(self._moment_ops),
            list(count.moments),
            list(count.moment_groups),
            list(count.regrads),
        )

    # -- which block computes ----------------------------------------------------------------------------------

    def mark_blocks(self, blocks: Sequence[Iterable[torch.Tensor]], outside: Iterable[torch.Tensor] = ()) -> None:
        """The parameters of each repeated block, in order, and those outside the blocks: an op reading them (or
        their gathered copies) marks the moments after it as that block's, or as no block's (module docstring)."""
        self.blocks = len(blocks)
        for p in outside:
            self._block_of[id(p.untyped_storage())] = None
        for index, params in enumerate(blocks):
            for p in params:
                self._block_of[id(p.untyped_storage())] = index

    def inherit_block(self, t: torch.Tensor, source: torch.Tensor) -> None:
        """``t`` holds what ``source`` held (an all_gather's result): the same block's."""
        key = id(source.untyped_storage())
        if key in self._block_of:
            self._set_block(t, self._block_of[key])

    def _set_block(self, t: Any, mark: int | None) -> None:
        key = id(t.untyped_storage()) if isinstance(t, torch.Tensor) else None
        if self.active and key in self._info:  # a storage counted is forgotten when it dies, and its mark with it
            self._block_of[key] = mark

    def _blocks_read(self, args: Any, kwargs: Any) -> set[int | None]:
        found: set[int | None] = set()
        for a in (*args, *kwargs.values()):
            for t in a if isinstance(a, (list, tuple)) else (a,):
                if isinstance(t, torch.Tensor):
                    key = id(t.untyped_storage())
                    if key in self._block_of:
                        found.add(self._block_of[key])
        return found

    def _note_block(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Move the mark to the block this op computes with; a pack or unpack of one block's parameters passes the
        block on to what it makes instead; a view computes nothing (packing a bucket flattens its shards)."""
        if func.is_view:
            return
        found = self._blocks_read(args, kwargs)
        if not found:
            return
        if func is torch.ops.aten.cat.default:
            if len(found) == 1:
                self._set_block(out, next(iter(found)))
            return
        if func is torch.ops.aten.split_with_sizes_copy.out:
            for t in kwargs.get("out", ()):
                self._set_block(t, next(iter(found)))
            return
        blocks = found - {None}
        self._mark = (next(iter(blocks)) if len(blocks) == 1 else MANY) if blocks else None

    # -- fusion regions ----------------------------------------------------------------------------------------

    def fused_region(self, fn: Any, args: Any) -> Any:
        """Run one fusion region's ops (see the module doc): pointwise intermediates stay virtual until a kernel
        boundary needs them in memory; what the region returns is in memory."""
        self._region_depth += 1
        try:
            out = fn(*args)
        finally:
            self._region_depth -= 1
        if not self._region_depth:
            self._materialize_live()
            self.resolve()
        return out

    def _materialize_live(self) -> None:
        """Every virtual storage still alive goes to memory: what a fused kernel writes before an extern kernel runs
        (or the region ends) because something after it reads it."""
        group = "optimizer" if self.phase == "optimizer step" else _OTHER
        for key, ref in list(self._virtual.items()):
            del self._virtual[key]
            st = ref()
            if st is not None:
                self._add(st, "temporaries", group, False)

    def _keep_virtual(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if t.device.type in self.count_devices and key not in self._info and key not in self._virtual:
            self._virtual[key] = weakref.ref(st, lambda ref, k=key: self._virtual.pop(k, None))

    # -- every op ----------------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.resolve()
        self._op = func._opname
        if self._region_depth and self.active:
            if _reads_buffers(func):
                self._materialize_live()
            elif _virtual_output(func):
                out = func(*args, **(kwargs or {}))
                tree_map_only(torch.Tensor, self._keep_virtual, out)
                if self._block_of:
                    self._note_block(func, args, kwargs or {}, out)
                return out
        out = func(*args, **(kwargs or {}))
        packed = (
            self.sharding
            and func is torch.ops.aten.cat.default
            and bool(args[0])
            and all(self._is_shard(t) for t in args[0])
        )
        tree_map_only(torch.Tensor, lambda t: self.label(t, "temporaries", sharded=packed or None), out)
        if func is torch.ops.aten.split_with_sizes_copy.out:
            # The communication pass's unpack of a gathered bucket: the pieces are the unsharded parameters, the
            # flat buffer they come from was only the collective's.
            self.label_all((kwargs or {}).get("out", ()), "gathered parameters")
            self.label(args[0], "communication buffers", force=True)
        if self._block_of and self.active:
            self._note_block(func, args, kwargs or {}, out)
        return out
