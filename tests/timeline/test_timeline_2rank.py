"""The timeline of a real 2-rank gloo FSDP run (rank 1 sleeps before every backward): recorded, aligned, analysed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest

from tests.helpers.timeline_runs import QUIET_REPEATS, QUIET_STEPS, SLEEP_S, STEPS, recorded
from thunderviz.timeline import load

pytestmark = pytest.mark.timeout(600)
SCHEMA = json.loads((Path(__file__).parent / "trace_event_schema.json").read_text())


@pytest.fixture(scope="module")
def runs():
    return recorded("fsdp")


@pytest.fixture(scope="module")
def timeline(runs):
    return load(*[r.path for r in runs])


def test_the_recorder_cleans_up_and_stops_by_itself(runs):
    for r in runs:
        assert r.restored, f"rank {r.rank}: torch.distributed or fabric.backward still wrapped after the block"
        assert r.recording_after is False  # stopped after STEPS + 1 steps, before the loop ended
        assert r.boundaries == STEPS + 1


def test_the_steps_after_the_recording_are_timed_unprofiled_and_give_the_step_time(timeline, runs):
    """The run's step time is read from steps the profiler did not record (its per-op cost is in the drawn ones): one
    settling step after the recording, then UNPROFILED_STEPS timed by the recorder's clock, kept in the files."""
    from thunderviz.timeline.record import UNPROFILED_STEPS

    timed = list(range(STEPS + 3, STEPS + 3 + UNPROFILED_STEPS))
    for t in timeline.ranks.values():
        assert sorted(t.unprofiled_steps) == timed, t.unprofiled_steps
    analysis = timeline.analysis()
    assert analysis.timed_steps() == (tuple(timed), True)
    slowest = [max(t.unprofiled_steps[n] for t in timeline.ranks.values()) for n in timed]
    assert analysis.step_time() == pytest.approx(sum(slowest) / len(slowest))
    assert min(slowest) >= SLEEP_S * 1e6  # rank 1 sleeps in every step: the slowest rank's step holds the sleep


def test_every_rank_has_the_recorded_steps_with_their_regions(timeline):
    assert timeline.rank_ids == [0, 1]
    assert timeline.steps == list(range(2, 2 + STEPS))  # step 1 compiled: recorded, then dropped
    for t in timeline.ranks.values():
        assert not t.warmup_included and t.notes == []
        for step in timeline.steps:
            kinds = [r.kind for r in t.regions if r.step == step]
            assert kinds == ["forward", "backward", "optimizer"], (t.rank, step, kinds)
            assert {r.name for r in t.regions if r.step == step and r.kind != "optimizer"} == {"TinyGPT"}


def test_collectives_carry_ledger_names_times_and_module_groups(timeline, runs):
    from thunderviz.trace.file import load as load_traces

    (bundle,) = load_traces(runs[0].traces)
    (fwd_bucket,) = bundle.forward.buckets
    (bwd_bucket,) = bundle.backward.buckets
    for t in timeline.ranks.values():
        per_step = {s: [c for c in t.collectives if c.step == s] for s in timeline.steps}
        counts = {s: len(cs) for s, cs in per_step.items()}
        assert len(set(counts.values())) == 1, counts  # the same collectives every step
        for cs in per_step.values():
            assert [c.index for c in cs] == list(range(1, len(cs) + 1))
            fwd = [c for c in cs if c.region == "forward"]
            bwd = [c for c in cs if c.region == "backward"]
            assert (
                fwd and bwd and {c.kind for c in fwd} == {"all_gather"} and {c.kind for c in bwd} == {"reduce_scatter"}
            )
            # BLOCK buckets (the default) on a one-block model: one root bucket of all 17 parameters, named briefly
            assert {c.tensor for c in fwd} == {fwd_bucket.summary}
            assert {c.tensor for c in bwd} == {bwd_bucket.summary}
            assert fwd_bucket.summary.startswith("root (17 params, ")
            assert bwd_bucket.summary.startswith("root (17 grads, ")
            for c in cs:
                assert c.trace == c.region and c.group is not None and c.ledger_position is not None
                assert c.issue_start <= c.issue_end and c.start is not None and c.start <= c.end
                assert not c.sync and c.wait_start is not None and c.wait_start <= c.wait_end
        # compute by graph node: the block, and the root bucket's packing and unpacking (its own node)
        assert {s.group for s in t.segments} >= {"blocks.0", fwd_bucket.group}, {s.group for s in t.segments}
        assert {s.trace for s in t.segments} == {"forward", "backward"}


def test_clocks_are_aligned_with_a_bound_that_holds_on_one_host(timeline):
    ref, other = timeline.ranks[0].clock, timeline.ranks[1].clock
    assert ref.offset == 0 and ref.method == "reference"
    assert other.rounds > 0 and math.isfinite(other.uncertainty)
    # Both ranks read the same CLOCK_MONOTONIC here, so the true offset is 0 and must lie inside the bound.
    assert abs(other.offset) <= other.uncertainty


