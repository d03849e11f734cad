"""torch.compile fusion regions built when first called, not each time thunder's fusion pass makes one: for the
modules our strategies set up.

Why: thunder 0.2.6's ``torchcompile`` executor builds every region as it fuses it (``make_compiled``: the region's
trace transformed for execution by the torch executor, turned into Python, wrapped in ``torch.compile``), then its
fusion pass builds every region again after rematerialization (``update_fusion_call_ctx``), and our comm pass opens
the regions and fuses once more (``comm.fusion_regions``): of a region's four builds, one is ever called. Building
them took 25 of the 40 s of a 7B plan's rehearsals and most of ``transform_for_execution``'s share of a rank's
compile (profiled: ``bench/plan_frontier.py``'s models, the suite's rank processes). Here ``make_compiled`` returns a
region that builds itself, with thunder's own ``make_compiled``, on its first call; regions nobody calls are never
built. What each region computes, and where regions start and end, do not change.

Only where the compile is ours (its module carries our strategies' mark, as compile reuse reads it): anything else
thunder compiles in the process is built as thunder builds it, and so is a compile that sets thunder's
``torch_compile_fullgraph`` option (read while building, which a later call could not see). A region made during a
memory rehearsal (``executors.uncompiled_fusions``) builds inside it or not at all: outside, it would compile for
real on meta tensors, so it raises instead. ``THUNDERVIZ_LAZY_REGIONS=0`` builds every region eagerly, as thunder
does. A built region is called straight into inductor's compiled code where that is safe (``direct_regions``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from thunderviz.thunder.jit import direct_regions

__all__ = ["ENV_VARIABLE", "RegionCounts", "counts", "install", "installed", "ours", "suspended"]

ENV_VARIABLE = "THUNDERVIZ_LAZY_REGIONS"
_lock = threading.Lock()
_original: Callable[..., Any] | None = None


@dataclasses.dataclass
class RegionCounts:
    """This process's regions: made lazily by thunder's fusion passes, and built because something called them."""

    made: int = 0
    built: int = 0


_counts = RegionCounts()


def counts() -> RegionCounts:
    """A copy of this process's counts (what the laziness saved: ``made - built`` builds)."""
    return dataclasses.replace(_counts)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Thunder's own eager ``make_compiled`` while the block runs (in every thread): what a test compares with."""
    import thunder.executors.torch_compile as tc

    install()
    current = tc.make_compiled
    tc.make_compiled = getattr(current, "__thunderviz_original__", current)
    try:
        yield
    finally:
        tc.make_compiled = current


def installed() -> bool:
    """Whether thunder's ``make_compiled`` is ours in this process."""
    return _original is not None


def install() -> None:
    """Wrap thunder's ``make_compiled`` once per process (unless ``THUNDERVIZ_LAZY_REGIONS=0``)."""
    global _original
    if os.environ.get(ENV_VARIABLE, "1") == "0":
        return
    import thunder.executors.torch_compile as tc

    with _lock:
        if _original is not None:
            return
        original = tc.make_compiled

        def make_compiled(
            bsyms: list[Any], sorted_unique_inputs: list[Any], sorted_unique_outputs: list[Any], *, mode: Any = None
        ) -> Callable[..., Any]:
            if not _ours():
                return original(bsyms, sorted_unique_inputs, sorted_unique_outputs, mode=mode)
            return _LazyRegion(original, bsyms, sorted_unique_inputs, sorted_unique_outputs, mode)

        make_compiled.__thunderviz_original__ = original  # type: ignore[attr-defined]
        tc.make_compiled = make_compiled
        _original = original


_fusing = threading.local()


@contextlib.contextmanager
def ours() -> Iterator[None]:
    """Regions made in this block (this thread) are ours to build lazily, compile or not: our comm pass's re-fusion,
    which a memory rehearsal also runs outside any compile when it tries another bucketing (``memory.relayout``)."""
    _fusing.depth = getattr(_fusing, "depth", 0) + 1
    try:
        yield
    finally:
        _fusing.depth -= 1


def _ours() -> bool:
    from thunder.core.compile_data import get_compile_data

    from thunderviz.thunder.reuse.key import MARK

    data = get_compile_data()
    if data is not None and data.compile_options.get("torch_compile_fullgraph") is not None:
        return False  # read while building: a later call could not see it
    if getattr(_fusing, "depth", 0):
        return True
    return data is not None and getattr(data.fn, MARK, None) is not None


def _rehearsing() -> bool:
    import thunder.executors.torch_compile as tc

    from thunderviz.thunder.jit.executors import rehearsing_fusions

    return rehearsing_fusions(tc)


class _LazyRegion:
    """A fusion region's callable that is thunder's ``make_compiled(...)`` from its first call on."""

    __slots__ = ("_args", "_built", "_lock", "_make", "_mode", "_rehearsing")

    def __init__(self, make: Callable[..., Any], bsyms: list[Any], inputs: list[Any], outputs: list[Any], mode: Any):
        self._make = make
        self._args: tuple[list[Any], list[Any], list[Any]] | None = (list(bsyms), list(inputs), list(outputs))
        self._mode = mode
        self._rehearsing = _rehearsing()
        self._built: Callable[..., Any] | None = None
        self._lock = threading.Lock()
        _counts.made += 1

    def __call__(self, *args: Any) -> Any:
        built = self._built
        if built is None:
            with self._lock:  # forward and autograd's backward thread never share a region, but be sure
                if self._built is None:
                    if _rehearsing() != self._rehearsing:
                        raise RuntimeError(
                            "a fusion region made during a memory rehearsal was first called outside it (or the other"
                            " way round); set THUNDERVIZ_LAZY_REGIONS=0 and report this"
                        )
                    assert self._args is not None
                    self._built = direct_regions.direct(self._make(*self._args, mode=self._mode), self._mode)
                    _counts.built += 1
                    self._args = None  # the region's ops are the built callable's now
                built = self._built
        return built(*args)
