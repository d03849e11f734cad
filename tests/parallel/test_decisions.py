"""Every row of the decision table and every error message, without processes."""

from __future__ import annotations

import pytest

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.decision_reasons import communication_plan
from thunderviz.parallel.decisions import (
    Action,
    Case,
    Decision,
    ObjectFacts,
    ObjectKind,
    decide,
    impossible,
)
from thunderviz.parallel.option_values import DEFAULT_BUCKETING, Bucketing, OptionError, Parallelism
from thunderviz.parallel.strategy_options import parse_options


def opts(parallelism: str, **given):
    """The options a strategy would parse from these keywords (jit keywords accepted as they are)."""
    return parse_options(parallelism, given, jit_keywords=lambda: given.keys())


FSDP = opts("fsdp")
DDP = opts("ddp")
MODULE = ObjectFacts(kind=ObjectKind.MODULE, type_name="Net")
TM = ObjectFacts(kind=ObjectKind.THUNDER_MODULE, type_name="Net")
TM_RAN = ObjectFacts(kind=ObjectKind.THUNDER_MODULE, type_name="Net", has_run=True, cached_traces=2)


@pytest.mark.parametrize(
    ("facts", "options", "case", "action", "clear_cache", "reason"),
    [
        pytest.param(
            MODULE,
            FSDP,
            "case 1: raw module",
            Action.JIT_AND_DISTRIBUTE,
            False,
            "a plain nn.Module and jit=True: call thunder.jit once, then shard its parameters (FSDP) in place so"
            " model.parameters() are what the optimizer must update",
            id="raw-fsdp",
        ),
        pytest.param(
            MODULE,
            opts("ddp", executors=("torch",)),
            "case 1: raw module",
            Action.JIT_AND_DISTRIBUTE,
            False,
            "a plain nn.Module and jit=True: call thunder.jit with executors=['torch'] once, then replicate its"
            " parameters (DDP) in place so model.parameters() are what the optimizer must update",
            id="raw-ddp-executors",
        ),
        pytest.param(
            MODULE,
            opts("fsdp", executors=("torch",), cache="no caching", disable_torch_autograd=True),
            "case 1: raw module",
            Action.JIT_AND_DISTRIBUTE,
            False,
            "a plain nn.Module and jit=True: call thunder.jit with executors=['torch'], cache=...,"
            " disable_torch_autograd=... once, then shard its parameters (FSDP) in place so model.parameters() are"
            " what the optimizer must update",
            id="raw-fsdp-jit-kwargs",
        ),
        pytest.param(
            MODULE,
            opts("fsdp", jit=False),
            "case 2: module used inside a jitted function",
            Action.DISTRIBUTE_FOR_FUNCTION_JIT,
            True,
            "jit=False: the module is not jitted here; shard its parameters (FSDP) in place and tag them, so thunder"
            " inserts the collectives when the user's jitted function is traced; cached traces of jitted functions"
            " that already ran are cleared so none runs without collectives",
            id="raw-nojit-fsdp",
        ),
        pytest.param(
            TM,
            DDP,
            "case 3: module already jitted by the user",
            Action.DISTRIBUTE_IN_PLACE,
            False,
            "already jitted (not jitting twice): replicate its parameters (DDP) in place and return the user's own"
            " ThunderModule, so no undistributed handle is left behind",
            id="jitted-ddp",
        ),
        pytest.param(
            TM,
            opts("fsdp", jit=False),
            "case 3: module already jitted by the user",
            Action.DISTRIBUTE_IN_PLACE,
            False,
            "already jitted (not jitting twice): shard its parameters (FSDP) in place and return the user's own"
            " ThunderModule, so no undistributed handle is left behind; jit=False changes nothing here: the module"
            " is already jitted",
            id="jitted-nojit-fsdp",
        ),
        pytest.param(
            TM_RAN,
            FSDP,
            "case 3: module already jitted by the user",
            Action.DISTRIBUTE_IN_PLACE,
            True,
            "already jitted (not jitting twice) and already run: shard its parameters (FSDP) in place and clear its"
            " 2 cached trace(s), which were made without collectives and could still pass thunder's checks; the"
            " next call retraces",
            id="jitted-ran-fsdp",
        ),
    ],
)
def test_decision_rows(facts, options, case, action, clear_cache, reason):
    decision = decide(facts, options)
    assert decision.case is Case(case) and str(decision.case) == case
    assert decision.action is action
    assert decision.clear_cache is clear_cache
    assert decision.options is options  # the log says with which options it was decided
    # Every reason ends with what happens to the collectives (see test_communication_plan_*).
    full = f"{reason}; {communication_plan(options, facts)}"
    assert decision.reason == full
    assert decision.target == "Net"
    assert decision.to_dict() == {
        "target": "Net",
        "case": case,
        "action": action.value,
        "reason": full,
        "clear_cache": clear_cache,
        "strategy": options.summary(),
        "headline": decision.headline,
    }
    back = Decision.from_dict(decision.to_dict())
    assert (back.headline, back.strategy) == (decision.headline, decision.strategy)  # a saved log keeps both


