"""Real training settings (precision, ZeRO-1, activation checkpointing, clipping, LR schedule,
dropout) with real DeepSpeed on CPU, each resumed from a mid-run checkpoint with another stage
count or data-parallel degree (`pswift run`: the same launcher as under Slurm), against the
uninterrupted run that wrote it. Stopped by a signal, through real Slurm: test_preemption.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import BF16, EXAMPLE, PSWIFT, copy_example, run_dist_child, run_events, step_losses

pytestmark = [pytest.mark.deepspeed]

#: the example's layers as plain modules (not LayerSpecs): DeepSpeed does not seed their
#: forward passes, so their dropout draws from each rank's own generator
PLAIN_LAYERS = '''
from model import Block, Embedding, Head


def build_layers(vocab, hidden, heads, blocks, seq_len, dropout=0.0):
    return [Embedding(vocab, hidden, seq_len), *[Block(hidden, heads, dropout) for _ in range(blocks)],
            Head(vocab, hidden)]
'''


def losses(run: Path) -> dict[int, float]:
    """Each step's loss as a number (layouts with another data-parallel degree sum in another order)."""
    return {step: float.fromhex(h) for step, h in step_losses(run).items()}


#: a map-style Dataset of the example's sequences (what `data = { dataset = ... }` reads)
DATASET = '''
from model import batch


class Sequences:
    def __init__(self, n):
        self.x, self.y = batch(step=0, index=0, micro_batch_size=n, seed=3)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
'''


def job(dst: Path, training: str, stages: int, data_parallel: int, ckpt: Path, steps: int = 8,
        kwargs: str = "", entry: str = "model:build_layers", data: str = "") -> Path:
    """The example on 2 to 4 nodes with ``training`` lines, a fixed layout and a checkpoint
    directory shared between the runs of one scenario."""
    toml = copy_example(dst, {"steps": str(steps), "checkpoint_interval": "0", "nodes": "[2, 4]",
                              "stages": str(stages), "data_parallel": str(data_parallel)})
    text = toml.read_text().replace("seed = 1\n", f'seed = 1\ncheckpoint_dir = "{ckpt}"\n{training}')
    text = text.replace("seq_len = 32 }", f"seq_len = 32{', ' + kwargs if kwargs else ''} }}")
    text = re.sub(r'(?m)^entry = .*$', f'entry = "{entry}"', text)
    if data:
        text = re.sub(r'(?m)^data = .*$', f'data = {data}', text)
        (dst / "sequences.py").write_text(DATASET)
    toml.write_text(text)
    if entry.startswith("plain:"):
        (dst / "plain.py").write_text(PLAIN_LAYERS)
    return toml


