"""A small GPT-style language model for pipeline training, and deterministic data it can learn.

Layers: token+position embedding, N transformer blocks, final norm + LM head, so the per-layer
costs really differ. Data: sequences of an affine recurrence x[t+1] = (a*x[t] + b) mod vocab with
per-sequence (a, b); after two tokens the rest is predictable, so the loss visibly falls.
Imported only inside the job (it needs torch and deepspeed).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec


class Embedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq_len, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(pos)[None]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, its projections plain ``nn.Linear`` layers (as GPT-2's
    c_attn and c_proj): ZB-H1 defers their weight gradients (nn.MultiheadAttention's own weights
    are raw parameters it cannot split)."""

    def __init__(self, hidden: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}: change one of them")
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, h))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
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