BLOCKS4 = ObjectFacts(kind=ObjectKind.MODULE, type_name="GPT", blocks=tuple(f"blocks.{i}" for i in range(4)))


@pytest.mark.parametrize(
    ("facts", "options", "headline"),
    [
        (
            BLOCKS4,
            opts("fsdp", sharding_strategy="ZERO3"),
            "case 1: jit once, then shard - ZERO3, 4 block buckets + root",
        ),
        (MODULE, FSDP, "case 1: jit once, then shard - ZERO2, 1 root bucket"),
        (MODULE, opts("fsdp", bucketing_strategy="LAYER"), "case 1: jit once, then shard - ZERO2, a bucket per layer"),
        (
            MODULE,
            opts("fsdp", bucketing_strategy="NONE"),
            "case 1: jit once, then shard - ZERO2, a collective per parameter",
        ),
        (MODULE, DDP, "case 1: jit once, then replicate - 25 MB gradient buckets"),
        (MODULE, opts("ddp", bucket_size_in_mb=0), "case 1: jit once, then replicate - an all_reduce per gradient"),
        (MODULE, opts("fsdp", jit=False), "case 2: shard in place for your jitted function - ZERO2, 1 root bucket"),
        (TM, DDP, "case 3: replicate your jitted module in place - 25 MB gradient buckets"),
        (TM_RAN, FSDP, "case 3: shard your jitted module in place, 2 cached trace(s) cleared - ZERO2, 1 root bucket"),
    ],
)
def test_every_decision_has_a_one_line_headline(facts, options, headline):
    """The decision in one line; the paragraph of reasoning stays one attribute away (``reason``)."""
    decision = decide(facts, options)
    assert decision.headline == headline
    assert len(decision.reason) > 3 * len(headline)  # the full reasoning is still there


def test_a_headline_without_facts_reads_case_and_action():
    """A hand-made or old saved decision (no headline) still gets one, from its case and action."""
    d = Decision("Net", Case.RAW_MODULE, Action.JIT_AND_DISTRIBUTE, "because")
    assert d.headline == "case 1: jit once, then distribute"
    assert (
        Decision.from_dict(
            {"target": "Net", "case": str(Case.USER_JITTED), "action": "distribute in place", "reason": "r"}
        ).headline
        == "case 3: distribute your jitted module in place"
    )


def test_a_refused_setup_is_logged_with_an_action_the_table_knows():
    row = impossible("Net", JitDecisionError("no"), FSDP)
    assert row == Decision(target="Net", case=Case.IMPOSSIBLE, action=Action.REFUSE, reason="no", options=FSDP)
    assert row.to_dict()["action"] == "error" and row.strategy == "FSDP ZERO2 BLOCK"
    assert row.headline == "error: no"
    long = impossible("Net", JitDecisionError("This Net was already set up. Call `fabric.setup` once."), FSDP)
    assert long.headline == "error: This Net was already set up"


def test_communication_plan_zero3_block_names_the_blocks_and_why_block_is_the_default():
    facts = ObjectFacts(kind=ObjectKind.MODULE, type_name="GPT", blocks=("blocks.0", "blocks.1", "blocks.2"))
    options = opts("fsdp", sharding_strategy="ZERO3")
    assert options.bucketing_strategy is DEFAULT_BUCKETING is Bucketing.BLOCK
    assert communication_plan(options, facts) == (
        "communication: BLOCK bucketing, one bucket per block (3: blocks.0 ... blocks.2, the children of the"
        " model's repeated ModuleList/Sequential) and one root bucket for the parameters outside them; one"
        " all_gather per bucket in forward, issued one bucket ahead of its first use and waited for right before"
        " it, and one reduce_scatter per bucket in backward, issued as soon as its last gradient exists and waited"
        " for when the next bucket is issued (its input, the bucket's unsharded gradients, is freed then: one bucket"
        " in flight, as FSDP2); ZERO3: backward gathers each bucket again from its shards, so forward"
        " releases the unsharded weights after their last use and saves shards, not unsharded weights, for"
        " backward; BLOCK is the default because it measured cheapest: on a 4-block GPT on 2 CPU ranks, about"
        " 10-12 ms of CPU per step beyond one-process thunder.jit, against 29 ms for LAYER, 36-44 ms for NONE and"
        " 21-25 ms for torch's FSDP2"
    )


