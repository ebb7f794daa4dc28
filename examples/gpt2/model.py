"""GPT-2 from Hugging Face Transformers (random init, no download), as pipeline layers.

The split into layers is pswift's adapter (pipeswift_launch/gpt2.py); this file only says which
GPT-2. Imported only inside the job (it needs torch, deepspeed and transformers).
"""

from __future__ import annotations


def build_layers(n_layer: int = 6, n_embd: int = 128, n_head: int = 4, vocab_size: int = 256,
                 n_positions: int = 128, dropout: float = 0.0) -> list:
    from transformers import GPT2Config

    from pipeswift_launch.gpt2 import pipeline_layers
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size,
                        n_positions=n_positions, resid_pdrop=dropout, embd_pdrop=dropout,
                        attn_pdrop=dropout, bos_token_id=None, eos_token_id=None)
    return pipeline_layers(config)
