"""A login-node install cannot queue a job that would die on every rank (issue 25): the job's
interpreter is asked (find_spec, in a child unless it is this one; nothing imported) before anything is written or
queued, and the launcher itself, started where torch is missing, says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, copy_example
from pipeswift_slurm import preflight, submit
from pipeswift_slurm.errors import ConfigError


@pytest.fixture(scope="module")
def login_python(tmp_path_factory) -> str:
    """A venv with nothing installed: what `pip install pipeswift-slurm` on a login node lacks."""
    venv = tmp_path_factory.mktemp("login") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


def with_python(toml: Path, python: str) -> Path:
    toml.write_text(toml.read_text().replace("[job]\n", f'[job]\npython = "{python}"\n', 1))
    return toml


def test_the_training_interpreter_passes_and_a_login_only_one_is_named_with_the_fix(login_python, monkeypatch):
    assert preflight.problem(sys.executable) is None
    monkeypatch.setattr(preflight, "NEEDED", (*preflight.NEEDED, "no_such_module_x"))
    here = preflight.Check(sys.executable)
    assert here.proc is None       # this interpreter is asked in this process: no child started
    child = subprocess.run([sys.executable, "-c", preflight._ASK, *preflight.NEEDED],
                           capture_output=True, text=True, check=True).stdout.split()
    assert here.missing() == child == ["no_such_module_x"]   # what a child of it answers
    monkeypatch.undo()
    gone = preflight.missing(login_python)
    assert "torch" in gone and "deepspeed" in gone
    why = preflight.problem(login_python)
    assert f"({login_python}) cannot import" in why and "pip install 'pipeswift-slurm[train]'" in why
    assert "\n" not in why
    assert "cannot run it" in preflight.problem("/nonexistent/python3")


def test_prepare_refuses_before_writing_anything(login_python, tmp_path):
    toml = with_python(copy_example(tmp_path / "ex", {"steps": "4"}), login_python)
    with pytest.raises(ConfigError, match="cannot import .*torch"):
        submit.prepare(toml, tmp_path / "run", live=False)
    assert not (tmp_path / "run").exists()


def test_the_launcher_without_torch_is_one_line_and_not_retried(login_python, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1}))
    launches = tmp_path / "launch"
    launches.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'launch'}", "PSWIFT_LAUNCH_DIR": str(launches),
           "SLURM_PROCID": "1"}
    proc = subprocess.run([login_python, "-m", "pipeswift_launch", str(plan)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "cannot import" in proc.stderr and "[job] python" in proc.stderr
    # the batch script's helper follows a launch that ended itself: no restart of a missing torch
    assert json.loads((launches / "rank_1.json").read_text())["rc"] == 2
