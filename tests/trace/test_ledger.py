"""The collectives ledger on real 2-rank FSDP and DDP traces, and mismatches created on purpose."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.helpers.trace_scenarios import two_rank_run
from thunderviz.trace.ledger import Ledger, find_mismatches, ledger_from_bundle


@pytest.fixture(scope="module")
def ranks():
    return two_rank_run()


def test_fsdp_ledger_lists_every_gather_scatter_and_wait(ranks):
    r0 = ranks[0]
    n = len(r0.param_names)
    ledger = ledger_from_bundle(r0.fsdp)
    assert ledger.rank == 0 and ledger.counts() == {"all_gather": n, "reduce_scatter": n, "wait": 2 * n}
    gathers = [e for e in ledger if e.kind == "all_gather"]
    assert sorted(e.tensor for e in gathers) == sorted(r0.param_names)
    for e in gathers:
        full = r0.param_shapes[e.tensor]
        assert e.trace == "forward" and e.group_size == 2 and e.dtype == "float32"
        assert e.out_shape == full and e.shape == (full[0] // 2, *full[1:])
        assert e.bytes == 4 * _numel(full) // 2
        assert e.distance is not None and e.distance > 0
    scatters = [e for e in ledger if e.kind == "reduce_scatter"]
    assert sorted(e.tensor for e in scatters) == sorted(f"grad of {p}" for p in r0.param_names)
    assert all(e.trace == "backward" and e.shape == r0.param_shapes[e.tensor[8:]] for e in scatters)
    # Each wait points back at its collective, which comes earlier.
    for e in ledger:
        if e.kind == "wait":
            assert e.waits_for is not None and ledger.entries[e.waits_for].kind in ("all_gather", "reduce_scatter")
            assert e.waits_for < e.position
    # what the rank puts on the wire (trace.wire): a ring all_gather sends its shard once to the other rank, a ring
    # reduce_scatter half of its input: on 2 ranks each entry's bytes, halved for the reduce_scatters
    assert all(e.sent_bytes() == e.bytes for e in gathers) and all(2 * e.sent_bytes() == e.bytes for e in scatters)
    assert ledger.sent_bytes() == sum(e.bytes for e in gathers) + sum(e.bytes // 2 for e in scatters)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_ddp_ledger_is_all_reduce_of_every_gradient(ranks):
    ledger = ledger_from_bundle(ranks[1].ddp)
    n = len(ranks[1].param_names)
    assert ledger.rank == 1 and ledger.counts() == {"all_reduce": n, "wait": n}
    assert all(e.shape == e.out_shape for e in ledger if e.kind == "all_reduce")


def test_ranks_that_agree_have_no_mismatch(ranks):
    for kind in ("fsdp", "ddp"):
        ledgers = {r.rank: ledger_from_bundle(getattr(r, kind)) for r in ranks}
        assert find_mismatches(ledgers) == []


def test_a_rank_on_another_code_path_is_named_with_the_first_differing_collective(ranks):
    # Rank 1 took the DDP path while rank 0 took FSDP: the first rendezvous already differs.
    (m,) = find_mismatches({0: ledger_from_bundle(ranks[0].fsdp), 1: ledger_from_bundle(ranks[1].ddp)})
    assert (m.rank_a, m.rank_b, m.position, m.field) == (0, 1, 0, "kind")
    assert "Ranks 0 and 1" in m.message and "rank 0 issues all_gather" in m.message
    assert "rank 1 issues all_reduce" in m.message


def test_shape_dtype_and_count_mismatches_created_on_purpose(ranks):
    l0 = ledger_from_bundle(ranks[0].fsdp)
    l1 = ledger_from_bundle(ranks[1].fsdp)
    colls = [i for i, e in enumerate(l1.entries) if e.kind != "wait"]

    shape = Ledger(1, list(l1.entries))
    i = colls[3]
    shape.entries[i] = replace(l1.entries[i], shape=(7,))
    (m,) = find_mismatches({0: l0, 1: shape})
    assert m.field == "shape" and m.position == 3 and "collective 4" in m.message
    assert l1.entries[i].tensor in m.message and "[7]" in m.message

    dtype = Ledger(1, list(l1.entries))
    dtype.entries[colls[5]] = replace(l1.entries[colls[5]], dtype="bfloat16")
    (m,) = find_mismatches({0: l0, 1: dtype})
    assert m.field == "dtype" and "bfloat16" in m.message

    short = Ledger(1, [e for j, e in enumerate(l1.entries) if j != colls[-1]])
    (m,) = find_mismatches({1: short, 0: l0})
    assert m.field == "count" and m.rank_a == 0 and m.rank_b == 1
    assert f"rank 0 has {len(colls)}, rank 1 has {len(colls) - 1}" in m.message
    assert l0.entries[colls[-1]].tensor in m.message and "rank 0 would wait forever" in m.message

    # Three ranks: only the one that differs is reported, against the lowest rank.
    assert [x.rank_b for x in find_mismatches({0: l0, 1: l1, 2: shape})] == [2]


def test_ledger_from_a_single_snapshot_and_round_trip(ranks):
    fwd_only = ledger_from_bundle(ranks[0].fsdp.forward, rank=0)
    assert set(fwd_only.counts()) == {"all_gather", "wait"}
    ledger = ledger_from_bundle(ranks[0].fsdp)
    assert Ledger.from_dict(ledger.to_dict()) == ledger
    with pytest.raises(TypeError, match="TraceBundle or TraceSnapshot"):
        ledger_from_bundle([object()])
