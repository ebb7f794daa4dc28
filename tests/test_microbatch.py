"""The micro-batch size as a free variable (issue 12, item 4): `micro_batch_size = "auto"` or a
list; the planner weighs (micro-batch size, m) pairs under the memory cap, with the activation
memory of the tensors each layer saves for its backward (measured by the launcher)."""

from __future__ import annotations

import json

import pytest

from helpers import copy_example, pswift, run_events
from pipeswift_slurm.planning import layouts
from pipeswift_slurm.config import load_config
from pipeswift_slurm.planning.costmodel import Hardware, Profile, stage_activations
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.planning.planner import plan


def cfg_with(tmp_path, mbs: str, **more: str):
    return load_config(copy_example(tmp_path / "ex", {"micro_batch_size": mbs, **more}))


def test_a_list_or_auto_gives_the_planner_sizes_and_a_reference_for_layer_costs(tmp_path):
    t = cfg_with(tmp_path / "a", "[8, 4, 16]").training
    assert t.micro_batch_options == (8, 4, 16) and t.micro_batch_size == 8
    t = cfg_with(tmp_path / "b", '"auto"').training      # global batch 32
    assert t.micro_batch_options == (1, 2, 4, 8, 16, 32) and t.micro_batch_size == 1
    assert cfg_with(tmp_path / "c", "8").training.micro_batch_options == (8,)


@pytest.mark.parametrize("mbs, message", [
    ("[3, 8]", r"micro_batch_size \[3\] do not divide global_batch_size = 32"),
    ("[]", r"micro_batch_size list has 0 sizes"),
    ('"large"', r"micro_batch_size must be an integer"),
])
def test_bad_sizes_are_one_clear_line(tmp_path, mbs, message):
    with pytest.raises(ConfigError, match=message):
        cfg_with(tmp_path, mbs)


def test_the_rule_picks_the_largest_size_with_m_at_least_twice_the_stages(tmp_path):
    cfg = cfg_with(tmp_path, '"auto"')
    assert layouts.rule_micro_batch_size(cfg, 2, 1) == 8          # m = 4 >= 2 x 2
    assert layouts.rule_micro_batch_size(cfg, 4, 1) == 4          # m = 8
    assert layouts.rule_micro_batch_size(cfg, 32, 1) == 1         # none deep enough: the smallest
    lay = layouts.layout_for(cfg, 2)
    assert (lay.micro_batch_size, lay.micro_batches) == (8, 4)


def weigh(tmp_path, overhead_s: float, memory: float = 16e9, saved: tuple | None = None):
    cfg = cfg_with(tmp_path, '"auto"', nodes="4", data_parallel="1", steps="100")
    costs = tuple(c / 8 for c in cfg.model.layer_costs)          # per sample: the reference size is 1
    prof = Profile(costs, (1_000_000,) * 6, (16_384,) * 6, 1, "toml", overhead_s=overhead_s,
                   saved_bytes=saved)
    return plan(cfg, prof, Hardware(device_memory=memory), None)


def test_per_micro_batch_overheads_favour_larger_micro_batches_and_none_favours_smaller(tmp_path):
    """The seed's m sweep: small micro-batches shrink the bubble, each micro-batch costs a fixed
    overhead; the planner weighs both for every size."""
    free = weigh(tmp_path / "free", overhead_s=0.0)
    costly = weigh(tmp_path / "costly", overhead_s=0.05)
    sizes = {c.micro_batch_size for c in free.candidates if c.rejected is None}
    assert sizes == {1, 2, 4, 8, 16, 32}
    assert free.chosen.micro_batch_size < costly.chosen.micro_batch_size
    assert free.chosen.micro_batches * free.chosen.micro_batch_size == 32


def test_the_saved_tensors_cap_large_micro_batches_under_device_memory(tmp_path):
    """With measured saved bytes 100x a layer's output, big micro-batches no longer fit: they
    are rejected with the stage's memory, and a smaller size is chosen."""
    roomy = weigh(tmp_path / "roomy", overhead_s=0.05)
    tight = weigh(tmp_path / "tight", overhead_s=0.05, memory=60e6, saved=(1_638_400,) * 6)
    big = roomy.chosen.micro_batch_size
    rejected = [c for c in tight.candidates if c.micro_batch_size == big and c.rejected]
    assert rejected and "needs" in rejected[0].rejected and "device memory 0.06 GB" in rejected[0].rejected
    assert tight.chosen.micro_batch_size < big


def test_stage_activations_use_saved_bytes_and_recompute_keeps_one_chunk():
    prof = Profile((1.0,) * 4, None, (10,) * 4, 2, "history", saved_bytes=(100, 200, 300, 400))
    assert stage_activations(prof, 0, 4, 2, in_flight=3) == 3 * 1000            # scale 1
    assert stage_activations(prof, 1, 3, 4, in_flight=1) == 2 * 500             # scale 2
    rec = prof._replace(recompute_interval=2)
    # chunk inputs kept for 3 micro-batches (layer 1's output: 10) + the largest chunk's saves
    assert stage_activations(rec, 0, 4, 2, in_flight=3) == 3 * (0 + 10) + 700
    old = prof._replace(saved_bytes=None)
    assert stage_activations(old, 0, 4, 2, in_flight=3) == 3 * 10 * 4           # outputs only


@pytest.mark.deepspeed
def test_auto_micro_batches_run_and_the_profile_measures_saved_tensors(tmp_path):
    """A real run with micro_batch_size = "auto": the layout's size is the rule's, the data
    function gets it, and the profile's saved bytes exceed each block's output."""
    toml = copy_example(tmp_path / "ex", {"micro_batch_size": '"auto"', "steps": "6"})
    run = tmp_path / "run"
    proc = pswift("run", "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr[-2000:]
    evs = run_events(run)
    start = next(e for e in evs if e["event"] == "start")
    assert start["micro_batch_size"] * start["micro_batches"] == 32
    prof = next(e for e in evs if e["event"] == "layer_profile")
    saved, out = prof["saved_bytes"], prof["activation_bytes"]
    assert set(saved) == {str(i) for i in range(6)}
    assert all(saved[b] > 2 * out[b] for b in ("1", "2", "3", "4"))   # attention + MLP keep much more
    d = json.loads(pswift("plan", str(toml), "--no-live", "--json", check=True).stdout)
    assert d["profile_source"] == "history"
    assert all(c["stage_memory"] for c in d["candidates"] if c["rejected"] is None)
