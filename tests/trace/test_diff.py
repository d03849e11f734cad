"""Structural diff on real traces: DDP vs FSDP, one rank vs another, one thunder stage vs the next, and ZERO2 vs
ZERO3 of the tutorial's model group by group (what a comparison's outlines and verdict say)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import trace_fixtures as tf
from tests.helpers.bucketed_traces import bucketed_trace_files
from tests.helpers.trace_scenarios import two_rank_run
from thunderviz.trace.attribution import top_group
from thunderviz.trace.diff import bytes_per_step, canonical_names, diff_traces, group_changes, verdict
from thunderviz.trace.file import load
from thunderviz.trace.ledger import ledger_from_bundle
from thunderviz.trace.units import format_bytes


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


# ---------------------------------------------------------------------------------------------- group by group


@pytest.fixture(scope="module")
def runs():
    """Rank 0's bundle of the tutorial's model under ZERO2, ZERO3 and DDP (default buckets: one per block)."""
    files = bucketed_trace_files()
    return {run: load(files[run][0])[0] for run in ("zero2", "zero3", "ddp")}


def test_a_block_both_runs_have_is_changed_not_added(runs):
    """ZERO3's backward puts unsqueeze/expand ops into every block and ln_f that ZERO2's backward has too.
    Op by op those are all '+' rows, which outlined the blocks as "only in the right run"; group by group they are
    changed, and only the re-gathering buckets are new."""
    a, b = runs["zero2"].backward, runs["zero3"].backward
    d = diff_traces(a, b)
    tags = {r.tag for r in d.rows if r.tag != "=" and r.b is not None and top_group(r.b.module) == "blocks.0"}
    assert tags == {"+"}  # what misled the old outline
    ch = group_changes(a, b, d)
    blocks = sorted(n for n in ch if n.startswith("blocks."))
    assert blocks == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    for name in [*blocks, "ln_f"]:
        c = ch[name]
        assert (c.status, c.compute, c.communication) == ("changed", "changed", ""), c
        assert set(c.ops_added) == {"unsqueeze", "expand"} and not c.ops_removed and not c.ops_changed, c
    n = ch["blocks.0"].ops_added
    assert ch["blocks.0"].describe("zero2", "zero3") == (
        f"blocks.0 changed: ops +{n['unsqueeze']} unsqueeze, +{n['expand']} expand"
    )
    added = {k for k, c in ch.items() if c.status == "added"}
    assert added == {"all_gather root", *(f"all_gather {x}" for x in blocks)}
    for k in added:
        c = ch[k]
        assert c.communication == "added" and c.collectives_a == {} and c.collectives_b == {"all_gather": 1, "wait": 1}
        assert c.bytes_a == 0 < c.bytes_b
        assert c.describe("zero2", "zero3") == f"{k}: only in zero3"
    assert not any(c.status == "removed" for c in ch.values())
    same = {k for k, c in ch.items() if c.status == "same"}
    assert {f"reduce_scatter {x}" for x in blocks} <= same
    assert all(ch[k].communication == "same" and ch[k].bytes_a == ch[k].bytes_b > 0 for k in same if "scatter" in k)
    # the other way round, what ZERO3 has alone is removed, and forward, which ZERO3 does not change, is the same
    back = group_changes(b, a)
    assert {k for k, c in back.items() if c.status == "removed"} == added
    assert back["blocks.0"].ops_removed == n
    assert {c.status for c in group_changes(runs["zero2"].forward, runs["zero3"].forward).values()} == {"same"}


def test_verdict_says_bytes_per_step_why_and_memory(runs):
    z2, z3, ddp = runs["zero2"], runs["zero3"], runs["ddp"]
    for x in (z2, z3, ddp):
        assert bytes_per_step(x) == ledger_from_bundle(x).sent_bytes() > 0  # the ledger's bytes, per step
    # one accounting, the ring algorithm's (trace.wire): on 2 ranks ZERO2 moves DDP's bytes (a shard gathered, half
    # the gradients reduce-scattered, where DDP all-reduces them all), not 1.5x (each collective's input summed)
    assert bytes_per_step(z2) == bytes_per_step(ddp) == ledger_from_bundle(ddp).entries[0].bytes
    assert verdict(ddp, z2, "ddp", "zero2").startswith("zero2 sends the same bytes per step as ddp (")
    v = verdict(z2, z3, "zero2", "zero3")
    m = re.fullmatch(
        r"zero3 sends ([0-9.]+)x zero2's bytes per step \((.+) -> (.+)\): (.*); saved tensors \(trace\) (.*)", v
    )
    assert m, v
    assert float(m[1]) == pytest.approx(bytes_per_step(z3) / bytes_per_step(z2), abs=0.006) and float(m[1]) > 1
    assert (m[2], m[3]) == (format_bytes(bytes_per_step(z2)), format_bytes(bytes_per_step(z3)))
    assert m[4] == "it gathers every block and root again in backward"
    saved = z3.saved_for_backward["bytes"] - z2.saved_for_backward["bytes"]
    assert saved < 0 and m[5] == f"\u2212{format_bytes(-saved)}"
    assert verdict(z2, z3, "zero2", "zero3", ("step peak (measured)", 2048, 1024)).endswith(
        "; step peak (measured) \u22121.0 KiB"
    )
    why = verdict(ddp, z2, "ddp", "zero2").split(": ", 1)[1]
    assert why.startswith(
        "it gathers every block and root in forward and reduce-scatters every block and root in backward "
        "instead of all-reducing; "
    )
    assert "it no longer gathers every block and root in backward" in verdict(z3, z2, "zero3", "zero2")
    same = verdict(z2, z2, "left", "right")
    assert same.startswith("right sends the same bytes per step as left (") and ": the same collectives;" in same
    with pytest.raises(TypeError, match="two TraceBundle objects"):
        verdict(z2.forward, z3.forward, "a", "b")


def test_the_demo_page_compares_consecutive_runs_in_words(runs):
    """The offline page's "Runs compared": the compare view's verdict and the groups that differ, names escaped."""
    from types import SimpleNamespace

    from thunderviz.render.runs_compared import runs_compared_html
    from thunderviz.trace.workload import Workload

    same = Workload("TinyGPT", 1000, ("int64[2, 16]",), "AdamW", 2)

    def report(bundles, strategy, workload=same):
        return SimpleNamespace(
            bundles=bundles,
            workload=workload,
            strategy=SimpleNamespace(describe=lambda: strategy),
            step_peak=lambda: None,
        )

    reports = {
        "zero2": report({"TinyGPT": runs["zero2"]}, "ZERO2"),
        "<b>z3</b>": report({"TinyGPT": runs["zero3"]}, "ZERO3"),
        "zero3 again": report({"TinyGPT": runs["zero3"]}, "ZERO3"),  # a strategy's first run stands for it
        "sgd": report({"TinyGPT": runs["zero3"]}, "DDP", Workload("TinyGPT", 1000, ("int64[2, 16]",), "SGD", 2)),
        "untraced": report({}, "DDP"),
    }
    html = runs_compared_html(reports)
    assert html.count("<section class='compare'>") == 1
    assert "<h3>zero2 against &lt;b&gt;z3&lt;/b&gt; (TinyGPT)</h3>" in html and "<b>z3</b>" not in html
    assert "&lt;b&gt;z3&lt;/b&gt; sends " in html and "x zero2&#x27;s bytes per step" in html
    assert "<td>backward</td><td>blocks.0 changed: ops +" in html
    assert "all_gather root: only in &lt;b&gt;z3&lt;/b&gt;" in html
    assert runs_compared_html({"a": reports["zero2"]}) == ""
