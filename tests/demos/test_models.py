"""The demo models: built from a seed on any rank, the same numbers everywhere, GPT-shaped outputs."""

from __future__ import annotations

import torch

from thunderviz.demos.models import TinyGPT, make_batch


def test_make_batch_is_next_token_targets_and_depends_only_on_the_seed() -> None:
    x, y = make_batch(batch=3, block_size=8, vocab_size=16, seed=5)
    assert x.shape == y.shape == (3, 8) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    again, _ = make_batch(batch=3, block_size=8, vocab_size=16, seed=5)
    other, _ = make_batch(batch=3, block_size=8, vocab_size=16, seed=6)
    assert torch.equal(x, again) and not torch.equal(x, other)
    assert int(x.max()) < 16 and int(x.min()) >= 0


def test_tinygpt_gives_logits_per_position_and_can_tie_its_head() -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=32, block_size=8, d_model=16, n_layer=2, n_head=2)
    x, _ = make_batch(batch=2, block_size=8, vocab_size=32)
    assert model(x).shape == (2, 8, 32)
    assert model(x[:, :5]).shape == (2, 5, 32)  # shorter than block_size works
    tied = TinyGPT(vocab_size=32, block_size=8, d_model=16, n_layer=1, n_head=2, tie_weights=True)
    assert tied.lm_head.weight is tied.wte.weight
    assert len(list(tied.parameters())) == len(list(TinyGPT(32, 8, 16, 1, 2).parameters())) - 1
