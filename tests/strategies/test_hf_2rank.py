"""Hugging Face transformers models (4.55: masks built with torch.vmap, the generation cache on by default) train under
both strategies on 2 gloo ranks like one eager process, through each front door, and the plan and the auto strategy
work on them. Needs the ``hf`` extra (in the ``test`` extra).

Which model meets which door (pairwise, each case and each strategy with an HF model): ``thunderviz.plan`` on a
Llama, and ``ThunderAutoStrategy`` choosing from it FSDP ZERO3 with the decoder layers checkpointed for case 1 as a
whole training loop (AdamW, clipping, a sharded checkpoint saved, loaded and continued); Qwen2 case 2 under FSDP
ZERO3; Phi3 case 3 under DDP; GPT-2 case 3 under FSDP ZERO2. All of it is one job on the session's rank pair (the
module fixture): each model is interpreted once per rank, and the resumed loop reuses the loop's trace.

About 160 s serial with a load of 4-5 on 2 cores (the Llama-only file before it: 105 s, back to back), 310 s with a
load of 6 (rank 0's CPU: the Llama's plan and loop 57 s, Qwen2 22 s with the pair's first launch, GPT-2 15 s,
Phi3 11 s).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "transformers", reason="transformers is in the `hf` extra (pip install -c constraints.txt -e '.[test]')"
)

from tests.helpers.rank_pool import run_on_pool
from tests.strategies.hf_scenarios import MAX_NORM, SAVE_AT, STEPS, suite

PREPARED = ["attention masks built by broadcasting", "use_cache turned off"]
REUSED = "reused an earlier set-up's trace"
FABRIC_WALK = "Fabric's output hooks traced tensor by tensor"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_on_pool(suite, str(tmp_path_factory.mktemp("hf")), timeout=1500)


def _like_one_process(results, scenario: str) -> None:
    ref = results[0][scenario]["reference"]
    for rank, out in enumerate(results):
        got = out[scenario]["losses"]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), atol=1e-4, rtol=0, msg=f"rank {rank}")


def _recorded(decision: dict, prepared: list[str]) -> None:
    """The decision records what the strategy prepared, in its headline and its reason."""
    assert decision["prepare"] == prepared
    assert f"transformers: {', '.join(prepared)}" in decision["headline"], decision["headline"]
    assert "model.config.use_cache = False" in decision["reason"]


def test_llama_training_loop_with_checkpointed_layers_matches_one_process(results):
    ref = results[0]["llama loop"]["reference"]
    for rank, out in enumerate(results):
        r = out["llama loop"]
        torch.testing.assert_close(torch.tensor(r["log"]["losses"]), torch.tensor(ref["losses"]), atol=1e-4, rtol=0)
        # the norms are ~1.8: float32 sums in another order (a reduce-scatter's) differ by ~1e-4 absolute (1.06e-4 in
        # one full run), so they are compared relative to their size
        norms = torch.tensor(r["log"]["norms"])
        torch.testing.assert_close(norms, torch.tensor(ref["norms"]), atol=1e-4, rtol=1e-4)
        assert all(n > MAX_NORM for n in r["log"]["norms"]), f"rank {rank}: clipping never engaged"
        d = r["decision"]
        assert d["case"] == "case 1: raw module"
        _recorded(d, PREPARED)
        assert "then shard - ZERO3" in d["headline"], d["headline"]
        assert "LlamaDecoderLayer" in d["reason"], "the reason names what activation checkpointing selected"
        assert r["use_cache"] == (True, False), "the strategy turned the generation cache off, as its decision says"


def test_llama_resumes_from_its_sharded_checkpoint_exactly(results):
    for out in results:
        r = out["llama loop"]
        assert r["resumed_step"] == STEPS
        assert r["resumed_log"]["losses"] == r["log"]["losses"][SAVE_AT:]
        assert r["resumed"].keys() == r["uninterrupted"].keys()
        for name, value in r["uninterrupted"].items():
            assert torch.equal(r["resumed"][name], value), name
        assert [e.startswith(REUSED) for e in r["resumed_compiles"]] == [True], r["resumed_compiles"]


@pytest.mark.parametrize(
    ("scenario", "blocks"),
    [
        ("llama loop", ["model.layers.0", "model.layers.1"]),
        ("qwen2 function", ["model.layers.0", "model.layers.1"]),
        ("gpt2 jitted", ["transformer.h.0", "transformer.h.1"]),
    ],
)
def test_fsdp_block_buckets_are_the_hf_layer_lists(results, scenario, blocks):
    for out in results:
        labels = out[scenario]["buckets"]
        assert [b for b in labels if b in blocks] == blocks, labels
        assert all(b in blocks or "." not in b for b in labels), f"only HF's layers and the rest: {labels}"


@pytest.mark.parametrize(
    ("scenario", "case", "headline", "prepared"),
    [
        (
            "qwen2 function",
            "case 2: module used inside a jitted function",
            "case 2: shard in place for your jitted function - ZERO3",
            [*PREPARED, FABRIC_WALK],
        ),
        ("phi3 jitted", "case 3: module already jitted by the user", "case 3: replicate your jitted module", PREPARED),
        (
            "gpt2 jitted",
            "case 3: module already jitted by the user",
            "case 3: shard your jitted module in place - ZERO2",
            PREPARED,
        ),
    ],
)
def test_each_front_door_trains_like_one_process(results, scenario, case, headline, prepared):
    _like_one_process(results, scenario)
    for out in results:
        r = out[scenario]
        assert r["decision"]["case"] == case
        _recorded(r["decision"], prepared)
        assert r["decision"]["headline"].startswith(headline), r["decision"]["headline"]
        assert r["use_cache"] == (True, False)


def test_plan_predicts_checkpointing_hf_decoder_layers(results):
    r = results[0]["llama loop"]
    assert r["plan"]["fsdp-zero3-block+ac"]["checkpointed"] == ["LlamaDecoderLayer"]
    assert r["plan"]["fsdp-zero3-block"]["checkpointed"] == []
    assert r["plan"]["fsdp-zero3-block+ac"]["peak"] < r["plan"]["fsdp-zero3-block"]["peak"]
    assert "activation checkpointing per block:" in r["table"] and "plan for LlamaForCausalLM" in r["table"]


def test_auto_strategy_chooses_within_its_budget(results):
    for out in results:
        r = out["llama loop"]
        assert r["chosen"] == "fsdp-zero3-block+ac"
        assert "thunder_auto chose fsdp-zero3-block+ac on 2 ranks" in r["decision"]["reason"]
        assert "fsdp-zero3-block predicted" in r["decision"]["reason"] and "does not fit" in r["decision"]["reason"]
