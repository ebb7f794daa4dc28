"""Issue 59, item 2: without a Slurm that answers, pswift says so in a few words. Every `plan`
and `--dry-run` repeated a 330-character warning of scontrol's errors; `doctor` said "ok ...
controller found through DNS" just above the line that said the DNS lookup failed. Here no
SLURM_CONF and no DNS SRV record: configless Slurm finds no controller."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from helpers import copy_example

NO_CONF = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}


def test_plan_without_slurm_warns_in_one_short_line(tmp_path):
    toml = copy_example(tmp_path / "ex")
    proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli.main", "plan", str(toml)], env=NO_CONF,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "no live cluster state" in line]
    # configless Slurm's own conclusion where its client tools are installed, else their absence
    why = "Could not establish a configuration source" if shutil.which("scontrol") else "command not found"
    assert len(warning) <= 160 and why in warning, warning


def test_doctor_never_says_ok_and_failed_for_one_check(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli.main", "doctor"], env=NO_CONF,
                          capture_output=True, text=True, timeout=120)
    conf = [line for line in proc.stdout.splitlines() if "Slurm configuration" in line]
    assert conf and conf[0].startswith("BAD") and "found no controller through DNS" in conf[0], proc.stdout
    assert "ok  Slurm configuration" not in proc.stdout


def _finished_run(tmp_path):
    """A run directory of a job that completed (its events, its log, its JOB_ID)."""
    import json
    from helpers import GOOD, PLAN
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(PLAN))
    (run / "JOB_ID").write_text("4242\n")
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in GOOD))
    (run / "slurm-4242.out").write_text("step 1\nstep 2\npswift: attempt 0 ended: completed at step 2\n")
    return run


def test_status_and_logs_f_of_a_finished_run_answer_from_its_events_without_slurm(tmp_path):
    """Issue 59, item 2: with no Slurm configured, `status RUN_DIR` of a finished run exited 1
    with scontrol's fatal text, and `logs -f` the same. Both answer from the run's events, say
    in one line that Slurm was not asked, and exit 0."""
    run = _finished_run(tmp_path)
    env = {**NO_CONF, "PSWIFT_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-m", "pipeswift_slurm.cli.main"]
    status = subprocess.run([*cli, "status", str(run)], env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "job 4242: COMPLETED (from its events)" in status.stdout and "step 2/3" in status.stdout
    assert status.stderr.count("\n") == 1 and "Slurm not asked" in status.stderr, status.stderr
    logs = subprocess.run([*cli, "logs", "-f", str(run)], env=env, capture_output=True, text=True, timeout=60)
    assert logs.returncode == 0 and "ended: completed" in logs.stdout, logs.stderr
    assert logs.stderr.count("\n") == 1 and "the job's end is its events'" in logs.stderr, logs.stderr
