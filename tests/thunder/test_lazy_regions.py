"""Fusion regions built at their first call (thunderviz/thunder/jit/lazy_regions.py): the same plan as thunder's eager
builds, fewer builds, and a region never built where it would compile for real.

The plans are for CUDA ranks from this CPU machine, so their rehearsals use thunder's ``torchcompile`` executor (the
regions in question) with ``executors.uncompiled_fusions`` running each region's ops one by one. ZERO2 LAYER is
ZERO2 BLOCK's traces bucketed again (``memory.relayout``), whose re-fusion runs outside any compile.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import thunderviz
from thunderviz.demos.models import TinyGPT
from thunderviz.thunder.jit import lazy_regions

pytestmark = pytest.mark.skipif(os.environ.get(lazy_regions.ENV_VARIABLE) == "0", reason="THUNDERVIZ_LAZY_REGIONS=0")


def _plan() -> Any:
    model = TinyGPT(n_layer=2, d_model=32, n_head=2, block_size=16, vocab_size=64)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    return thunderviz.plan(
        model, idx, world_sizes=(2,), device="cuda", candidates=("fsdp-zero2-block", "fsdp-zero2-layer"), progress=False
    )


def _numbers(plan: Any) -> list[tuple]:
    return [(c.name, c.peak_bytes, dict(c.breakdown), c.comm_bytes, c.collectives) for c in plan.candidates]


def test_a_plan_is_the_same_with_regions_built_lazily_and_fewer_are_built() -> None:
    lazy_regions.install()
    before = lazy_regions.counts()
    lazy = _plan()
    after = lazy_regions.counts()
    with lazy_regions.suspended():
        eager = _plan()
    assert "torchcompile" in lazy.executors  # the rehearsals fused regions with torch.compile's executor
    assert _numbers(lazy) == _numbers(eager)
    made, built = after.made - before.made, after.built - before.built
    # thunder's fusion pass builds each region twice, our comm pass fuses again: most regions are never called
    assert made > 0 and built < made / 2, (made, built)
    assert lazy_regions.counts() == after  # suspended: thunder's own make_compiled made every region of `eager`


def test_a_region_made_in_a_rehearsal_is_not_built_outside_it() -> None:
    import thunder.executors.torch_compile as tc

    from thunderviz.thunder.jit.executors import uncompiled_fusions

    made: list = []

    def fake_make(*args, mode=None):
        made.append(args)
        return lambda *inputs: "built"

    with uncompiled_fusions():
        region = lazy_regions._LazyRegion(fake_make, [], [], [], None)
    assert tc.torch is torch  # the context is left: thunder's torchcompile executor compiles for real again
    with pytest.raises(RuntimeError, match="made during a memory rehearsal was first called outside it"):
        region()
    assert made == []
    with uncompiled_fusions():
        assert region() == "built" and len(made) == 1
