"""Capture on two real gloo ranks: whatever ``fabric.setup`` returned in each case, and one file per rank."""

from __future__ import annotations

import pytest

from tests.helpers.trace_scenarios import setup_captures, two_rank_run
from thunderviz.trace.file import load

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ranks():
    return two_rank_run()


def test_each_rank_saved_its_own_file_and_it_loads_back_equal(ranks):
    for r in ranks:
        fsdp, ddp = load(r.path)
        assert (fsdp.rank, fsdp.world_size, fsdp.name, ddp.name) == (r.rank, 2, "gpt-fsdp", "gpt-ddp")
        assert fsdp == r.fsdp and ddp == r.ddp  # the file and the pickle from the rank agree
        assert fsdp.memory["forward"] > 0 and fsdp.memory["backward"] > 0


@pytest.mark.parametrize(
    ("kind", "forward_kinds", "backward_kinds"),
    [
        pytest.param("fsdp", {"all_gather", "wait"}, {"reduce_scatter", "wait"}, id="fsdp"),
        pytest.param("ddp", set(), {"all_reduce", "wait"}, id="ddp"),
    ],
)
def test_capture_takes_what_fabric_setup_returned_in_every_case(kind, forward_kinds, backward_kinds):
    per_rank = [r[kind] for r in setup_captures()]
    params = ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    for rank, out in enumerate(per_rank):
        for case in ("1", "2", "3"):
            got, direct = out[case]["setup"], out[case]["direct"]
            # The same traces as capturing the jitted object itself (the ThunderModule, or case 2's function).
            assert (got["fwd"], got["bwd"]) == (direct["fwd"], direct["bwd"]), (kind, case, rank)
            assert got["name"] == "_Net" and (got["rank"], got["world"]) == (rank, 2)
            assert got["params"] == params, (kind, case)  # Fabric's `_forward_module.` prefix is not a module
            assert set(got["collectives"]) == forward_kinds | backward_kinds, (kind, case)
        # Case 2 also from the plain module under Fabric's wrapper.
        assert out["2"]["inner"]["fwd"] == out["2"]["direct"]["fwd"]
        # Two jitted functions used the same model: no guess, the message names both and what to pass.
        msg = out["ambiguous"]
        assert msg is not None and "2 jitted functions traced this _Net" in msg, msg
        assert msg.count("<lambda>") >= 2 and "pass the one you mean, e.g. capture(" in msg
