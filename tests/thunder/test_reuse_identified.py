"""Compile reuse for Hugging Face models (``thunder.reuse.identified``): an equal model (other weights) has the same
key, and each patch users make to transformers' code in a running process, a changed config value, and activation
checkpointing make another key, named by ``explain_miss``. Keys only (no tracing); the 2-rank runs reuse for real
(tests/strategies/test_hf_2rank.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is in the `hf` extra")

from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

from thunderviz.parallel.checkpointing import select_checkpointed
from thunderviz.parallel.option_values import CheckpointPolicy
from thunderviz.thunder.jit.checkpointed_forward import checkpoint_modules_
from thunderviz.thunder.reuse.key import key_of
from thunderviz.thunder.reuse.why_not import explain_miss

INPUT = (torch.zeros(2, 7, dtype=torch.long),)


def _llama(seed: int = 0, **config: object) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    small = {"hidden_size": 24, "intermediate_size": 40, "num_attention_heads": 4, "num_key_value_heads": 2}
    config = {"vocab_size": 48, "num_hidden_layers": 2, "max_position_embeddings": 16, **small, **config}
    return LlamaForCausalLM(LlamaConfig(**config))


def _key(model: torch.nn.Module) -> object:
    return key_of(model, INPUT, {}, lambda: ())[0]


def test_an_equal_model_with_other_weights_has_the_same_key():
    assert _key(_llama(seed=0)) == _key(_llama(seed=1))


def test_a_changed_config_value_is_named():
    before = _key(_llama())
    after = _key(_llama(rms_norm_eps=1e-5))
    assert after != before
    assert explain_miss(after, [before]) == "attribute config.rms_norm_eps changed (1e-06 -> 1e-05)"


def test_a_method_patched_on_a_transformers_class_makes_another_key(monkeypatch):
    before = _key(_llama())
    original = modeling_llama.LlamaMLP.forward
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", lambda self, x: original(self, x) * 2)
    after = _key(_llama())
    assert after != before
    assert explain_miss(after, [before]) == "LlamaMLP.forward changed"


def test_a_function_patched_in_a_transformers_module_makes_another_key(monkeypatch):
    """What liger-kernel's patches do: replace a module-level function the forward looks up at every call."""
    before = _key(_llama())
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", lambda *a, **k: modeling_llama.apply_rotary_pos_emb)
    after = _key(_llama())
    assert after != before
    assert "apply_rotary_pos_emb changed" in explain_miss(after, [before])


def test_a_registered_attention_implementation_makes_another_key(monkeypatch):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = _key(_llama())
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", lambda *a, **k: None)
    assert _key(_llama()) != before


def test_checkpointed_decoder_layers_reuse_among_themselves_not_with_plain_ones():
    def checkpointed(seed: int) -> LlamaForCausalLM:
        model = _llama(seed)
        policy = CheckpointPolicy(classes=(modeling_llama.LlamaDecoderLayer,))
        checkpoint_modules_(model, select_checkpointed(model, policy))
        return model

    first = _key(checkpointed(0))
    assert _key(checkpointed(1)) == first
    assert _key(_llama()) != first
