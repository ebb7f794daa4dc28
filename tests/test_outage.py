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
from test_preemption import slow_example

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
        if not (CLUSTER_DIR / "run" / "slurmctld.pid").exists() or subprocess.run(
                ["scontrol", "ping"], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["slurmctld", "-f", os.environ["SLURM_CONF"]], timeout=60)
    assert waiting.returncode == 0, out[-3000:] + err[-3000:]
    assert f"job {job}: Slurm unreachable" in out and f"job {job}: COMPLETED" in out, out[-3000:]
    assert "FAILED" not in out and "Traceback" not in err
    assert _steps(run) == 400
    assert [e["reason"] for e in run_events(run) if e["event"] == "end"] == ["completed"]
