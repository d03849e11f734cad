"""The decision table's rows for the front doors the 2-rank runs do not take (CUDA-only plugins, other Dynamo
backends, transformers outside the tested range): plain data in, a decision or a clear refusal out."""

from __future__ import annotations

import pytest

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.decisions import Case, ObjectFacts, ObjectKind, decide
from thunderviz.parallel.front_doors import FrontDoor, TransformersFacts, transformers_in_range
from thunderviz.parallel.strategy_options import parse_options

FSDP = parse_options("fsdp", {}, jit_keywords=lambda: ())
COMPILED = "thunder.compile(model, recipe=BaseRecipe(fuser='torch.compile'), plugins=[{}])"


def _compiled(plugin: str) -> ObjectFacts:
    door = FrontDoor(call=COMPILED.format(repr(plugin)), recipe="BaseRecipe", plugins=(plugin,))
    return ObjectFacts(kind=ObjectKind.THUNDER_MODULE, type_name="Gated", door=door)


@pytest.mark.parametrize(
    ("plugin", "says"),
    [
        ("reduce-overhead", "CUDAGraphTransform captures"),
        ("quantize-int4", "cannot be sharded"),
    ],
)
def test_plugins_that_capture_or_freeze_what_the_strategy_distributes_are_refused(plugin, says):
    with pytest.raises(JitDecisionError, match=r"thunder's .* plugin") as info:
        decide(_compiled(plugin), FSDP)
    assert says in str(info.value) and "without that plugin" in str(info.value)


def test_fp8_plugin_is_kept_and_the_reason_says_why():
    decision = decide(_compiled("fp8"), FSDP)
    assert decision.case is Case.USER_JITTED and "thunder.compile'd module" in decision.headline
    assert "Transformer Engine" in decision.reason


@pytest.mark.parametrize(
    ("door", "says"),
    [
        (FrontDoor(call="torch.compile(model)", dynamo_backend="inductor", fabric_recompiles=True), "plain module"),
        (
            FrontDoor(
                call="torch.compile(model, backend=ThunderCompiler())",
                dynamo_backend="ThunderCompiler",
                dynamo_options=("executors",),
                fabric_recompiles=True,
            ),
            "ThunderFSDPStrategy(executors=...)",
        ),
    ],
    ids=["inductor", "thunder-options"],
)
def test_dynamo_doors_the_strategy_cannot_pass_through_are_refused_with_the_fix(door, says):
    with pytest.raises(JitDecisionError, match=r"You compiled the module with") as info:
        decide(ObjectFacts(kind=ObjectKind.MODULE, type_name="Gated", door=door), FSDP)
    assert says in str(info.value)


def test_transformers_outside_the_tested_range_is_refused_naming_the_range():
    hf = TransformersFacts(version="4.57.1", model_class="LlamaForCausalLM", masks_by_vmap=True)
    with pytest.raises(JitDecisionError, match=r"transformers 4\.55\.0 to 4\.55\.4 only"):
        decide(ObjectFacts(kind=ObjectKind.MODULE, type_name="LlamaForCausalLM", transformers=hf), FSDP)
    assert transformers_in_range("4.55.4") and not transformers_in_range("4.56.0.dev0")