def test_the_sleeping_rank_is_named_at_the_first_backward_collective(timeline):
    a = timeline.analysis()
    top = a.stragglers()[0]
    assert top.rank == 1 and a.straggler() == top
    assert top.caused_wait >= 0.5 * SLEEP_S * 1e6 * STEPS  # most of each sleep was waited for by rank 0
    worst = a.collectives()[0]
    assert worst.last_rank == 1 and worst.kind == "reduce_scatter" and worst.waited[0] > 0.5 * SLEEP_S * 1e6
    assert worst.message.startswith(f"{worst.kind} #{worst.index} {worst.tensor} (step {worst.step}): rank 1 arrived ")
    assert "after rank 0" in worst.message
    assert a.summary()[0].startswith("Straggler: rank 1 arrived last")


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_unslowed_repeats_name_no_straggler(runs, kind):
    """With nobody sleeping, two ranks sharing the CPUs take turns arriving last by milliseconds (tens on
    a busy machine); STRAGGLER_RULE names no one, and the summary says which rank came closest. Unless another
    process took the CPUs: two ranks left one core between them arrive in the order the kernel runs them, and the
    one run second is late in every step. Then the rank named must have waited for a CPU (its run-queue delay) at
    least half as long as it made the others wait: late by the machine, not by itself."""
    assert [r.rank for r in runs] == list(range(len(runs)))
    picked = [[(p, w) for (k, p), w in zip(r.quiet, r.cpu_waits, strict=True) if k == kind] for r in runs]
    assert all(len(p) == QUIET_REPEATS for p in picked)
    for recordings in zip(*picked, strict=True):
        tl = load(*(p for p, _ in recordings))
        assert len(tl.steps) == QUIET_STEPS
        a = tl.analysis()
        named = a.straggler()
        if named is not None:
            waited_for_cpu = recordings[named.rank][1]
            assert waited_for_cpu >= 0.5 * named.caused_wait / 1e6, (a.summary()[0], [w for _, w in recordings])
            continue
        assert a.summary()[0].startswith("No straggler: no rank"), a.summary()[0]
        # DDP's forward has no collective and its backward one at the end; compute still goes to the
        # module that ran (it was one block's for the whole forward / backward)
        for t in tl.ranks.values():
            for step in tl.steps:
                for trace in ("forward", "backward"):
                    groups = {s.group for s in t.segments if s.step == step and s.trace == trace}
                    assert {"blocks.0", "lm_head", "wte"} <= groups, (kind, t.rank, step, trace, groups)


def test_breakdown_adds_up_per_rank(timeline):
    for b in timeline.analysis().breakdown():
        assert b.steps == STEPS
        assert b.compute + b.exposed + b.idle == pytest.approx(b.step_time, rel=1e-6)
        assert b.communication == pytest.approx(b.exposed + b.overlapped, rel=1e-6)
    idle = {b.rank: b.idle for b in timeline.analysis().breakdown()}
    assert idle[1] >= SLEEP_S * 1e6 * 0.9  # the sleep is idle time on rank 1


def test_chrome_trace_is_valid_trace_event_format_one_process_per_rank(timeline, tmp_path):
    path = timeline.save_chrome_trace(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, SCHEMA)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert sorted(names) == [0, 1] and names[1].startswith("rank 1")
    _assert_nested_per_thread(doc["traceEvents"])
    colls = [e for e in doc["traceEvents"] if e.get("cat") == "collective" and e["pid"] == 1]
    assert len(colls) == len(timeline.ranks[1].collectives)


def _assert_nested_per_thread(events):
    """Complete events on one thread must nest (Perfetto and chrome://tracing draw them as a stack)."""
    by_thread = {}
    for e in events:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    slack = 1.5e-3  # the files' 1 ns resolution, plus float error in ts + dur (1e-3 alone failed at 139511.941)
    for key, spans in by_thread.items():
        stack = []
        for a, b in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= a + slack:
                stack.pop()
            assert not stack or b <= stack[-1] + slack, (
                f"thread {key}: [{a}, {b}] overlaps its parent ending {stack[-1]}"
            )
            stack.append(b)


def test_one_rank_file_alone_says_which_rank_is_missing(runs):
    tl = load(runs[0].path)
    assert tl.rank_ids == [0]
    assert any("no timeline from rank(s) [1]" in p for p in tl.problems)


def test_an_aligned_timeline_round_trips_through_one_file(timeline, tmp_path):
    p = timeline.save(tmp_path / "timeline.json")
    again = load(p)
    assert again.to_dict() == timeline.to_dict()