@pytest.mark.parametrize(
    ("options", "blocks", "says"),
    [
        (opts("fsdp"), (), "one root bucket holding every parameter (no repeated"),
        (opts("fsdp", bucketing_strategy="LAYER"), (), "one bucket per module that owns"),
        (opts("fsdp", bucketing_strategy="NONE"), (), "NONE bucketing, one bucket per parameter"),
        (opts("fsdp"), (), "ZERO2: the unsharded parameters gathered in forward are kept"),
        (opts("ddp"), (), "into buckets of 25 MB (the first one 1 MB, as torch DDP does"),
        (opts("ddp", bucket_size_in_mb=0), (), "one all_reduce per gradient"),
    ],
)
def test_communication_plan_rows(options, blocks, says):
    facts = ObjectFacts(kind=ObjectKind.MODULE, type_name="Net", blocks=blocks)
    assert says in communication_plan(options, facts)
    assert ("BLOCK is the default" in communication_plan(options, facts)) == (
        options.parallelism is Parallelism.FSDP and options.bucketing_strategy is Bucketing.BLOCK
    )


@pytest.mark.parametrize(
    ("facts", "options", "message"),
    [
        pytest.param(
            ObjectFacts(kind=ObjectKind.JITTED_FUNCTION, type_name="step"),
            FSDP,
            "`fabric.setup` received the jitted function 'step', but ThunderFSDPStrategy distributes modules. Set up"
            " the model instead (`ThunderFSDPStrategy(jit=False)`, then `model = fabric.setup(model)`) and call your"
            " jitted function with it: thunder inserts the collectives when the function is traced.",
            id="jitted-function",
        ),
        pytest.param(
            ObjectFacts(kind=ObjectKind.OTHER, type_name="dict"),
            DDP,
            "`fabric.setup` received a 'dict', but ThunderDDPStrategy can only set up a `torch.nn.Module` or a module"
            " returned by `thunder.jit(module)`.",
            id="not-a-module",
        ),
        pytest.param(
            ObjectFacts(kind=ObjectKind.MODULE, type_name="Net", distributed_by_us=True),
            FSDP,
            "This Net was already set up by a thunderviz strategy: its parameters are already distributed. Call"
            " `fabric.setup` once per model and keep using the object it returned.",
            id="set-up-twice",
        ),
        pytest.param(
            ObjectFacts(kind=ObjectKind.THUNDER_MODULE, type_name="Net", distributed_by_thunder="fsdp"),
            DDP,
            "This ThunderModule was already distributed with `thunder.distributed.fsdp(...)`, so ThunderDDPStrategy"
            " would distribute it a second time. Either hand `fabric.setup` the module before calling"
            " `thunder.distributed.fsdp`, or drop the strategy and keep using `thunder.distributed.fsdp` yourself.",
            id="thunder-distributed",
        ),
        pytest.param(
            TM,
            opts("fsdp", executors=("torch",)),
            "You passed `executors=` to ThunderFSDPStrategy, but the Net you set up is already jitted, and jitting it"
            " a second time is never right. Pass the executors to your own `thunder.jit(model, executors=...)` call,"
            " or hand `fabric.setup` the plain module.",
            id="executors-on-jitted",
        ),
        pytest.param(
            TM_RAN,
            opts("ddp", disable_torch_autograd=True),
            "You passed thunder.jit arguments (disable_torch_autograd=...) to ThunderDDPStrategy, but the Net you set"
            " up is already jitted, so the strategy never calls `thunder.jit` and they would be silently ignored."
            " Pass them to your own `thunder.jit(model, ...)` call, or hand `fabric.setup` the plain module.",
            id="jit-kwargs-on-jitted",
        ),
    ],
)
def test_impossible_decisions_raise_with_the_fix(facts, options, message):
    with pytest.raises(JitDecisionError) as err:
        decide(facts, options)
    assert str(err.value) == message


