"""Reading the decision table's facts from live objects: a module, a ThunderModule before and after it ran, a jitted
function."""

from __future__ import annotations

import thunder
import torch
from torch import nn

from thunderviz.parallel.decisions import ObjectFacts, ObjectKind
from thunderviz.thunder.jit.facts import inspect_object


def test_inspect_object_reads_live_thunder_state():
    model = nn.Linear(3, 2)
    assert inspect_object(model) == ObjectFacts(kind=ObjectKind.MODULE, type_name="Linear")
    jitted = thunder.jit(nn.Linear(3, 2))
    facts = inspect_object(jitted)
    assert (facts.kind, facts.type_name, facts.has_run, facts.cached_traces) == (
        ObjectKind.THUNDER_MODULE,
        "Linear",
        False,
        0,
    )
    jitted(torch.randn(1, 3))
    facts = inspect_object(jitted)
    assert (facts.has_run, facts.cached_traces) == (True, 1)

    def step(x):
        return x * 2

    assert inspect_object(thunder.jit(step)) == ObjectFacts(kind=ObjectKind.JITTED_FUNCTION, type_name="step")
    assert inspect_object({"a": 1}).kind is ObjectKind.OTHER
