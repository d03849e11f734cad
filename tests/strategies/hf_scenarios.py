"""A Hugging Face ``LlamaForCausalLM`` (random init from a small config, no downloads, transformers' defaults, so
``use_cache=True``) under both strategies on rank processes, against one eager process on the global batch."""

from __future__ import annotations

from typing import Any

import torch

STEPS = 3
LR = 0.05
VOCAB = 48


def built() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    return LlamaForCausalLM(config)


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(100 * step + rank))


def reference(world: int) -> list[float]:
    model = built()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        loss = sum(model(batch(step, r), labels=batch(step, r), use_cache=False).loss for r in range(world)) / world
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def llama(rank: int, world: int, kind: str) -> dict[str, Any]:
    from tests.strategies.common import fabric

    launched = fabric(kind)
    model = built()
    use_cache_before = model.config.use_cache
    wrapped = launched.setup(model)
    opt = launched.setup_optimizers(torch.optim.SGD(wrapped.parameters(), lr=LR))
    losses = []
    for step in range(STEPS):
        x = batch(step, rank)
        loss = wrapped(x, labels=x).loss
        opt.zero_grad()
        launched.backward(loss)
        opt.step()
        losses.append(float(launched.all_reduce(loss.detach(), reduce_op="mean")))
    return {
        "losses": losses,
        "use_cache": (use_cache_before, model.config.use_cache),
        "decision": launched.strategy.decisions[-1].to_dict(),
        "decisions": [d.to_dict() for d in launched.strategy.decisions],
        "reference": reference(world) if rank == 0 else None,
    }


def both(rank: int, world: int) -> dict[str, Any]:
    return {kind: llama(rank, world, kind) for kind in ("fsdp", "ddp")}
