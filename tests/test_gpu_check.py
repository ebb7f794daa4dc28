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


def _script():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_the_sync_audit_counts_each_sync_by_whose_code_made_it_and_when(tmp_path, monkeypatch):
    """The sitecustomize the sync audit gives the ranks: a synchronising call is counted at the
    innermost pswift or DeepSpeed frame, inside train_batch or between steps (under the training
    loop) or at setup; other warnings pass through. Frames named as the real files are made here
    (no GPU: torch's sync debug mode itself runs on gpu-check's machine)."""
    import json
    monkeypatch.setenv("PSWIFT_SYNC_AUDIT", str(tmp_path))
    audit: dict = {}
    meta_path = list(sys.meta_path)
    exec(compile(_script().SYNC_AUDIT, "sitecustomize.py", "exec"), audit)
    assert len(sys.meta_path) == len(meta_path) + 1     # it waits for deepspeed's import...
    sys.meta_path[:] = meta_path                        # ...which this test never makes
    code = {}
    for path, src in (("/x/deepspeed/runtime/pipe/engine.py", "def train_batch(f):\n    return f()\n"),
                      ("/x/pipeswift_launch/train.py", "def _train(f):\n    profiler = None\n    return f()\n"),
                      ("/x/pipeswift_launch/collectives.py", "def agree(f):\n    return f()\n")):
        exec(compile(src, path, "exec"), code)
    passed: list = []
    audit["_shown"] = lambda message, *rest: passed.append(message)   # what _turn_on keeps
    sync = lambda: audit["_showwarning"]("called a synchronizing CUDA operation", UserWarning, "f", 1)  # noqa: E731
    code["_train"](lambda: code["agree"](sync))
    code["_train"](lambda: code["agree"](sync))
    code["_train"](lambda: code["train_batch"](sync))
    code["agree"](sync)
    audit["_showwarning"]("something else", UserWarning, "f", 1)
    audit["_dump"]()
    (got,) = [json.loads(f.read_text()) for f in tmp_path.glob("sync.*.json")]
    assert got == {"between steps | pswift pipeswift_launch/collectives.py:2 agree": 2,
                   "in train_batch | deepspeed pipe/engine.py:2 train_batch": 1,
                   "setup or finish | pswift pipeswift_launch/collectives.py:2 agree": 1}, got
    assert passed == ["something else"]   # shown as before, not counted
