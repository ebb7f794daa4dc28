"""Shared fixtures. Tests marked `slurm` use the real local dev cluster (scripts/slurm-dev-cluster),
started here if it is not running; tests marked `deepspeed` train for real on CPU."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-gpt"
CLUSTER = ROOT / "scripts" / "slurm-dev-cluster"
PSWIFT = [sys.executable, "-m", "pipeswift_slurm.cli"]


def pswift(*args: str, env: dict | None = None, timeout: float = 600, cwd: str | None = None,
           check: bool = False) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user would run it."""
    proc = subprocess.run([*PSWIFT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"pswift {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def copy_example(dst: Path, replace: dict[str, str] | None = None) -> Path:
    """Copy the tiny-gpt example to ``dst``; rewrite ``key = ...`` lines (``section.key`` if ambiguous)."""
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    toml = dst / "train.toml"
    text = toml.read_text()
    for key, value in (replace or {}).items():
        section, _, name = key.rpartition(".")
        start = text.index(f"[{section}]") if section else 0
        end = text.find("\n[", start + 1) if section else len(text)
        end = len(text) if end < 0 else end
        part, n = re.subn(rf"(?m)^{re.escape(name)}\s*=.*$", f"{name} = {value}", text[start:end])
        assert n == 1, f"key {key} not found once in the example"
        text = text[:start] + part + text[end:]
    toml.write_text(text)
    return toml


@pytest.fixture
def example(tmp_path: Path) -> Path:
    return copy_example(tmp_path / "tiny-gpt", {"steps": "12", "checkpoint_interval": "0"})


@pytest.fixture(autouse=True)
def _pswift_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PSWIFT_HOME", str(tmp_path_factory.mktemp("pswift-home")))


FAST_TIER = os.environ.get("PSWIFT_TEST_TIER") == "fast"
CLUSTER_FIXTURES = {"cluster", "acct_cluster"}


def pytest_collection_modifyitems(config, items):
    """A test that asks for a dev cluster is a Slurm test, marked or not (so `-m "not slurm"`,
    the fast tier, never selects it)."""
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)


def _refuse_in_fast_tier(what: str) -> None:
    if FAST_TIER:
        pytest.fail(f"the fast tier (make test-fast) starts no Slurm daemon, but this test asked for {what}: "
                    "mark it `slurm`", pytrace=False)


@pytest.fixture(scope="session")
def cluster() -> str:
    """SLURM_CONF of the running dev cluster (started if needed)."""
    _refuse_in_fast_tier("the dev cluster")
    proc = subprocess.run([str(CLUSTER), "start"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PSWIFT_PYTHON": sys.executable})
    if proc.returncode != 0:
        pytest.fail(f"dev cluster did not start: {proc.stdout}\n{proc.stderr}")
    conf = proc.stdout.strip().rsplit("SLURM_CONF=", 1)[-1]
    os.environ["SLURM_CONF"] = conf
    return conf


@pytest.fixture(scope="session")
def acct_cluster() -> Iterator[str]:
    """SLURM_CONF of a second dev cluster of the same Slurm version beside the main one, with real
    accounting (MariaDB + slurmdbd) and QOS preemption (standby preempted by normal); stopped at
    the end of the session. Tests point SLURM_CONF at it with monkeypatch."""
    _refuse_in_fast_tier("the accounting dev cluster")
    base = int(os.environ.get("PSWIFT_CLUSTER_CTLD_PORT", "6917"))
    env = {**os.environ, "PSWIFT_PYTHON": sys.executable, "PSWIFT_CLUSTER_PLUGINS": "0",
           "PSWIFT_CLUSTER_DIR": f"{CLUSTER_DIR}-acct", "PSWIFT_CLUSTER_NAME": "pswiftacct",
           "PSWIFT_CLUSTER_CTLD_PORT": str(base + 20),
           "PSWIFT_CLUSTER_BASEPORT": str(int(os.environ.get("PSWIFT_CLUSTER_BASEPORT", "17100")) + 50),
           "PSWIFT_CLUSTER_ACCOUNTING": "1", "PSWIFT_CLUSTER_PREEMPT": "qos",
           "PSWIFT_CLUSTER_MAX_BATCH_REQUEUE": "5",   # Slurm's default (24.05+ only)
           # finished jobs leave the controller within ~90 s (MinJobAge + its 60 s purge pass):
           # `pswift status` of a forgotten job is tested here, against slurmdbd
           "PSWIFT_CLUSTER_MIN_JOB_AGE": "30"}
    proc = subprocess.run([str(CLUSTER), "start"], capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        pytest.fail(f"accounting dev cluster did not start: {proc.stdout}\n{proc.stderr}")
    yield proc.stdout.strip().rsplit("SLURM_CONF=", 1)[-1]
    subprocess.run([str(CLUSTER), "stop"], capture_output=True, text=True, timeout=300, env=env)


CLUSTER_DIR = Path(os.environ.get("PSWIFT_CLUSTER_DIR", "/tmp/pswift-dev-cluster"))
CLUSTER_DB = CLUSTER_DIR / "history.db"      # where the installed jobcomp plugin merges
CLUSTER_SPOOL = CLUSTER_DIR / "jobcomp-spool"


def squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True)
    return set(out.stdout.split())


def new_jobs_since(before: set[str]) -> set[str]:
    """Jobs in squeue now that were not in ``before`` (one taken with squeue_ids()). Jobs of
    earlier tests may leave the list in between (MinJobAge), so compare the new ones only."""
    return squeue_ids() - before


def wait_state(job_id: str, states: set[str], timeout: float = 180) -> str:
    deadline = time.time() + timeout
    state = ""
    while time.time() < deadline:
        state = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
                               capture_output=True, text=True).stdout.strip()
        if state in states:
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {state!r} after {timeout} s, wanted {states}")


@functools.lru_cache(maxsize=1)
def _example_plan() -> str:
    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.plan import build_plan
    return json.dumps(build_plan(load_config(EXAMPLE / "train.toml"), Path("/nonexistent/run")))


def plan_with(training: dict | None = None, **top) -> dict:
    """A whole plan.json (the example's, as `pswift sbatch` writes it) with ``top`` keys replaced
    and ``training`` merged: what unit tests of the launcher's decisions start from, since the
    launcher reads plan data without defaults (plan.runnable checks it has every key)."""
    base = json.loads(_example_plan())
    return {**base, **top, "training": {**base["training"], **(training or {})}}
