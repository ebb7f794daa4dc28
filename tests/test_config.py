"""train.toml validation: every bad input is exit 2 and one line naming the key, numbers and fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from click.testing import CliRunner

from helpers import EXAMPLE, copy_example
from pipeswift_slurm.cli.main import cli
from pipeswift_slurm.config import load_config
from pipeswift_slurm.slurm.timespec import slurm_time_seconds

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def base() -> dict:
    return tomllib.loads((EXAMPLE / "train.toml").read_text())


def dry_run(tmp_path: Path, doc: dict | str) -> tuple[int, str, str]:
    d = tmp_path / "cfg"
    if not d.exists():
        copy_example(d)
    p = d / "train.toml"
    p.write_text(doc if isinstance(doc, str) else tomli_w.dumps(doc))
    r = CliRunner().invoke(cli, ["sbatch", "--dry-run", str(p)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.stdout, r.stderr


def mutate(path: tuple[str, ...], value=None, delete: bool = False) -> dict:
    doc = base()
    t = doc
    for k in path[:-1]:
        t = t.setdefault(k, {})
    if delete:
        del t[path[-1]]
    else:
        t[path[-1]] = value
    return doc


def training(**keys) -> dict:
    doc = base()
    doc["training"].update(keys)
    return doc


BAD = [
    (mutate(("job", "nmae"), "x"), ["unknown key [job] nmae", "valid keys: name,"]),
    (mutate(("training", "stepz"), 3), ["unknown key [training] stepz (did you mean 'steps'?)", "steps"]),
    (mutate(("training", "step"), 3), ["unknown key [training] step (did you mean 'steps'?)"]),
    (mutate(("optimiser",), {"lr": 1}), ["unknown section [optimiser]", "valid sections"]),
    (mutate(("training", "steps"), "40"), ["[training] steps must be an integer", "'40'"]),
    (mutate(("training", "steps"), 0), ["[training] steps = 0 must be >= 1"]),
    (mutate(("training", "steps"), True), ["[training] steps must be an integer", "boolean"]),
    (mutate(("job", "name"), delete=True), ["missing required key [job] name"]),
    (mutate(("model",), delete=True), ["missing section [model]"]),
    (mutate(("resources", "nodes"), [3, 1]), ["nodes = [3, 1]", "min > max"]),
    (mutate(("resources", "nodes"), [1, 2, 3]), ["[min, max] pair"]),
    (mutate(("resources", "device"), "tpu"), ["device = 'tpu'", "'cpu' or 'cuda'"]),
    (mutate(("job", "time"), "soon"), ["[job] time = 'soon'", "H:MM:SS"]),
    (mutate(("job", "name"), "a\nb"), ["control character", "[job] name"]),
    (mutate(("model", "entry"), "model.build_layers"), ["'module:function'"]),
    (mutate(("model", "entry"), "nosuchmodule_xyz:f"), ["module 'nosuchmodule_xyz' not found"]),
    # pp x dp = world size: 2 nodes x 1 task = 2 slots
    (mutate(("pipeline", "stages"), 3), ["pp x dp must equal the world size", "stages 3",
                                         "2 task slots", "with data_parallel = 1 use stages = 2"]),
    # stages > layers
    (mutate(("pipeline", "stages"), 7), ["stages = 7 > 6 layers", "use stages <= 6"]),
    # micro x m x dp = global batch: 8 x 3 x 1 != 32
    (mutate(("pipeline", "micro_batches"), 3), ["micro_batch_size 8 x micro_batches 3 x data_parallel 1 = 24",
                                                "!= global_batch_size 32", "set micro_batches = 4"]),
    (mutate(("training", "global_batch_size"), 30), ["global_batch_size = 30 is not a multiple of",
                                                     "micro_batch_size = 8"]),
    (mutate(("pipeline", "partition"), [0, 2, 4]), ["partition ends at 4", "has 6 layers"]),
    (mutate(("pipeline", "partition"), [0, 4, 2, 6]), ["strictly increase"]),
    (mutate(("pipeline", "partition"), "zigzag"), ["partition = 'zigzag'"]),
    (mutate(("model", "layer_costs"), [1.0, 2.0]), ["layer counts disagree", "num_layers gives 6",
                                                     "layer_costs gives 2"]),
    ("[job\nname=1", ["invalid TOML"]),
    (mutate(("job", "sbatch_options"), "--qos=high"), ["sbatch_options must be an array"]),
    (mutate(("job", "sbatch_options"), ["qos=high"]), ["must be an sbatch option starting with '-'"]),
    # real training settings: what DeepSpeed or the checkpoint cannot do is refused at plan time
    (mutate(("training", "precision"), "fp16"), ['precision = "fp16" needs zero_stage = 1']),
    (training(precision="fp16", zero_stage=1),
     ['precision = "fp16" needs a GPU', "DeepSpeed refuses fp16 on cpu", 'use precision = "bf16"']),
    (mutate(("training", "precision"), "bfloat16"), ["precision = 'bfloat16' must be one of 'fp32', 'bf16', 'fp16'"]),
    (mutate(("training", "zero_stage"), 2), ["zero_stage = 2 must be 0 or 1"]),
    (mutate(("training", "zero_stage"), True), ["zero_stage = True must be 0 or 1"]),
    (mutate(("training", "lr_decay"), "linear"), ["lr_decay = 'linear' must be 'constant' or 'cosine'"]),
    (mutate(("training", "lr_min_ratio"), 2), ["lr_min_ratio = 2 must be <= 1"]),
    (mutate(("training", "activation_checkpoint_interval"), -1), ["activation_checkpoint_interval = -1 must be >= 0"]),
    (mutate(("training", "ds_config"), {"bf16": {"enabled": True}}),
     ["ds_config.bf16 is set by pswift", 'use [training] precision = "bf16" instead']),
    (mutate(("training", "ds_config"), {"zero_optimization": {"stage": 1}}),
     ["ds_config.zero_optimization is set by pswift", "use [training] zero_stage instead"]),
    (mutate(("training", "ds_config"), {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}),
     ["ds_config.zero_optimization is set by pswift"]),
    (mutate(("training", "ds_config"), {"scheduler": {"type": "WarmupLR"}}), ["use [training] lr_warmup_steps"]),
    (mutate(("training", "data"), {"tokens": "nope.bin", "seq_len": 8}),
     ["[training] data.tokens = 'nope.bin': no such file", "write your token ids there as a flat uint16 array"]),
    (mutate(("training", "data"), {"tokens": "model.py", "seq_len": 8, "dtype": "int8"}),
     ["dtype = 'int8' must be 'uint16' or 'uint32'"]),
    (mutate(("training", "data"), {"tokens": "model.py"}), ["missing required key [training.data] seq_len"]),
    (mutate(("training", "data"), {"path": "x"}), ["data table needs tokens = 'path'", "dataset = 'module:function'"]),
    (mutate(("training", "data"), {"dataset": "nosuchmod_q:build"}), ["module 'nosuchmod_q' not found"]),
    (mutate(("training", "data"), 3), ["[training] data must be 'module:function' or a table"]),
    (mutate(("training", "ds_config"), {"sparse_attention": {}}),
     ["ds_config.sparse_attention: pswift cannot checkpoint and reshape", "it passes on only steps_per_print"]),
]


@pytest.mark.parametrize("doc,needles", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_toml_is_exit_2_one_line(tmp_path, doc, needles):
    code, out, err = dry_run(tmp_path, doc)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err + out
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    assert out == ""  # nothing rendered, nothing submitted


def test_missing_file_is_one_clear_line(tmp_path):
    r = CliRunner().invoke(cli, ["sbatch", "--dry-run", str(tmp_path / "nope.toml")])
    assert r.exit_code == 2
    assert "no such file" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bad_toml_through_the_real_cli(tmp_path):
    """The installed entry point, in a subprocess: one line on stderr, exit 2, no traceback."""
    p = copy_example(tmp_path / "x", {"steps": '"many"'})
    proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli.entry", "sbatch", str(p)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"Error: {p.resolve()}: [training] steps must be an integer, got string 'many'"


def test_paths_resolve_relative_to_the_toml(tmp_path, monkeypatch):
    p = copy_example(tmp_path / "x")
    p.write_text(p.read_text().replace("seed = 1", 'seed = 1\ncheckpoint_dir = "ck"'))
    monkeypatch.chdir("/")
    cfg = load_config(p)
    assert cfg.training.checkpoint_dir == (tmp_path / "x" / "ck").resolve()
    assert cfg.base_dir == (tmp_path / "x").resolve()


@pytest.mark.parametrize("text,seconds", [("30", 1800), ("1:30", 90), ("2:00:00", 7200),
                                          ("1-0", 86400), ("1-2:03", 93780), ("0-0:0:5", 5)])
def test_slurm_time(text, seconds):
    assert slurm_time_seconds(text) == seconds


def test_valid_example_loads():
    cfg = load_config(EXAMPLE / "train.toml")
    assert cfg.job.name == "tiny-gpt"
    assert cfg.layer_count == 6
    assert cfg.resources.nodes_spec == "2"


def test_every_training_setting_reaches_deepspeeds_config(tmp_path):
    """train.toml's settings, through plan.json, into the config DeepSpeed is given."""
    import json
    doc = base()
    doc["training"].update(precision="bf16", zero_stage=1, activation_checkpoint_interval=2,
                           gradient_clipping=0.5, lr_warmup_steps=5, lr_decay="cosine", lr_min_ratio=0.1,
                           ds_config={"wall_clock_breakdown": True})
    code, out, err = dry_run(tmp_path, doc)
    assert code == 0, err
    from pipeswift_slurm import submit
    plan = json.loads(json.dumps(submit.prepare(tmp_path / "cfg" / "train.toml", live=False).plan))
    from pipeswift_launch.dsconfig import ds_config
    cfg = ds_config(plan, plan["layouts"]["2"])
    assert cfg["bf16"] == {"enabled": True} and cfg["zero_optimization"] == {"stage": 1}
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["gradient_clipping"] == 0.5
    assert cfg["scheduler"] == {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 40, "warmup_num_steps": 5, "warmup_min_ratio": 0.0, "warmup_type": "linear",
        "cos_min_ratio": 0.1}}
    assert cfg["wall_clock_breakdown"] is True
    assert plan["training"]["activation_checkpoint_interval"] == 2
    # the job gives its stage's size: ZeRO's gradient bucket no larger than it (DeepSpeed's 5e8 else)
    assert ds_config(plan, plan["layouts"]["2"], 1234)["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 1234}
    assert ds_config(plan, plan["layouts"]["2"], 10 ** 10)["zero_optimization"]["reduce_bucket_size"] == 500_000_000


@pytest.mark.parametrize("size,needle", [(7, "has 7 bytes, not a whole number of uint16 tokens"),
                                         (8, "holds 4 tokens, fewer than seq_len + 2 = 10")])
def test_a_token_file_that_cannot_feed_the_model_is_refused_at_plan_time(tmp_path, size, needle):
    copy_example(tmp_path / "cfg")
    (tmp_path / "cfg" / "t.bin").write_bytes(b"\0" * size)
    code, out, err = dry_run(tmp_path, mutate(("training", "data"), {"tokens": "t.bin", "seq_len": 8}))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
