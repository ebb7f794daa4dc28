"""A small GPT-style language model for pipeline training, and deterministic data it can learn.

Layers: token+position embedding, N transformer blocks, final norm + LM head, so the per-layer
costs really differ. Data: sequences of an affine recurrence x[t+1] = (a*x[t] + b) mod vocab with
per-sequence (a, b); after two tokens the rest is predictable, so the loss visibly falls.
Imported only inside the job (it needs torch and deepspeed).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from deepspeed.pipe import LayerSpec


class Embedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq_len, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(pos)[None]


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True, dropout=dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class SlowBlock(Block):
    """A Block doing its work ``repeat`` times (mean of identical results): ~``repeat`` x slower
    forward and backward, to show a stage cut from wrong costs being re-balanced."""

    def __init__(self, hidden: int, heads: int, dropout: float = 0.0, repeat: int = 3) -> None:
        super().__init__(hidden, heads, dropout)
        self.repeat = repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(super(SlowBlock, self).forward(x) for _ in range(self.repeat)) / self.repeat


class Head(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def build_layers(vocab: int = 96, hidden: int = 128, heads: int = 4, blocks: int = 4,
                 seq_len: int = 32, dropout: float = 0.0, slow_block: int = -1,
                 slow_factor: int = 3) -> list[LayerSpec]:
    """The pipeline's layers (LayerSpecs: each stage builds only its own); block ``slow_block``
    (0-based, -1: none) does its work ``slow_factor`` times."""
    def block(i: int) -> LayerSpec:
        if i == slow_block:
            return LayerSpec(SlowBlock, hidden, heads, dropout, slow_factor)
        return LayerSpec(Block, hidden, heads, dropout)
    return [LayerSpec(Embedding, vocab, hidden, seq_len), *[block(i) for i in range(blocks)],
            LayerSpec(Head, vocab, hidden)]


def batch(step: int, index: int, micro_batch_size: int, seed: int, vocab: int = 96,
          seq_len: int = 32, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``index`` of optimizer step ``step``: a pure function of its arguments."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + index)
    a = 1 + 2 * torch.randint(0, 4, (micro_batch_size, 1), generator=g)  # a in {1, 3, 5, 7}
    b = torch.randint(0, vocab, (micro_batch_size, 1), generator=g)
    x = torch.empty(micro_batch_size, seq_len + 1, dtype=torch.long)
    x[:, :1] = torch.randint(0, vocab, (micro_batch_size, 1), generator=g)
    for t in range(seq_len):
        x[:, t + 1:t + 2] = (a * x[:, t:t + 1] + b) % vocab
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()