def run(toml: Path, run_dir: Path, nodes: int) -> str:
    """`pswift run` on ``nodes`` nodes, to its end."""
    p = subprocess.Popen([*PSWIFT, "run", "--nodes", str(nodes), "--run-dir", str(run_dir), str(toml)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-4000:]
    return out


def final_state(ckpt: Path, step: int) -> dict:
    """Every tensor of the checkpoint at ``step`` (each stage's file and ZeRO shards): model,
    fp32 master, optimizer."""
    from pipeswift_launch import ckptfiles as checkpoint
    state = checkpoint.read_all(ckpt / f"step_{step:08d}")
    out: dict = {f"model/{k}": v for k, v in state["model"].items()}
    out.update({f"master/{k}": v for k, v in state["master"].items()})
    out.update({f"optim/{k}/{key}": v for k, s in state["optim"].items() for key, v in s.items()})
    return out


def resumed_and_reference(tmp_path: Path, training: str, first: tuple[int, int], then: tuple[int, int],
                          nodes: tuple[int, int], **kw: str) -> tuple[Path, Path, str]:
    """(resumed run, uninterrupted run, resumed run's output): the reference runs 8 steps in
    layout ``first`` (stages, data-parallel) on nodes[0], checkpointing at step 4 (and 8); a run
    in ``then`` on nodes[1] resumes from a copy of step 4's checkpoint alone and runs steps 5-8.
    (That a signal's checkpoint mid-run is a checkpoint like this one is test_checkpoint_local's
    and test_preemption's; two runs, not three, keep CI within its budget.)"""
    ref = job(tmp_path / "r", training, *first, tmp_path / "ckpt-r", **kw)
    ref.write_text(ref.read_text().replace("checkpoint_interval = 0", "checkpoint_interval = 4"))
    run(ref, tmp_path / "reference", nodes[0])
    (tmp_path / "ckpt-b").mkdir()
    shutil.copytree(tmp_path / "ckpt-r" / "step_00000004", tmp_path / "ckpt-b" / "step_00000004")
    out = run(job(tmp_path / "b", training, *then, tmp_path / "ckpt-b", **kw), tmp_path / "resumed", nodes[1])
    (start,) = [e for e in run_events(tmp_path / "resumed") if e["event"] == "start"]
    assert start["resumed_from"] == str(tmp_path / "ckpt-b" / "step_00000004") and start["step"] == 4
    assert (start["stages"], start["data_parallel"]) == then
    return tmp_path / "resumed", tmp_path / "reference", out


def resumed_and_reference_losses(resumed: Path, ref: Path) -> tuple[dict[int, float], dict[int, float]]:
    """(the resumed run's losses, the reference's over the same steps): steps 5-8 each, else fails."""
    got, want = losses(resumed), losses(ref)
    assert sorted(got) == [5, 6, 7, 8] and sorted(want) == list(range(1, 9)), (got, want)
    return got, {s: want[s] for s in got}


@pytest.mark.parametrize("first,then,nodes", [((4, 1), (2, 1), (4, 2)), ((2, 2), (4, 1), (4, 4))],
                         ids=["4x1-to-2x1", "2x2-to-4x1"])
def test_fp32_zero1_resumes_in_another_layout_bitwise_with_the_same_data_parallel_degree(
        tmp_path, first, then, nodes):
    resumed, ref, _ = resumed_and_reference(tmp_path, "zero_stage = 1\n", first, then, nodes)
    got, want = resumed_and_reference_losses(resumed, ref)
    a, b = final_state(tmp_path / "ckpt-b", 8), final_state(tmp_path / "ckpt-r", 8)
    import torch
    assert a.keys() == b.keys() and any(k.startswith("master/") for k in a)
    if first[1] == then[1]:  # only the stage count changed: the same arithmetic, bit for bit
        assert got == want
        assert [k for k in a if not torch.equal(a[k], b[k])] == []
    else:  # 2 ranks' averaged gradients vs one rank's accumulated ones: another summation order
        assert all(abs(got[s] - want[s]) <= 1e-5 * abs(want[s]) for s in want), (got, want)
        assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4


@pytest.mark.parametrize("first,then,nodes", [((4, 1), (2, 1), (4, 2)), ((2, 2), (4, 1), (4, 4))],
                         ids=["4x1-to-2x1", "2x2-to-4x1"])
def test_bf16_zero1_with_recompute_resumes_in_another_layout(tmp_path, first, then, nodes):
    resumed, ref, _ = resumed_and_reference(tmp_path, BF16, first, then, nodes)
    got, want = resumed_and_reference_losses(resumed, ref)
    assert all(abs(got[s] - want[s]) <= 1e-2 * abs(want[s]) for s in want), (got, want)
    assert losses(ref)[8] < losses(ref)[1]
    import torch
    a, b = final_state(tmp_path / "ckpt-b", 8), final_state(tmp_path / "ckpt-r", 8)
    assert a.keys() == b.keys()
    assert all(v.dtype == torch.bfloat16 for k, v in a.items() if k.startswith("model/"))
    masters = [k for k in a if k.startswith("master/")]
    assert masters and all(a[k].dtype == torch.float32 for k in masters)
    worst = max(float((a[k] - b[k]).abs().max()) for k in masters)
    assert worst < 1e-2, worst


def test_a_bf16_zero1_background_checkpoint_resumes_bit_for_bit(tmp_path):
    """2 stages x 2 data-parallel, bf16 + ZeRO-1: the periodic checkpoint of step 4 is written in
    the background, each rank's shard copied at the step and written to its own file while
    training goes on. A job resumed from it ends at step 5 with exactly the state (bf16 weights,
    fp32 master, Adam moments) of the job that never stopped."""
    periodic = job(tmp_path / "a", BF16, 2, 2, tmp_path / "ckpt-a", steps=5)
    periodic.write_text(periodic.read_text().replace("checkpoint_interval = 0", "checkpoint_interval = 4"))
    run(periodic, tmp_path / "periodic", 4)
    (bg,) = [e for e in run_events(tmp_path / "periodic") if e["event"] == "checkpoint" and e["step"] == 4]
    assert bg["background"] is True and bg["copy_s"] > 0, bg
    man = json.loads((tmp_path / "ckpt-a" / "step_00000004" / "MANIFEST.json").read_text())
    assert sorted(man["files"]) == ["rng.json", "stage_000.safetensors", "stage_000.zero_000.safetensors",
                                    "stage_000.zero_001.safetensors", "stage_001.safetensors",
                                    "stage_001.zero_000.safetensors", "stage_001.zero_001.safetensors"]
    shutil.copytree(tmp_path / "ckpt-a", tmp_path / "ckpt-b")
    shutil.rmtree(tmp_path / "ckpt-b" / "step_00000005")
    run(job(tmp_path / "b", BF16, 2, 2, tmp_path / "ckpt-b", steps=5), tmp_path / "resumed", 4)
    (start,) = [e for e in run_events(tmp_path / "resumed") if e["event"] == "start"]
    assert start["resumed_from"] == str(tmp_path / "ckpt-b" / "step_00000004")
    a, b = final_state(tmp_path / "ckpt-a", 5), final_state(tmp_path / "ckpt-b", 5)
    import torch
    assert a.keys() == b.keys() and any(k.startswith("master/") for k in a) and any(k.startswith("optim/") for k in a)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_dropout_resumes_bitwise_with_half_the_stages(tmp_path):
    resumed, ref, out = resumed_and_reference(tmp_path, "", (4, 1), (2, 1), (4, 2), kwargs="dropout = 0.1")
    got, want = resumed_and_reference_losses(resumed, ref)
    assert got == want
    # dropout is on: the same job without it has other losses
    no_drop = tmp_path / "no-dropout"
    run(job(no_drop, "", 4, 1, no_drop / "ckpt", steps=2), no_drop / "run", 4)
    assert losses(no_drop / "run")[2] != losses(ref)[2]


def test_dropout_of_plain_modules_resumes_bitwise_from_each_ranks_generators(tmp_path):
    resumed, ref, out = resumed_and_reference(
        tmp_path, "", (2, 2), (2, 2), (4, 4), kwargs="dropout = 0.1", entry="plain:build_layers")
    got, want = resumed_and_reference_losses(resumed, ref)
    assert got == want
    man = json.loads(next((tmp_path / "ckpt-b").glob("step_*/MANIFEST.json")).read_text())
    assert "rng.json" in man["files"]


def test_a_map_style_dataset_resumes_at_its_position_in_another_layout(tmp_path):
    """20 sequences, 32 a step: every step reads across an epoch boundary; the resumed run
    reads exactly the samples the uninterrupted one does (bitwise losses)."""
    data = '{ dataset = "sequences:Sequences", kwargs = { n = 20 } }'
    resumed, ref, _ = resumed_and_reference(tmp_path, "", (4, 1), (2, 1), (4, 2), data=data)
    got, want = resumed_and_reference_losses(resumed, ref)
    assert got == want
    plan = json.loads((resumed / "plan.json").read_text())
    assert plan["training"]["data"] == {"dataset": "sequences:Sequences", "kwargs": {"n": 20}}


ACTIVATION_COUNT = r'''
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
import torch, torch.utils.checkpoint, deepspeed
from pipeswift_launch import ds_compat, dsconfig, pipe
calls = []
real = torch.utils.checkpoint.checkpoint
torch.utils.checkpoint.checkpoint = lambda *a, **kw: (calls.append(1), real(*a, **kw))[1]
ds_compat.skip_shm_build()
deepspeed.init_distributed(dist_backend="gloo")
interval = int(sys.argv[1])
plan = {"model": {"dir": sys.argv[2], "entry": "model:build_layers", "kwargs": {"blocks": 2}, "loss": None,
                  "num_layers": None},
        "training": {"seed": 1, "activation_checkpoint_interval": interval, "global_batch_size": 4,
                     "steps": 1, "precision": "fp32", "zero_stage": 0, "lr_warmup_steps": 0,
                     "lr_decay": "constant", "lr_min_ratio": 0.0, "optimizer": {}, "gradient_clipping": 0.0,
                     "ds_config": {}}}
layout = {"stages": 1, "boundaries": [0, 4], "partition": "uniform", "micro_batch_size": 2,
          "micro_batches": 2}
model = pipe.build_pipe(plan, layout)
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config=dsconfig.ds_config(plan, layout))
sys.path.insert(0, sys.argv[2])
from model import batch
engine.train_batch(data_iter=iter([batch(step=0, index=i, micro_batch_size=2, seed=1) for i in range(2)]))
print("checkpointed calls", len(calls))
'''


@pytest.mark.parametrize("interval,calls", [(0, 0), (1, 8), (2, 4)])
def test_activation_checkpoint_interval_recomputes_that_many_layers_at_a_time(tmp_path, interval, calls):
    proc = run_dist_child(ACTIVATION_COUNT, str(interval), str(EXAMPLE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 4 layers, 2 micro-batches: one checkpointed forward per chunk of `interval` layers
    assert f"checkpointed calls {calls}" in proc.stdout, proc.stdout[-500:]
