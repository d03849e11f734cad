"""Small models that the demo, the notebooks, the tests and the benchmarks build locally.

No weights or data are downloaded: every model here is defined in a few lines and initialised from a seed, so a
rank process, a test and a benchmark can all build the same one and compare numbers.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLPBlock", "ResidualMLP", "TinyGPT", "make_batch"]


class _Block(nn.Module):
    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn_qkv = nn.Linear(d_model, 3 * d_model)
        self.attn_proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp_fc = nn.Linear(d_model, 4 * d_model)
        self.mlp_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.attn_qkv(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(torch.nn.functional.gelu(self.mlp_fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    """A GPT-shaped decoder for CPU ranks: token and position embeddings, pre-norm blocks, an optionally tied head.

    The defaults (4 blocks, d=128) are the size the design numbers were measured on: 868 forward / 1,451 backward
    bound symbols under thunder FSDP on 2 ranks.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 64,
        d_model: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        tie_weights: bool = False,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class MLPBlock(nn.Module):
    """LayerNorm, Linear, GELU, Linear, with a residual connection: the repeated block of the MLP towers."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, hidden)
        self.proj = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


class ResidualMLP(nn.Module):
    """A residual tower of LayerNorm/Linear/GELU/Linear blocks between an input and an output projection: repeated
    blocks without attention, cheap to trace (the memory tests rehearse it whole and cut to fewer blocks)."""

    def __init__(self, d_in: int = 16, d_model: int = 32, hidden: int = 64, n_layer: int = 4, d_out: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, d_model)
        self.blocks = nn.ModuleList(MLPBlock(d_model, hidden) for _ in range(n_layer))
        self.out = nn.Linear(d_model, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def make_batch(
    batch: int = 8, block_size: int = 64, vocab_size: int = 256, seed: int = 0, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets, the same on every rank for a given seed."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab_size, (batch, block_size + 1), generator=g)
    return idx[:, :-1].to(device), idx[:, 1:].to(device)
