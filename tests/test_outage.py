"""A controller outage is not a job failure (issue 38, item 3): slurmctld stopped for 60 s while
a job runs and `pswift sbatch --wait` follows it. The job goes on and completes, `--wait` exits
0, and `pswift status` during the outage says Slurm is unreachable, shows the job's step from
its events and exits with a code of its own (69), not 1. Slurm's commands are tried again
(pipeswift_slurm/slurm/outage.py) for as long as $PSWIFT_SLURM_OUTAGE_S allows."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import CLUSTER_DIR, PSWIFT, pswift, run_events
from test_preemption import all_idle, slow_example

pytestmark = [pytest.mark.slurm, pytest.mark.every_version, pytest.mark.deepspeed]


def _ctld_pid() -> int:
    return int((CLUSTER_DIR / "run" / "slurmctld.pid").read_text())


def _steps(run: Path) -> int:
    return max([e["step"] for e in run_events(run, torn_ok=True) if e["event"] == "step"], default=0)


def test_a_job_and_its_wait_ride_out_sixty_seconds_without_slurmctld(cluster, tmp_path):
    toml = slow_example(tmp_path / "ex", {"steps": "400", "checkpoint_interval": "50"})
    run = tmp_path / "run"
    waiting = subprocess.Popen([*PSWIFT, "sbatch", "--wait", "--run-dir", str(run), str(toml)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and _steps(run) < 10:
            time.sleep(1)
        assert _steps(run) >= 10, "the job did not start training"
        job = (run / "JOB_ID").read_text().strip()
        os.kill(_ctld_pid(), signal.SIGTERM)                 # slurmctld down (its state saved)
        time.sleep(3)
        during = pswift("status", job, env={"PSWIFT_SLURM_OUTAGE_S": "2"}, timeout=120)
        assert during.returncode == 69, (during.stdout, during.stderr)
        assert "Slurm unreachable" in during.stderr and "the last one events knew" in during.stderr
        assert re.search(rf"job {job}: RUNNING \(from its events\)", during.stdout), during.stdout
        assert re.search(r"step \d+/400", during.stdout), during.stdout
        as_json = pswift("status", job, "--json", env={"PSWIFT_SLURM_OUTAGE_S": "0"}, timeout=120)
        assert as_json.returncode == 69 and json.loads(as_json.stdout)["slurm_unreachable"]
        step_at_stop = _steps(run)
        time.sleep(57)
        assert _steps(run) > step_at_stop, "training stopped while slurmctld was down"
        subprocess.run(["slurmctld", "-f", os.environ["SLURM_CONF"]], check=True, timeout=60)
        out, err = waiting.communicate(timeout=600)
    finally:
        if waiting.poll() is None:
            waiting.kill()
        if subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["slurmctld", "-f", os.environ["SLURM_CONF"]], timeout=60)
        if (run / "JOB_ID").exists():   # never leave the job holding the nodes the next tests need
            subprocess.run(["scancel", (run / "JOB_ID").read_text().strip()], capture_output=True)
    assert waiting.returncode == 0, out[-3000:] + err[-3000:]
    assert f"job {job}: Slurm unreachable" in out and f"job {job}: COMPLETED" in out, out[-3000:]
    assert "FAILED" not in out and "Traceback" not in err
    assert _steps(run) == 400
    assert [e["reason"] for e in run_events(run) if e["event"] == "end"] == ["completed"]


def test_a_preempted_job_is_requeued_through_sixty_seconds_without_slurmctld(cluster, tmp_path):
    """Preempted (a 2-node job in the high partition; the job holds all 4 nodes), the job checkpoints and asks for its
    requeue while slurmctld is down: the requeue waits for the controller (the launcher's
    Slurm calls outlast it), and the job comes back and COMPLETES with every step run once."""
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": "60", "checkpoint_interval": "0"})
    run = tmp_path / "run"
    all_idle(120)   # the job must hold all 4 nodes, so that the high job preempts it (not an earlier test's)
    job = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), check=True).stdout.strip()
    high = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and _steps(run) < 10:
            time.sleep(0.5)
        assert _steps(run) >= 10, "the job did not start training"
        high = subprocess.run(["sbatch", "--parsable", "-p", "high", "-N2", "--exclusive", "-o", "/dev/null",
                               "--wrap", "sleep 20"], capture_output=True, text=True, check=True).stdout.strip()
        while time.monotonic() < deadline and not any(
                e["event"] == "checkpoint" and e["reason"] == "signal" for e in run_events(run, torn_ok=True)):
            time.sleep(0.2)
        assert any(e["event"] == "checkpoint" and e["reason"] == "signal" for e in run_events(run, torn_ok=True)), \
            "the job was not preempted: " + subprocess.run(["squeue"], capture_output=True, text=True).stdout
        os.kill(_ctld_pid(), signal.SIGTERM)                 # down while the job asks to be requeued
        time.sleep(60)
        subprocess.run(["slurmctld", "-f", os.environ["SLURM_CONF"]], check=True, timeout=60)
        from helpers import wait_state
        state = wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=400)
    finally:
        if subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["slurmctld", "-f", os.environ["SLURM_CONF"]], timeout=60)
        subprocess.run(["scancel", job, *([high] if high else [])], capture_output=True)
    assert state == "COMPLETED", "".join(p.read_text() for p in run.glob("slurm-*.out"))[-4000:]
    steps = [e["step"] for e in run_events(run) if e["event"] == "step"]
    assert sorted(set(steps)) == list(range(1, 61))
    ends = [e["reason"] for e in run_events(run) if e["event"] == "end"]
    assert ends[0] == "preempted" and ends[-1] == "completed", ends
