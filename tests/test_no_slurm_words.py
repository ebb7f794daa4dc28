"""Issue 59, item 2: without a Slurm that answers, pswift says so in a few words. Every `plan`
and `--dry-run` repeated a 330-character warning of scontrol's errors; `doctor` said "ok ...
controller found through DNS" just above the line that said the DNS lookup failed. Here no
SLURM_CONF and no DNS SRV record: configless Slurm finds no controller."""

from __future__ import annotations

import os
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
    assert len(warning) <= 160 and "Could not establish a configuration source" in warning, warning


def test_doctor_never_says_ok_and_failed_for_one_check(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli.main", "doctor"], env=NO_CONF,
                          capture_output=True, text=True, timeout=120)
    conf = [line for line in proc.stdout.splitlines() if "Slurm configuration" in line]
    assert conf and conf[0].startswith("BAD") and "found no controller through DNS" in conf[0], proc.stdout
    assert "ok  Slurm configuration" not in proc.stdout