def test_jit_false_with_executors_is_rejected():
    with pytest.raises(OptionError) as err:
        opts("ddp", jit=False, executors=("torch",))
    assert str(err.value) == (
        "You set `ThunderDDPStrategy(jit=False, executors=...)`, but with `jit=False` the strategy never calls"
        " `thunder.jit`, so the executors would be silently ignored. Pass them to your own"
        " `thunder.jit(..., executors=...)` call, or set `jit=True`."
    )


def test_jit_false_with_jit_kwargs_is_rejected():
    with pytest.raises(OptionError) as err:
        opts("fsdp", jit=False, cache="no caching")
    assert str(err.value) == (
        "You set `ThunderFSDPStrategy(jit=False, cache=...)`, but with `jit=False` the strategy never calls"
        " `thunder.jit`, so these thunder.jit arguments would be silently ignored. Pass them to your own"
        " `thunder.jit(...)` call, or set `jit=True`."
    )


def test_decisions_module_reads_thunder_only_through_thunder_hooks():
    """Thunder internals are read in one module; the table, its facts and rows and its words never import thunder."""
    import ast
    import inspect

    from thunderviz.parallel import decision_reasons, decision_types, decisions

    for module in (decisions, decision_types, decision_reasons):
        tree = ast.parse(inspect.getsource(module))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(m == "thunder" or m.startswith("thunder.") for m in imported), (module.__name__, imported)


# -- hybrid sharding's mesh -------------------------------------------------------------------------------------------

HYBRID = opts("fsdp", sharding_strategy="HYBRID_SHARD")


def _mesh(hosts, options=HYBRID):
    from thunderviz.parallel.decisions import MeshFacts, decide_mesh

    return decide_mesh(MeshFacts(tuple(hosts)), options, "Net", Case.RAW_MODULE)


def test_hybrid_shards_within_each_host_by_default():
    row = _mesh(["a", "a", "b", "b"])
    assert row.action is Action.CHOOSE_MESH and row.mesh == (2, 2)
    assert row.headline == "mesh 2 x 2: shard within each host (2 ranks), replicate across 2 hosts"
    assert "1/2 of the gradients" in row.reason
    assert row.to_dict()["mesh"] == [2, 2] and Decision.from_dict(row.to_dict()).mesh == (2, 2)


def test_hybrid_on_one_host_is_fsdp_over_every_rank_and_says_so():
    row = _mesh(["a"] * 4)
    assert row.mesh == (1, 4)
    assert row.headline == "mesh 1 x 4: one host, so hybrid sharding is FSDP over all 4 ranks"


@pytest.mark.parametrize(
    ("hosts", "says"),
    [
        (["a", "b", "a", "b"], "their ranks are not consecutive (rank 0: a, rank 1: b, rank 2: a, rank 3: b)"),
        (["a", "a", "a", "b"], "they run different numbers of ranks"),
    ],
)
def test_hosts_that_cannot_form_equal_shard_groups_are_an_error_with_the_fix(hosts, says):
    with pytest.raises(JitDecisionError) as err:
        _mesh(hosts)
    assert says in str(err.value)
    assert "give device_mesh=(replicas, shard_size)" in str(err.value)


def test_a_given_mesh_must_cover_the_world_and_one_spanning_hosts_is_recorded_with_a_warning():
    with pytest.raises(JitDecisionError, match=r"2 x 3 = 6 ranks, but this run has 4"):
        _mesh(["a"] * 4, opts("fsdp", sharding_strategy="hybrid", device_mesh=(2, 3)))
    row = _mesh(["a", "b", "a", "b"], opts("fsdp", sharding_strategy="hybrid", device_mesh=(2, 2)))
    assert row.mesh == (2, 2) and row.headline.endswith("2 shard group(s) span hosts")
    assert "shard groups [0, 1] span hosts" in row.warning
    row = _mesh(["a", "a", "b", "b"], opts("fsdp", sharding_strategy="hybrid", device_mesh=(2, 2)))
    assert not row.warning and "only the all_reduce of the reduced gradient shards crosses hosts" in row.reason


def test_hybrid_communication_plan_says_what_crosses_hosts():
    plan = communication_plan(opts("fsdp", sharding_strategy="_HYBRID_SHARD_ZERO2"))
    assert "within each shard group, one all_gather per bucket" in plan
    assert "across the replica groups, one all_reduce of each reduced bucket shard" in plan
    assert "ZERO2: the unsharded parameters gathered in forward are kept for backward within the shard group" in plan
