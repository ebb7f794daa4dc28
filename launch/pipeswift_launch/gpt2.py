"""Hugging Face Transformers' GPT-2 as pipeline layers (code pswift did not write).

:func:`pipeline_layers` turns a ``GPT2Config`` into the list a ``[model] entry`` returns:

    token embedding (tied) | position embedding + dropout | GPT2Block x n_layer | final LayerNorm | LM head (tied)

The token embedding and the LM head share one weight through DeepSpeed's ``TiedLayerSpec``
(the first and last stage each hold a copy; DeepSpeed adds their gradients), as GPT-2 ties them.
Each block is Transformers' own ``GPT2Block`` given an explicit causal mask, so it behaves the
same whatever attention implementation the config selects. Random initialisation, no download.

What any model needs to train under pswift (the same recipe wraps your own):

1. a flat list of layers, each taking one tensor (or tuple) and returning the next; build them
   as ``LayerSpec(cls, *args)`` so each stage builds only its own layers and the initial weights
   do not depend on the stage count;
2. parameters shared between layers go through ``TiedLayerSpec(key, ...)``;
3. the last layer returns logits; ``[model] loss`` (default: cross-entropy over the last
   dimension) turns them and the labels into the loss;
4. ``[model] num_layers`` says how many layers the list has.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, TiedLayerSpec


def transformers() -> Any:
    """Hugging Face Transformers, imported when a GPT-2 layer or export first needs it."""
    import transformers.models.gpt2.modeling_gpt2   # optional: only the gpt2 example needs it (binds transformers)
    return transformers


class Positions(nn.Module):
    """Adds the position embedding to the token embeddings, then dropout (GPT-2's embd_pdrop)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        _init(self, config.initializer_range)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        return self.drop(x + self.wpe(pos)[None].to(x.dtype))


class Block(nn.Module):
    """Transformers' GPT2Block with a causal mask of its own; returns the hidden states only."""

    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        self.block = transformers().models.gpt2.modeling_gpt2.GPT2Block(config, layer_idx=index)
        _init(self, config.initializer_range)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        mask = torch.zeros(t, t, dtype=x.dtype, device=x.device).masked_fill(future, torch.finfo(x.dtype).min)
        out = self.block(x, attention_mask=mask[None, None])
        return out[0] if isinstance(out, tuple) else out   # a tuple before Transformers 5


class FinalNorm(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_f(x)


def _lm_head(embedding: nn.Embedding, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, embedding.weight)


def _init(module: nn.Module, std: float) -> nn.Module:
    """GPT-2's initialisation (normal(0, initializer_range), zero biases, unit LayerNorms)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)) or type(m).__name__ == "Conv1D":
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return module


class TokenEmbedding(nn.Embedding):
    def __init__(self, config: Any) -> None:
        super().__init__(config.vocab_size, config.n_embd)
        _init(self, config.initializer_range)


def pipeline_layers(config: Any) -> list[LayerSpec]:
    """GPT-2 of ``config`` (a transformers.GPT2Config) as n_layer + 4 pipeline layers."""
    if getattr(config, "add_cross_attention", False):
        raise ValueError("GPT-2 with cross-attention cannot be a pipeline of single-input layers")
    return [TiedLayerSpec("wte", TokenEmbedding, config, tied_weight_attr="weight"),
            LayerSpec(Positions, config),
            *[LayerSpec(Block, config, i) for i in range(config.n_layer)],
            LayerSpec(FinalNorm, config),
            TiedLayerSpec("wte", TokenEmbedding, config, forward_fn=_lm_head, tied_weight_attr="weight")]


def transformers_state(specs: list[Any], state: dict[str, torch.Tensor]) -> tuple[Any, dict[str, torch.Tensor]]:
    """The GPT2Config of :func:`pipeline_layers`' ``specs`` and ``state`` (the unpipelined
    model's, pipeswift_launch.export) in GPT2LMHeadModel's names: the tied token embedding is
    ``transformer.wte`` (the LM head ties to it), the positions ``transformer.wpe``, block i
    ``transformer.h.i``, the final norm ``transformer.ln_f``."""
    config = specs[0].module_args[0]
    n = config.n_layer
    out: dict[str, torch.Tensor] = {"transformer.wte.weight": state["0.weight"],
                                    "transformer.wpe.weight": state["1.wpe.weight"]}
    for i in range(n):
        prefix = f"{2 + i}.block."
        out.update({f"transformer.h.{i}.{k[len(prefix):]}": v for k, v in state.items() if k.startswith(prefix)})
    out.update({f"transformer.ln_f.{k.rsplit('.', 1)[1]}": v for k, v in state.items()
                if k.startswith(f"{2 + n}.ln_f.")})
    return config, out


def is_pipeline_of(specs: list[Any]) -> bool:
    """Whether ``specs`` are :func:`pipeline_layers`' (GPT-2 through this adapter)."""
    return bool(specs) and getattr(specs[0], "typename", None) is TokenEmbedding and \
        getattr(specs[-1], "typename", None) is TokenEmbedding
