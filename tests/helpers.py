"""What the tests share besides fixtures (conftest.py holds those): the real CLI in a
subprocess, the example copied and edited, the dev cluster's defaults (scripts/dev-cluster.env,
read rather than repeated), squeue polling, a whole example plan and a run's events read through
pipeswift_slurm.events (the one reader of that contract)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-gpt"
CLUSTER = ROOT / "scripts" / "slurm-dev-cluster"
PSWIFT = [sys.executable, "-m", "pipeswift_slurm.cli.main"]


def pswift(*args: str, env: dict | None = None, timeout: float = 600, cwd: str | None = None,
           check: bool = False) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user would run it."""
    proc = subprocess.run([*PSWIFT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"pswift {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


#: a child's script runs inside this: a raise prints its traceback and exits 1, the end exits 0,
#: both through the launcher's exit_now (the group destroyed, no interpreter teardown)
_DIST_CHILD = """\
import sys, traceback
from pipeswift_launch.hardexit import exit_now
try:
    exec(compile(sys.argv.pop(1), "<child>", "exec"), {"__name__": "__main__"})
except SystemExit as e:
    exit_now(e.code if isinstance(e.code, int) else 1)
except BaseException:
    traceback.print_exc()
    exit_now(1)
exit_now(0)
"""


def run_dist_child(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -c code args...`` for a child that builds a process group or a DeepSpeed engine:
    it ends as every rank of a job does (pipeswift_launch.hardexit), so gloo's threads cannot
    abort it after its answer is printed (issue 43)."""
    return subprocess.run([sys.executable, "-c", _DIST_CHILD, code, *args], capture_output=True,
                          text=True, timeout=timeout)


def copy_example(dst: Path, replace: dict[str, str] | None = None) -> Path:
    """Copy the tiny-gpt example to ``dst``; rewrite ``key = ...`` lines (``section.key`` if ambiguous).
    The copy takes the fastest layout (``jct_slack = 0``) and [job] time as written
    (``time_policy = "as_written"``) unless ``replace`` says otherwise: the tests of node ranges,
    growth and preemption are about those, not about the cost-aware choice or predicted limits
    (their slowed data makes the prediction wrong on purpose), which tests/test_planner.py,
    tests/test_cost_choice.py and tests/test_limits.py test."""
    from pipeswift_slurm.starter import init
    init(dst, "tiny-gpt")     # what `pswift init` writes: the example as shipped
    toml = dst / "train.toml"
    text = toml.read_text()
    for key, value in {"jct_slack": "0", "time_policy": '"as_written"', **(replace or {})}.items():
        section, _, name = key.rpartition(".")
        start = text.index(f"[{section}]") if section else 0
        end = text.find("\n[", start + 1) if section else len(text)
        end = len(text) if end < 0 else end
        part, n = re.subn(rf"(?m)^{re.escape(name)}\s*=.*$", f"{name} = {value}", text[start:end])
        assert n == 1, f"key {key} not found once in the example"
        text = text[:start] + part + text[end:]
    toml.write_text(text)
    return toml


def dev_cluster_defaults() -> dict[str, str]:
    """scripts/dev-cluster.env's NAME=value lines: the dev clusters' folders and ports."""
    text = (ROOT / "scripts" / "dev-cluster.env").read_text()
    return dict(m.groups() for m in re.finditer(r"(?m)^([A-Z_0-9]+)=(\S*)$", text))


DEV = dev_cluster_defaults()


#: the cluster the tests run on: scripts/with-slurm's (PSWIFT_CLUSTER_DIR), else 22.05's default
CLUSTER_DIR = Path(os.environ.get("PSWIFT_CLUSTER_DIR") or DEV["PSWIFT_DEV_DIR"])
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


def run_events(run_dir: Path | str, torn_ok: bool = False) -> list[dict[str, Any]]:
    """The run's events as the schema reads them (pipeswift_slurm.events.read); every line must
    be valid unless ``torn_ok`` (a job still writing may have a torn last line)."""
    from pipeswift_slurm import events
    evs, skipped = events.read(run_dir)
    assert torn_ok or skipped == 0, f"{skipped} invalid line(s) in {run_dir}/events.jsonl"
    return evs
