"""A model nobody here wrote: GPT-2 from Hugging Face Transformers, split into pipeline layers by
pipeswift_launch/gpt2.py, trained on the token-file dataset (examples/gpt2)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gpt2"

pytestmark = [pytest.mark.deepspeed]


def small_config(**kw):
    from transformers import GPT2Config
    return GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, **kw)


def test_the_pipeline_layers_compute_what_transformers_gpt2_computes():
    """Same weights in Transformers' own GPT2LMHeadModel: the same logits, so the split keeps the
    causal mask, the tied head and every block as GPT-2 has them."""
    import torch
    from transformers import GPT2LMHeadModel

    from pipeswift_launch.gpt2 import _lm_head, pipeline_layers
    config = small_config()
    specs = pipeline_layers(config)
    assert len(specs) == config.n_layer + 4
    assert specs[0].key == specs[-1].key == "wte"   # one weight: embedding and LM head
    torch.manual_seed(0)
    layers = [s.build() for s in specs]
    ref = GPT2LMHeadModel(config).eval()
    state = {"transformer.wte.weight": layers[0].weight, "transformer.wpe.weight": layers[1].wpe.weight,
             "lm_head.weight": layers[0].weight,
             **{f"transformer.ln_f.{k}": v for k, v in layers[-2].ln_f.state_dict().items()}}
    for i in range(config.n_layer):
        state.update({f"transformer.h.{i}.{k}": v for k, v in layers[2 + i].block.state_dict().items()})
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and all("attn.bias" in k or "masked_bias" in k for k in missing), missing
    tokens = torch.randint(0, config.vocab_size, (2, 12))
    x = tokens
    for layer in layers[:-1]:
        x = layer.eval()(x)
    logits = _lm_head(layers[0], x)   # DeepSpeed gives both tied layers one module
    torch.testing.assert_close(logits, ref(tokens).logits, rtol=1e-5, atol=1e-5)
    # causal: changing the last token changes no earlier position's logits
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % config.vocab_size
    assert torch.equal(ref(changed).logits[:, :-1], ref(tokens).logits[:, :-1])


def test_token_file_sampling_is_a_pure_function_of_seed_step_and_index(tmp_path):
    import numpy as np

    from pipeswift_launch.data import TokenFile
    path = tmp_path / "t.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    f = TokenFile(str(path), "uint16", 8)
    x, y = f(step=3, index=1, micro_batch_size=4, seed=7)
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype
    assert bool((y[:, :-1] == x[:, 1:]).all()) and bool((y[:, -1] == x[:, -1] + 1).all())
    again = TokenFile(str(path), "uint16", 8)(step=3, index=1, micro_batch_size=4, seed=7)
    assert all(bool((a == b).all()) for a, b in zip((x, y), again))
    other = f(step=3, index=2, micro_batch_size=4, seed=7)
    assert not bool((other[0] == x).all())


def test_a_map_style_dataset_is_read_once_per_epoch_in_a_seeded_order():
    import torch

    from pipeswift_launch.data import MapDataset
    items = [(torch.tensor([i]), torch.tensor([i])) for i in range(12)]
    ds = MapDataset(items, global_batch_size=4)
    # 3 steps x 2 micro-batches of 2: one epoch, every item once
    seen = [int(v) for step in range(3) for index in range(2)
            for v in ds(step=step, index=index, micro_batch_size=2, seed=5)[0].flatten()]
    assert sorted(seen) == list(range(12)) and seen != list(range(12))
    # the split into micro-batches does not change a step's samples
    whole = ds(step=1, index=0, micro_batch_size=4, seed=5)[0].flatten().tolist()
    assert whole == seen[4:8]
    assert ds(step=3, index=0, micro_batch_size=4, seed=5)[0].flatten().tolist() != seen[:4]  # epoch 2


@pytest.fixture
def gpt2_job(tmp_path: Path) -> Path:
    """The example with 24 short steps (sleeping data, so a preemption lands mid-run)."""
    dst = tmp_path / "gpt2"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__", "tokens.bin"))
    subprocess.run([sys.executable, str(dst / "make_tokens.py"), str(dst / "tokens.bin"),
                    "--min-tokens", "200000"], check=True, capture_output=True)
    toml = dst / "train.toml"
    text = toml.read_text()
    for old, new in (("steps = 200", "steps = 24"),
                     # the data sleeps: the predicted limit would be wrong on purpose (tests/test_limits.py)
                     ('time = "0:30:00"', 'time = "0:30:00"\ntime_policy = "as_written"'), ("checkpoint_interval = 50", "checkpoint_interval = 0"),
                     ("seq_len = 64", "seq_len = 32"), ("global_batch_size = 16", "global_batch_size = 8"),
                     ("micro_batch_size = 4", "micro_batch_size = 2"), ("lr_warmup_steps = 20", "lr_warmup_steps = 4")):
        assert old in text, old
        text = text.replace(old, new)
    toml.write_text(text)
    return toml


@pytest.mark.slurm
def test_gpt2_trains_through_pswift_sbatch_and_survives_a_preemption_with_fewer_stages(cluster, gpt2_job, tmp_path):
    from helpers import preempted_once, run_events
    run = tmp_path / "run"
    st = preempted_once(gpt2_job, run, 6, timeout=600)
    a0, a1 = st["attempts"]
    assert (a0["nodes"], a0["ended"], a1["nodes"], a1["ended"]) == (4, "preempted", 2, "completed")
    assert a0["stages"] > a1["stages"] and a1["start_step"] == a0["end_step"]
    loss = {e["step"]: e["loss"] for e in run_events(run, torn_ok=True) if e["event"] == "step"}
    assert sorted(loss) == list(range(1, 25))
    assert sum(loss[s] for s in range(20, 25)) < 0.85 * sum(loss[s] for s in range(1, 6)), loss
