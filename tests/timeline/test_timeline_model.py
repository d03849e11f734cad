"""The timeline model without ranks: clock bounds, interval arithmetic, the interpretation rules on hand-made
events, hardened loading, and the recorder's handling of bad input in this process."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thunderviz.errors import TraceFormatError
from thunderviz.timeline.analysis import (
    STRAGGLER_RULE,
    TimelineAnalysis,
    close_gaps,
    intersect,
    subtract,
    total,
    union,
)
from thunderviz.timeline.build import build_rank_timeline
from thunderviz.timeline.clock import align_clocks
from thunderviz.timeline.file import load
from thunderviz.timeline.model import CollectiveEvent, RankTimeline, Region, Timeline, save
from thunderviz.timeline.raw_events import CollectiveMeta, ModuleInfo, RawEvent
from thunderviz.timeline.record import record_timeline

# ---------------------------------------------------------------------------------------------- clocks


def test_clock_bound_contains_the_true_offset_and_tightens_with_rounds():
    true = 1234.0  # rank 1's clock reads 1234 us more than rank 0's
    instants = [100.0, 400.0, 900.0]
    r0 = [(m - 5, m + 30) for m in instants]  # rank 0 waited longer in some rounds
    r1 = [(m + true - 20, m + true + 2) for m in instants]
    clocks, notes = align_clocks({0: r0, 1: r1})
    assert notes == []
    c = clocks[1]
    assert c.offset - c.uncertainty <= true <= c.offset + c.uncertainty
    one, _ = align_clocks({0: r0[:1], 1: r1[:1]})
    assert c.uncertainty <= one[1].uncertainty


def test_disagreeing_rounds_fall_back_to_the_narrowest_and_say_so():
    clocks, notes = align_clocks({0: [(0, 10), (100, 101)], 1: [(500, 510), (100, 101)]})
    assert clocks[1].method.startswith("narrowest") and "do not intersect" in notes[0]


def test_a_rank_without_samples_is_flagged():
    clocks, notes = align_clocks({0: [(0, 1)], 1: []})
    assert math.isinf(clocks[1].uncertainty) and "no clock samples" in notes[0]


# ---------------------------------------------------------------------------------------------- intervals

ivs = st.lists(
    st.tuples(st.integers(0, 200), st.integers(0, 50)).map(lambda p: (float(p[0]), float(p[0] + p[1]))), max_size=12
)


def _points(xs):
    return {t for a, b in xs for t in range(int(a), int(b))}


@settings(max_examples=200, deadline=None)
@given(ivs, ivs)
def test_interval_arithmetic_matches_sets_of_points(a, b):
    ua, ub = union(a), union(b)
    assert _points(ua) == _points(a) and total(ua) == len(_points(a))
    assert _points(intersect(ua, ub)) == _points(a) & _points(b)
    assert _points(subtract(ua, ub)) == _points(a) - _points(b)
    closed = close_gaps(ua, 2.0)
    assert _points(closed) >= _points(ua) and len(closed) <= len(ua)
    assert all(b2 - a2 > 2.0 for (_, a2), (b2, _) in itertools.pairwise(closed))  # every gap left is wider than 2


# ---------------------------------------------------------------------------------------------- build rules


def _ev(name, start, end, tid=1, device="cpu"):
    return RawEvent(name, tid, float(start), float(end), device)


def _two_collective_step(t0, *, wait=(60, 80)):
    """A step with a forward issuing one async all_gather (its work on gloo's thread) and waiting for it."""
    return [
        _ev("thunderviz.forward#0", t0 + 10, t0 + 100),
        _ev("thunderviz.collective#{n}", t0 + 20, t0 + 25),
        _ev("gloo:all_gather", t0 + 30, t0 + 75, tid=2),
        _ev("aten::mm", t0 + 30, t0 + 55),
        _ev("thunderviz.wait#{n}", t0 + wait[0], t0 + wait[1]),
        _ev("aten::add", t0 + 82, t0 + 95),
        _ev("thunderviz.optimizer", t0 + 110, t0 + 120),
    ]


def _steps(n, *, period=200, marks=True):
    events, metas = [], {}
    for i in range(n):
        t0 = i * period
        if marks:
            events.append(_ev(f"thunderviz.step#{i}", t0, t0 + period))
        for e in _two_collective_step(t0):
            events.append(RawEvent(e.name.replace("{n}", str(i + 1)), e.tid, e.start, e.end, e.device))
        metas[i + 1] = CollectiveMeta("all_gather", sync=False, shape=(4,), dtype="float32", bytes=16, group_size=2)
    return events, metas


_MODULE = ModuleInfo(
    "Net",
    ledger=[
        {"position": 0, "trace": "forward", "op_index": 1, "kind": "all_gather", "tensor": "fc.weight"},
        {"position": 1, "trace": "forward", "op_index": 3, "kind": "wait", "tensor": "fc.weight", "waits_for": 0},
    ],
    op_groups={"forward": [None, "fc", "fc", "fc", "head", "head"]},
)


def _build(events, metas, *, closed, steps=5, modules=None):
    return build_rank_timeline(
        events,
        rank=0,
        world_size=1,
        steps=steps,
        collectives=metas,
        modules={0: _MODULE} if modules is None else modules,
        closed_steps=closed,
        end=max(e.end for e in events),
    )


def test_the_first_step_is_dropped_and_the_rest_numbered_as_the_cell_ran_them():
    events, metas = _steps(4)
    t = _build(events, metas, closed=[0, 1, 2, 3], steps=2)
    assert [s.step for s in t.steps] == [2, 3] and not t.warmup_included
    c = t.collectives[0]
    assert (c.step, c.index, c.kind, c.tensor, c.group, c.region) == (2, 1, "all_gather", "fc.weight", "fc", "forward")
    assert (c.issue_start, c.start, c.end, c.wait_start, c.wait_end) == (220, 230, 275, 260, 280)
    assert c.blocked == 5 + 20 and not c.sync
    # compute between the issue (op 1) and the wait (op 3) ran op 2 (fc); after the wait, ops 4-5 (head)
    groups = [(s.group, s.start, s.end) for s in t.segments if s.step == 2]
    assert ("fc", 225, 260) in groups and ("head", 280, 300) in groups


def _blocks() -> ModuleInfo:
    """Two blocks and a head; DDP's gradient bucket all-reduced at the end of backward."""
    return ModuleInfo(
        "Net",
        ledger=[
            {"position": 0, "trace": "backward", "op_index": 5, "kind": "all_reduce", "tensor": "bucket #0"},
            {"position": 1, "trace": "backward", "op_index": 6, "kind": "wait", "tensor": "bucket #0", "waits_for": 0},
        ],
        op_groups={
            "forward": [None, "blocks.0", "blocks.0", "blocks.1", "blocks.1", "head", None],
            "backward": ["head", "blocks.1", "blocks.1", "blocks.0", "blocks.0", "bucket", "bucket"],
        },
        op_names={
            "forward": ["", "linear", "shallow_copy", "torch_prims_reshape_impl", "linear", "linear", ""],
            "backward": [
                "mm",
                "mm",
                "sum",
                "mm",
                "torch.ops.aten.embedding_backward",
                "torch_all_reduce_prim_impl",
                "torch_wait_prim_impl",
            ],
        },
    )


def _ddp_step(i: int, t0: float) -> list[RawEvent]:
    """A DDP-like step: a forward without collectives, a backward (ops under autograd's engine event) ending in one
    async all_reduce of the gradient bucket."""
    return [
        _ev(f"thunderviz.step#{i}", t0, t0 + 1000),
        _ev("thunderviz.forward#0", t0 + 10, t0 + 300),
        _ev("aten::linear", t0 + 20, t0 + 60),
        _ev("aten::addmm", t0 + 25, t0 + 55),  # inside linear: not an op of its own
        _ev("aten::reshape", t0 + 100, t0 + 110),
        _ev("aten::linear", t0 + 120, t0 + 180),
        _ev("aten::linear", t0 + 200, t0 + 280),
        _ev("ThunderFunction", t0 + 285, t0 + 295),
        _ev("aten::detach", t0 + 286, t0 + 290),  # autograd's wrap-up: no trace op of its own
        _ev("thunderviz.backward", t0 + 320, t0 + 700),
        _ev("autograd::engine::evaluate_function: ThunderFunctionBackward", t0 + 330, t0 + 545),
        _ev("aten::mm", t0 + 340, t0 + 380),
        _ev("aten::mm", t0 + 390, t0 + 430),
        _ev("aten::sum", t0 + 435, t0 + 445),
        _ev("aten::mm", t0 + 450, t0 + 500),
        _ev("aten::embedding_backward", t0 + 505, t0 + 540),
        _ev(f"thunderviz.collective#{i + 1}", t0 + 550, t0 + 560),
        _ev("gloo:all_reduce", t0 + 560, t0 + 600, tid=2),
        _ev(f"thunderviz.wait#{i + 1}", t0 + 565, t0 + 620),
        _ev("thunderviz.optimizer", t0 + 720, t0 + 750),
    ]


def test_compute_without_collectives_around_it_goes_to_the_module_that_ran():
    """Under DDP the forward has no collective and the backward one at its end; the whole forward was
    'compute of blocks.0' and the whole backward one block's. Each op event now takes its trace op's group."""
    events = [e for i in range(3) for e in _ddp_step(i, i * 1000.0)]
    metas = {n: CollectiveMeta("all_reduce", sync=False, shape=(8,), dtype="float32") for n in (1, 2, 3)}
    t = _build(events, metas, closed=[0, 1, 2], modules={0: _blocks()})
    assert [s.step for s in t.steps] == [2, 3] and t.notes == []
    got = [(s.group, s.start - 1000, s.end - 1000, s.trace, s.share) for s in t.segments if s.step == 2]
    assert got == [
        ("blocks.0", 10, 100, "forward", 1.0),
        ("blocks.1", 100, 200, "forward", 1.0),
        ("head", 200, 300, "forward", 0.5),  # the wrap-up's detach matched no trace op: half the events
        ("head", 320, 390, "backward", 1.0),
        ("blocks.1", 390, 450, "backward", 1.0),
        ("blocks.0", 450, 550, "backward", 1.0),
    ]
    assert t.collectives[0].group == "bucket" and t.collectives[0].tensor == "bucket #0"


def test_a_single_step_is_kept_and_flagged():
    events, metas = _steps(1)
    t = _build(events, metas, closed=[0])
    assert [s.step for s in t.steps] == [1] and t.warmup_included and "only one step" in t.notes[0]


def test_without_step_boundaries_each_module_call_is_a_step():
    events, metas = _steps(3, marks=False)
    t = _build(events, metas, closed=[])
    assert [s.step for s in t.steps] == [2, 3] and "no optimizer step" in t.step_rule
    assert t.steps[0].start == 210 and t.steps[-1].end == max(e.end for e in events)


def test_no_step_at_all_is_said_plainly():
    t = _build([_ev("aten::mm", 0, 5)], {}, closed=[])
    assert t.steps == [] and "holds no training step" in t.notes[-1]


def test_a_ledger_that_does_not_match_keeps_shapes_and_says_why():
    events, metas = _steps(2)
    other = ModuleInfo("Net", ledger=[{"position": 0, "trace": "forward", "op_index": 1, "kind": "all_reduce"}])
    t = _build(events, metas, closed=[0, 1], modules={0: other})
    assert t.collectives[0].tensor == "float32[4]" and t.segments == []
    assert any("without parameter names" in n for n in t.notes)


def test_a_c10d_call_outside_our_wrappers_still_counts_and_takes_its_work_in_order():
    events, metas = _steps(2)
    events += [_ev("c10d::allreduce_", 330, 332), _ev("gloo:all_reduce", 333, 340, tid=3)]
    t = _build(events, metas, closed=[0, 1])
    extra = [c for c in t.collectives if c.kind == "all_reduce"]
    assert len(extra) == 1 and extra[0].sync and (extra[0].start, extra[0].end) == (333, 340)


# ---------------------------------------------------------------------------------------------- files


def _small_timeline():
    events, metas = _steps(3)
    r0 = _build(events, metas, closed=[0, 1, 2])
    r0.clock_samples = [(0.0, 10.0)]
    d = r0.to_dict()
    d["rank"], d["world_size"] = 1, 2
    return r0, d


def test_save_and_load_one_file_per_rank(tmp_path):
    r0, d1 = _small_timeline()
    r0.world_size = 2
    save(r0, tmp_path / "r0.json")
    (tmp_path / "r1.json").write_text(
        json.dumps(
            {"format": "thunderviz.timeline", "version": 1, "name": "", "world_size": 2, "problems": [], "ranks": [d1]}
        )
    )
    tl = load(tmp_path / "r0.json", tmp_path / "r1.json")
    assert isinstance(tl, Timeline) and tl.rank_ids == [0, 1] and tl.steps == [2, 3]
    assert tl.ranks[0].steps[0].start == 0.0  # common clock, from the first step


def _doc(mutate):
    _r0, d1 = _small_timeline()
    doc = {"format": "thunderviz.timeline", "version": 1, "name": "", "world_size": 2, "problems": [], "ranks": [d1]}
    mutate(doc)
    return doc


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda d: d["ranks"][0]["collectives"][1].__setitem__("issue_start", "soon"),
            "ranks[0].collectives[1].issue_start",
        ),
        (lambda d: d["ranks"][0]["collectives"][0].__setitem__("end", -1e9), "ranks[0].collectives[0].end"),
        (lambda d: d["ranks"][0]["steps"][0].pop("step"), "ranks[0].steps[0]: the field 'step' is missing"),
        (lambda d: d["ranks"][0].__setitem__("rank", 7), "ranks[0].rank"),
        (lambda d: d["ranks"][0]["ops"]["name_ids"].append(99), "ranks[0].ops"),
        (lambda d: d["ranks"][0]["clock_samples"].append([5, 1]), "ranks[0].clock_samples[1]"),
        (lambda d: d["ranks"][0]["segments"][0].__setitem__("group", None), "ranks[0].segments[0].group"),
        (lambda d: d.__setitem__("ranks", {}), "ranks"),
        (lambda d: d["ranks"][0]["collectives"][0].__setitem__("index", 0), "ranks[0].collectives[0].index"),
        (lambda d: d["ranks"][0]["collectives"][0].__setitem__("shape", [1, "x"]), "ranks[0].collectives[0].shape"),
    ],
)
def test_every_malformed_field_is_named_with_the_file(tmp_path, mutate, field):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(_doc(mutate)))
    with pytest.raises(TraceFormatError) as e:
        load(p)
    assert str(p) in str(e.value) and field in str(e.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ('{"format": "other"}', "without"),
        ('{"format": "thunderviz.timeline", "version": 99}', "version 99"),
        ("[" * 100000, "nested deeper than"),
        ('{"format": "thunderviz.timeline", "version": 1, "ranks": [{"rank": NaN}]}', "NaN is not a JSON number"),
        ('{"format": "thunderviz.timeline", "version": 1, "version": 1}', "appears twice"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_files_that_are_not_timelines(tmp_path, text, says):
    p = tmp_path / "x.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(TraceFormatError, match=says):
        load(p)
    with pytest.raises(TraceFormatError, match="cannot read"):
        load(tmp_path / "missing.json")


def test_the_same_rank_twice_is_refused(tmp_path):
    r0, _ = _small_timeline()
    save(r0, tmp_path / "a.json")
    save(r0, tmp_path / "b.json")
    with pytest.raises(TraceFormatError, match="rank 0 is also in"):
        load(tmp_path / "a.json", tmp_path / "b.json")


# ---------------------------------------------------------------------------------------------- the recorder here


@pytest.mark.parametrize("steps", [0, -1, 2.5, True])
def test_steps_must_be_a_positive_whole_number(steps):
    with pytest.raises(ValueError, match=r"steps must be a whole number >= 1"):
        record_timeline(steps=steps)


def test_a_block_that_raises_undoes_every_wrapper_and_keeps_what_ran():
    import torch.distributed as dist

    before = dist.all_reduce
    net = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    rec = record_timeline(steps=2, modules=[net])

    def train_then_fail() -> None:
        with rec:
            for _ in range(2):
                net(torch.randn(2, 4)).sum().backward()
                opt.step()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        train_then_fail()
    assert dist.all_reduce is before and not rec.recording
    assert net._forward_pre_hooks == {} and net._forward_hooks == {}
    assert [s.step for s in rec.result.steps] == [2]
    assert "raised" in rec.result.notes[-1]


def test_a_block_without_a_step_records_nothing_and_says_so(tmp_path):
    with record_timeline(steps=3) as rec:
        torch.randn(8, 8) @ torch.randn(8, 8)
    assert rec.result.steps == [] and "no training step" in rec.result.notes[0]
    tl = load(rec.save(tmp_path / "r.json"))
    assert tl.steps == [] and "no training step" in tl.ranks[0].notes[0]


def test_explicit_step_calls_define_the_steps():
    net = torch.nn.Linear(4, 4)
    with record_timeline(steps=2, modules=[net]) as rec:
        for _ in range(5):
            net(torch.randn(2, 4))
            rec.step()
    assert [s.step for s in rec.result.steps] == [2, 3]
    assert [r.kind for r in rec.result.regions] == ["forward", "forward"]


def test_explicit_steps_after_the_recording_are_timed_unprofiled_after_one_settling_step(tmp_path):
    """The run's step time comes from the steps after the recording (the profiler's per-op cost is not in them),
    the first of them left to settle; a file keeps them, and without them the recorded steps are used."""
    from thunderviz.timeline.record import UNPROFILED_STEPS, observed_steps

    net = torch.nn.Linear(4, 4)
    with record_timeline(steps=2, modules=[net], clock_rounds=0) as rec:
        for _ in range(observed_steps(2) + 3):  # three more: nothing times them
            net(torch.randn(2, 4))
            rec.step()
    assert [s.step for s in rec.result.steps] == [2, 3]
    assert sorted(rec.result.unprofiled_steps) == [5, 6] and len(rec.result.unprofiled_steps) == UNPROFILED_STEPS
    assert all(us > 0 for us in rec.result.unprofiled_steps.values())
    save(rec.result, tmp_path / "r0.json")
    timeline = load(tmp_path / "r0.json")
    assert timeline.ranks[0].unprofiled_steps == rec.result.unprofiled_steps
    analysis = timeline.analysis()
    assert analysis.timed_steps() == ((5, 6), True)
    assert analysis.step_time() == pytest.approx(sum(rec.result.unprofiled_steps.values()) / 2)
    timeline.ranks[0].unprofiled_steps = {}
    assert timeline.analysis().timed_steps() == ((2, 3), False)


def test_the_timeline_model_opens_without_thunder_or_ipython():
    """Loading and drawing a saved timeline needs neither thunder nor IPython (nor more than ``import thunderviz``)."""
    from tests.helpers.fresh_interpreter import HEAVY, NOTEBOOK, light_paths, present

    # everything loaded up to the timeline modules (``import thunderviz`` and the trace renderer first)
    assert present(light_paths().loaded["open and draw a saved timeline"], HEAVY, NOTEBOOK) == []


def _two_ranks(lates: list[float], steps_us: list[float] | None = None) -> Timeline:
    """Steps of 10 ms (or ``steps_us``); in step i the rank ``lates[i]`` points at (sign: rank 1 if > 0, rank 0 if
    < 0) arrives ``abs(lates[i])`` us after the other, which waits for it (synchronous, so the wait is blocked)."""
    ranks = {0: RankTimeline(rank=0, world_size=2, aligned=True), 1: RankTimeline(rank=1, world_size=2, aligned=True)}
    t0 = 0.0
    for i, late in enumerate(lates):
        dur = (steps_us or [10_000.0] * len(lates))[i]
        for r, t in ranks.items():
            t.steps.append(Region("step", t0, t0 + dur, i + 2))
            me = abs(late) if (late > 0) == (r == 1) else 0.0
            c = CollectiveEvent(
                step=i + 2,
                index=1,
                kind="all_reduce",
                tensor="t",
                issue_start=t0 + 100 + me,
                issue_end=t0 + 150 + abs(late),
                sync=True,
            )
            t.collectives.append(c)
        t0 += dur
    return Timeline.from_ranks(ranks.values())


def test_a_rank_late_in_every_step_by_a_large_share_is_named_in_one_sentence():
    a = _two_ranks([6000.0] * 4).analysis()
    top = a.straggler()
    assert top is not None and top.rank == 1 and top.named and top.counted == 4
    assert top.per_step == (6000.0,) * 4 and top.shares == (0.6,) * 4
    assert a.summary()[0] == (
        "Straggler: rank 1 arrived last in 4 of 4 steps and made the other ranks wait 6.0 ms per step (60% of the "
        "step, 24.0 ms in all), longest at all_reduce #1 t in step 2."
    )
    # the worst collective is said once, in that sentence; the list under it has the next ones
    assert all(not line.startswith("all_reduce #1 t (step 2)") for line in a.summary()[1:]), a.summary()
    assert len(a.summary()) == 4 and all(line.startswith("all_reduce #") for line in a.summary()[1:])
    three = _two_ranks([6000.0, 6000.0, 6000.0, -6000.0]).analysis().straggler()  # "at least 3 of every 4"
    assert three is not None and three.rank == 1 and three.counted == 3


def test_issue_30_a_rank_last_in_every_step_is_named_however_much_the_steps_vary():
    """Rank 0 last in 4 of 4 steps, rank 1 waiting up to 52 ms of a ~65 ms step, steps varying by 72 ms:
    the old rule compared the wait with 3x that jitter and named nobody."""
    lates = [-40_000.0, -110_000.0, -45_000.0, -80_000.0]
    a = _two_ranks(lates, [65_000.0, 200_000.0, 70_000.0, 140_000.0]).analysis()
    top = a.straggler()
    assert top is not None and top.rank == 0, a.summary()
    line = a.summary()[0]
    assert line == (
        "Straggler: rank 0 arrived last in 4 of 4 steps and made the other ranks wait 40.0\u2013110.0 ms per step "
        "(55\u201364% of the step, 275.0 ms in all), longest at all_reduce #1 t in step 3."
    )
    assert line.count(". ") == 0 and line.count("rank 0") == 1  # one sentence, the rank named once


@pytest.mark.parametrize(
    ("lates", "steps_us", "why"),
    [
        pytest.param([2000.0, -2000.0, 2000.0, -2000.0], None, "taking turns", id="turns"),
        pytest.param([6000.0, 6000.0, 100.0, 100.0], None, "a large share in only half the steps", id="not-most"),
        pytest.param([4000.0] * 4, None, "last every time, by 40% of the step", id="small-share"),
        pytest.param([0.0] * 4, None, "ranks arriving together", id="equal"),
    ],
)
def test_a_rank_not_holding_the_others_up_in_most_steps_is_not_named(lates, steps_us, why):
    """Ranks sharing CPUs take turns, or are late by a small share of the step: no straggler."""
    a = _two_ranks(lates, steps_us).analysis()
    assert a.straggler() is None, why
    line = a.summary()[0]
    assert line.startswith("No straggler"), line
    assert "Straggler:" not in " ".join(a.summary())


def test_nobody_waiting_names_nobody_and_says_so():
    a = _two_ranks([0.0] * 4).analysis()
    assert a.stragglers() == [] and a.summary() == [
        "No straggler: no rank made another wait 50 us or more at any collective."
    ]


def test_the_closest_rank_is_said_with_its_numbers_when_nobody_is_named():
    a = _two_ranks([4000.0, 4000.0, 100.0, -100.0]).analysis()
    assert a.summary()[0] == (
        "No straggler: no rank arrived last in 3 of 4 steps with the others waiting 50% of the step or more "
        "(closest: rank 1, last in 3 of 4 steps, longest wait 4.0 ms of a 10.0 ms step)."
    )


def test_the_rule_is_data_and_its_sentence_is_short():
    from thunderviz.timeline.analysis import StragglerRule

    assert len(STRAGGLER_RULE.split()) <= 40, STRAGGLER_RULE  # a 60-word rule read as a paragraph
    assert "3 of every 4 recorded steps" in STRAGGLER_RULE and "50% of the step" in STRAGGLER_RULE
    assert "jitter" not in STRAGGLER_RULE
    strict = StragglerRule(share=0.7)
    assert "70% of the step" in strict.text and strict.steps_needed(4) == 3 and strict.steps_needed(2) == 2
    tl = _two_ranks([6000.0] * 4)
    assert tl.analysis().straggler() is not None
    assert TimelineAnalysis(tl, rule=strict).straggler() is None


def test_one_step_is_not_enough_to_name_a_straggler():
    a = _two_ranks([5000.0]).analysis()
    assert a.straggler() is None
    assert a.summary()[0] == (
        "No straggler named: 1 step recorded (largest wait 5.0 ms); record at least 2 steps (--steps 2) to tell a "
        "straggler from ranks taking turns."
    )
