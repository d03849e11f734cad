"""The decision table's preparations for a Hugging Face model, per case: the masks and the generation cache always,
and in case 2 (the user's jitted function calls Fabric's wrapper) Fabric's walk over the output traced tensor by
tensor. Plain data in, the decision's ``prepare`` steps and words out; the 2-rank runs are tests/strategies."""

from __future__ import annotations

import pytest

from thunderviz.parallel.decision_types import transformers_preparations
from thunderviz.parallel.decisions import Case, ObjectFacts, ObjectKind, decide
from thunderviz.parallel.front_doors import Preparation, TransformersFacts
from thunderviz.parallel.strategy_options import parse_options

HF = TransformersFacts(version="4.55.4", model_class="Qwen2ForCausalLM", use_cache=True, masks_by_vmap=True)
BOTH = [Preparation.MASKS_BY_BROADCASTING, Preparation.NO_GENERATION_CACHE]


def _options(kind: str, **given: object) -> object:
    return parse_options(kind, given, jit_keywords=lambda: ())


@pytest.mark.parametrize(
    ("kind", "given", "object_kind", "case", "steps"),
    [
        ("fsdp", {}, ObjectKind.MODULE, Case.RAW_MODULE, BOTH),
        ("fsdp", {"jit": False}, ObjectKind.MODULE, Case.FUNCTION_JIT, [*BOTH, Preparation.OUTPUT_HOOKS_BY_LEAVES]),
        ("ddp", {"jit": False}, ObjectKind.MODULE, Case.FUNCTION_JIT, [*BOTH, Preparation.OUTPUT_HOOKS_BY_LEAVES]),
        ("ddp", {}, ObjectKind.THUNDER_MODULE, Case.USER_JITTED, BOTH),
    ],
)
def test_each_case_prepares_what_its_trace_meets(kind, given, object_kind, case, steps):
    facts = ObjectFacts(kind=object_kind, type_name="Qwen2ForCausalLM", transformers=HF)
    decision = decide(facts, _options(kind, **given))
    assert decision.case is case
    assert list(decision.prepare) == steps
    assert f"transformers: {', '.join(str(s) for s in steps)}" in decision.headline
    fabric_walk = "whose hook walk over the output (apply_to_collection) deep-copies transformers' ModelOutput"
    assert (fabric_walk in decision.reason) == (case is Case.FUNCTION_JIT)


def test_a_model_without_cache_or_vmap_masks_needs_nothing_outside_case_2():
    quiet = TransformersFacts(version="4.55.4", model_class="GPT2LMHeadModel")
    assert transformers_preparations(quiet) == ()
    assert transformers_preparations(quiet, function_jit=True) == (Preparation.OUTPUT_HOOKS_BY_LEAVES,)
    assert transformers_preparations(None, function_jit=True) == ()
