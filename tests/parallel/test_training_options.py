"""``activation_checkpointing_policy`` and ``reduce_dtype`` in the option table and the decision table, and
Fabric's own spellings refused with what to use: no processes, no thunder."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.checkpointing import module_classes, select_checkpointed, span
from thunderviz.parallel.decision_reasons import communication_plan
from thunderviz.parallel.decisions import Case, ObjectFacts, ObjectKind, decide
from thunderviz.parallel.option_values import CheckpointPolicy, OptionError, Parallelism, ReduceDtype
from thunderviz.parallel.options import OPTIONS
from thunderviz.parallel.strategy_options import parse_options


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inner = nn.Sequential(Block2())


class Block2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(4, 2)


def _policy(value):
    return parse_options("fsdp", {"activation_checkpointing_policy": value}).activation_checkpointing_policy


@pytest.mark.parametrize(
    ("given", "selected"),
    [
        pytest.param({Block}, ("blocks.0", "blocks.1", "blocks.2"), id="set-of-classes"),
        pytest.param(Block, ("blocks.0", "blocks.1", "blocks.2"), id="one-class"),
        pytest.param("Block2", ("blocks.0.inner.0", "blocks.1.inner.0", "blocks.2.inner.0"), id="class-name"),
        pytest.param([f"{__name__}.Block"], ("blocks.0", "blocks.1", "blocks.2"), id="qualified-name"),
        pytest.param(lambda m: isinstance(m, nn.Linear) and m.out_features == 2, ("head",), id="callable"),
        pytest.param(ModuleWrapPolicy({Block2}), ("blocks.0.inner.0", "blocks.1.inner.0", "blocks.2.inner.0")),
        # torch's auto-wrap form (module, recurse, nonwrapped_numel), as Fabric's FSDPStrategy passes it on
        pytest.param(lambda module, recurse, nonwrapped_numel: nonwrapped_numel == 10, ("head",), id="auto-wrap"),
        pytest.param({Block, Block2}, ("blocks.0", "blocks.1", "blocks.2"), id="outermost-only"),
        pytest.param({Net}, ("",), id="the-model-itself"),
    ],
)
def test_a_policy_selects_the_outermost_matching_modules(given, selected):
    policy = _policy(given)
    assert isinstance(policy, CheckpointPolicy)
    assert select_checkpointed(Net(), policy) == selected


def test_policies_of_classes_and_names_cross_to_ranks_by_pickle():
    options = parse_options("ddp", {"activation_checkpointing_policy": {Block, "Block2"}, "reduce_dtype": "float32"})
    assert pickle.loads(pickle.dumps(options)) == options
    assert options.summary() == "DDP 25 MB buckets checkpointing {Block, Block2} reduce in float32"


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, None), (torch.float32, ReduceDtype.FLOAT32), ("bfloat16", ReduceDtype.BFLOAT16), ("FLOAT16", "float16")],
)
def test_reduce_dtype_takes_a_torch_dtype_or_its_name(given, expected):
    assert parse_options("fsdp", {"reduce_dtype": given}).reduce_dtype == expected


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "reduce_dtype",
            torch.int8,
            "You set `ThunderFSDPStrategy(reduce_dtype=torch.int8)`; it must be None (reduce gradients in their own"
            " dtype, the parameters') or one of torch.float32, torch.bfloat16, torch.float16, torch.float64 (or its"
            " name, e.g. 'float32').",
        ),
        (
            "activation_checkpointing_policy",
            [Block, 3],
            "You set `ThunderFSDPStrategy(activation_checkpointing_policy=[<class 'tests.parallel."
            "test_training_options.Block'>, 3])`; give a set of module classes (e.g. `{Block}`), class names, or a"
            " callable `module -> bool`; 3 is neither a class nor a name.",
        ),
        (
            "activation_checkpointing_policy",
            set(),
            "You set `ThunderFSDPStrategy(activation_checkpointing_policy=set())`; give a set of module classes (e.g."
            " `{Block}`), class names, or a callable `module -> bool`.",
        ),
        (
            "mixed_precision",
            object(),
            "an option of Lightning's FSDPStrategy (or torch's FSDP) that thunderviz does not take: choose the compute"
            " precision on Fabric instead (`Fabric(precision='bf16-true')`: bf16 parameters and compute; 'bf16-mixed'"
            " or '16-mixed': fp32 parameters under autocast), and the gradient reduction dtype with"
            " `reduce_dtype=torch.float32`.",
        ),
    ],
)
def test_bad_values_and_fabrics_spellings_say_what_to_use(name, value, message):
    with pytest.raises(OptionError) as err:
        parse_options("fsdp", {name: value})
    assert message in str(err.value)


def test_both_strategies_take_both_options_and_the_magics_spell_them():
    by_name = {o.name: o for o in OPTIONS}
    for name in ("activation_checkpointing_policy", "reduce_dtype"):
        assert by_name[name].applies(Parallelism.FSDP) and by_name[name].applies(Parallelism.DDP)
    flag = by_name["activation_checkpointing_policy"].flag
    assert flag.name == "--activation-checkpointing"
    assert _policy(flag.parse("Block, Block2")) == CheckpointPolicy(names=("Block", "Block2"))
    assert by_name["reduce_dtype"].flag.name == "--reduce-dtype" and by_name["reduce_dtype"].choices is ReduceDtype


# -- the decision log -------------------------------------------------------------------------------------------------

NET = Net()
FACTS = ObjectFacts(
    kind=ObjectKind.MODULE,
    type_name="Net",
    checkpointed=select_checkpointed(NET, _policy({Block})),
    module_classes=module_classes(NET),
)


def test_the_decision_names_the_checkpointed_modules():
    options = parse_options("fsdp", {"activation_checkpointing_policy": {Block}})
    reason = decide(FACTS, options).reason
    assert (
        "; activation checkpointing: 3 modules selected by {Block} (blocks.0 ... blocks.2) run their forward under"
        " torch.utils.checkpoint.checkpoint(..., use_reentrant=False), which thunder traces into its"
        " recompute-in-backward: forward saves their inputs only and backward recomputes the rest; communication:"
    ) in reason
    ran = ObjectFacts(**{**FACTS.__dict__, "kind": ObjectKind.THUNDER_MODULE, "has_run": True, "cached_traces": 1})
    assert "the traces it already made had no checkpointing (they are the ones cleared)" in decide(ran, options).reason
    case2 = decide(FACTS, parse_options("ddp", {"jit": False, "activation_checkpointing_policy": {Block}}))
    assert case2.case is Case.FUNCTION_JIT
    assert "your jitted function sees the checkpointed forwards when it traces the module" in case2.reason
    assert "activation checkpointing" not in decide(FACTS, parse_options("fsdp", {})).reason
    assert span(("",)) == "the whole model" and span(("a", "b")) == "a, b"


def test_a_policy_that_selects_nothing_is_refused_with_the_classes_there_are():
    options = parse_options("ddp", {"activation_checkpointing_policy": {nn.Conv2d}})
    facts = ObjectFacts(**{**FACTS.__dict__, "checkpointed": ()})
    with pytest.raises(JitDecisionError) as err:
        decide(facts, options)
    assert str(err.value) == (
        "You set `ThunderDDPStrategy(activation_checkpointing_policy={Conv2d})`, but it selects no module of the Net"
        " you set up, so nothing would be checkpointed. Its module classes are: Block, Block2, Linear, ModuleList,"
        " Net, Sequential. Name one of them (a class, its name, or a callable `module -> bool`)."
    )


@pytest.mark.parametrize(("parallelism", "collective"), [("fsdp", "reduce_scatter"), ("ddp", "all_reduce")])
def test_the_communication_plan_says_the_reduce_dtype(parallelism, collective):
    plan = communication_plan(parse_options(parallelism, {"reduce_dtype": "float32"}))
    assert plan.endswith(
        f"; gradients are reduced in float32 (reduce_dtype): each bucket is cast to it before its {collective} and"
        " the result back to the gradient's dtype"
    )
    assert "reduce_dtype" not in communication_plan(parse_options(parallelism, {}))
