"""Structural diff on real traces: DDP vs FSDP, one rank vs another, one thunder stage vs the next."""

from __future__ import annotations

import pytest

from tests.helpers import trace_fixtures as tf
from tests.helpers.trace_scenarios import two_rank_run
from thunderviz.trace.diff import canonical_names, diff_traces


@pytest.fixture(scope="module")
def ranks():
    return two_rank_run()


def test_ddp_to_fsdp_adds_gathers_and_swaps_all_reduce_for_reduce_scatter(ranks):
    r0 = ranks[0]
    n = len(r0.param_names)
    fwd = diff_traces(r0.ddp.forward, r0.fsdp.forward)
    assert fwd.collective_delta() == {"all_gather": n, "wait": n}
    assert fwd.summary.startswith(f"+{n} all_gather, +{n} wait; other ops ")  # no "−0": empty terms left out
    bwd = diff_traces(r0.ddp.backward, r0.fsdp.backward)
    assert bwd.collective_delta() == {"reduce_scatter": n, "all_reduce": -n}
    assert bwd.summary.startswith(f"+{n} reduce_scatter, \u2212{n} all_reduce; other ops ~")
    assert bwd.summary_parts()[1] == f"other ops ~{len(bwd.changed)} changed"
    # Gradient waits stay at their place with a sharded shape: changes, not add + remove.
    changed_waits = [(a, b) for a, b in bwd.changed if a.is_wait]
    assert changed_waits and all(b.outputs[0].shape[0] * 2 == a.outputs[0].shape[0] for a, b in changed_waits)
    text = bwd.to_text()
    assert text.splitlines()[2] == bwd.summary
    assert any(line.startswith("+ ") and "reduce_scatter" in line for line in text.splitlines())
    assert any(line.startswith("- ") and "all_reduce" in line for line in text.splitlines())


def test_same_program_on_two_ranks_differs_in_nothing(ranks):
    a, b = ranks[0].fsdp.backward, ranks[1].fsdp.backward
    d = diff_traces(a, b)
    assert d.summary == "no differences" and d.summary_parts() == []
    assert d.unchanged == sum(1 for op in a.ops if not op.is_bookkeeping)
    assert not d.added and not d.removed and not d.changed


def test_stage_to_stage_shows_what_a_pass_did(ranks):
    stages = {s.label: s for s in ranks[0].fsdp.stages}
    n = len(ranks[0].param_names)
    sync = diff_traces(stages["Remove context manager prims"], stages["fsdp pass"])
    assert [op.op for op in sync.added] == ["synchronize"] * n and not sync.removed
    grad = diff_traces(stages["Dead Code Elimination"], stages["Grad transform pass"])
    assert grad.summary.startswith(f"+{n} all_gather, +{n} reduce_scatter, +{2 * n} wait")
    assert "\u22120" not in grad.summary and "+0" not in grad.summary


def test_canonical_names_ignore_proxy_numbering():
    fwd = tf.gpt().bundle.forward
    names = canonical_names(fwd)
    assert names["t_blocks_0_attn_qkv_weight"] == "blocks.0.attn_qkv.weight"
    first_new = next(t.name for op in fwd.ops for t in op.outputs if t.name not in fwd.param_names)
    assert names[first_new].startswith("v")


def test_bookkeeping_can_be_included_and_bad_input_is_refused(ranks):
    a = ranks[0].fsdp.forward
    assert diff_traces(a, a, include_bookkeeping=True).unchanged == len(a.ops)
    with pytest.raises(TypeError, match="two TraceSnapshot objects"):
        diff_traces(ranks[0].fsdp, ranks[0].ddp)
