"""Rendered batch scripts: golden files, sorted quoted #SBATCH lines, hostile names stay inert.

Regenerate goldens after an intended change: PSWIFT_UPDATE_GOLDEN=1 pytest tests/test_render.py
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import copy_example
from pipeswift_slurm import __version__
from pipeswift_slurm.config import load_config
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.planning.build import time_limits
from pipeswift_slurm.planning.build import options_for
from pipeswift_slurm.slurm.sbatch import SbatchOptions, render

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    text = text.replace(f"pipeswift-slurm {__version__}", "pipeswift-slurm VERSION")
    if os.environ.get("PSWIFT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; rerun with PSWIFT_UPDATE_GOLDEN=1 if intended"


def test_golden_example(tmp_path):
    cfg = load_config(copy_example(tmp_path / "ex"))
    limits = time_limits(cfg)   # no prediction: [job] time as written
    assert limits.signal_lead_s == 70  # 10 s checkpoint estimate (no memory hints) + 60 s Slurm slack
    check_golden("tiny-gpt.sbatch", render(options_for(cfg, "/runs/tiny", limits), "/runs/tiny", "/venv/bin/python"))


def test_signal_lead_is_capped_by_the_time_limit(tmp_path):
    def lead(cfg):
        return time_limits(cfg).signal_lead_s
    assert lead(load_config(copy_example(tmp_path / "a", {"time": '"2:00"'}))) == 60
    assert lead(load_config(copy_example(tmp_path / "b", {"time": '"0:30"'}))) == 15
    big = copy_example(tmp_path / "c", {"time": '"4:00:00"'})
    big.write_text(big.read_text().replace("num_layers = 6", "layer_memory = [2000000000, 0, 0, 0, 0, 0]"))
    assert lead(load_config(big)) == 92  # 2 + 3 x 2 GB / 200 MB/s + 60


def test_golden_all_fields(tmp_path):
    opts = SbatchOptions(job_name="big job's run", nodes="2-4", ntasks_per_node=4, cpus_per_task=8,
                         output="/scratch/my runs/x/slurm-%j.out", partition="gpu", time="1-00:00:00",
                         account="proj$(id)", qos="standby", gpus_per_node=4, signal="USR2@180",
                         extra=("--qos=high", "--comment=a b"))
    check_golden("all-fields.sbatch", render(opts, "/scratch/my runs/x", "/opt/py env/bin/python"))


def test_directives_sorted_and_quoted():
    opts = SbatchOptions(job_name="x", nodes="1", ntasks_per_node=1, cpus_per_task=1, output="o")
    keys = [line.split()[1].lstrip("'").split("=")[0] for line in opts.directives()]
    assert keys == sorted(keys)
    assert "#SBATCH --requeue" in opts.directives() and "#SBATCH --open-mode=append" in opts.directives()


HOSTILE = ["a b", "it's", 'say "hi"', "$(touch PWNED)", "`touch PWNED`", "x; touch PWNED", "$HOME"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_and_paths_stay_inert(tmp_path, name):
    run = tmp_path / f"run {name}"
    opts = SbatchOptions(job_name=name, nodes="1", ntasks_per_node=1, cpus_per_task=1,
                         output=f"{run}/slurm-%j.out", extra=(f"--comment={name}",))
    script = render(opts, str(run), f"{tmp_path}/py {name}/python")
    # bash parses it, and running it up to srun executes nothing hostile
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "srun").write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$SRUN_ARGS\"\n")
    (stub / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "SRUN_ARGS": str(tmp_path / "args"),
           "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1"}
    subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True)
    assert not list(tmp_path.rglob("PWNED"))
    args = (tmp_path / "args").read_text().splitlines()
    assert args[-4:] == [f"{tmp_path}/py {name}/python", "-m", "pipeswift_launch", f"{run}/plan.json"]


def test_newline_cannot_reach_a_directive():
    opts = SbatchOptions(job_name="a\n#SBATCH --x", nodes="1", ntasks_per_node=1, cpus_per_task=1, output="o")
    with pytest.raises(ConfigError, match="newline"):
        opts.directives()


def test_job_qos_from_the_toml(tmp_path):
    toml = copy_example(tmp_path / "ex")
    toml.write_text(toml.read_text().replace("[job]\n", '[job]\nqos = "standby"\n', 1))
    cfg = load_config(toml)
    assert cfg.job.qos == "standby"
    assert "#SBATCH --qos=standby" in options_for(cfg, "/r", time_limits(cfg)).directives()
