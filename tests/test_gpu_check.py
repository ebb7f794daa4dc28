"""make gpu-check (issue 38, item 7): what only a GPU machine can check. Here, where there is no
CUDA device, it says so in one line and exits 0; the configurations it runs on a GPU machine are
valid train.toml files (checked by the config's own rules)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from helpers import ROOT
from pipeswift_slurm.config import load_config

SCRIPT = ROOT / "scripts" / "gpu-check"


def test_without_a_gpu_it_says_so_and_exits_0():
    import torch
    if torch.cuda.is_available():   # pragma: no cover - a GPU machine runs the real thing
        return
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1, proc.stdout + proc.stderr
    assert "no CUDA device on this machine" in proc.stdout


def test_the_configurations_it_runs_are_valid(tmp_path):
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    cfg = load_config(mod.example(tmp_path / "a", 2, precision='"fp16"', zero_stage="1", data_parallel="2",
                                  stages="1"))
    r, t = cfg.resources, cfg.training
    assert (r.device, r.gpus_per_node, r.tasks_per_node, r.nodes_spec) == ("cuda", 2, 2, "1")
    assert (t.precision, t.zero_stage, cfg.pipeline.stages) == ("fp16", 1, 1)
    two = load_config(mod.example(tmp_path / "b", 2, stages="2", data_parallel="1", checkpoint_interval="0"))
    assert (two.pipeline.stages, two.training.checkpoint_interval) == (2, 0)
