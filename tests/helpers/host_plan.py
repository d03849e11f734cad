"""One plan across hosts, made once per test run: a residual MLP for 2 and 4 ranks on hosts of 2 ranks each.

Two files need the same plan: the plan's own test of its hybrid candidates (``tests/thunder/test_rehearsal.py``) and
the 4-rank hybrid scenarios, whose auto strategy chooses from it (``tests/strategies/test_hybrid_4rank.py``). A plan
traces each candidate through thunder, so it is made once (``once_per_run``) and shared.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.helpers.run_once import once_per_run

__all__ = ["BATCH_SHAPE", "plan_across_hosts"]

#: One rank's batch: (rows, features) of ``ResidualMLP(n_layer=2)``'s input.
BATCH_SHAPE = (64, 16)


@once_per_run
def plan_across_hosts() -> Any:
    """``thunderviz.plan`` of ``ResidualMLP(n_layer=2)`` at world sizes 2 and 4, ``ranks_per_host=2``, on CPU, every
    candidate (checkpointed ones too); its traces are dropped (nothing here draws them, and the plan travels to
    rank processes and between workers)."""
    import torch

    import thunderviz
    from thunderviz.demos.models import ResidualMLP

    made = thunderviz.plan(
        ResidualMLP(n_layer=2),
        torch.empty(BATCH_SHAPE),
        world_sizes=(2, 4),
        ranks_per_host=2,
        device="cpu",
        progress=False,
    )
    return dataclasses.replace(made, candidates=[dataclasses.replace(c, bundle=None) for c in made.candidates])
