"""sbatch's habits (issue 42, items 1-3): -p/-t/-N/-A/-q/-J before the TOML override its keys
through the TOML's own checks, `--dry-run > job.sh; sbatch job.sh` submits, `cancel A B` cancels
both, `--timeout` without `--wait` says so, and `--wait`'s lines carry a time."""

from __future__ import annotations

import getpass
import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import copy_example, pswift, wait_state
from pipeswift_slurm import submit
from pipeswift_slurm.history import rundir


def test_dry_run_prints_a_batch_script_on_stdout_and_the_plan_on_stderr(tmp_path):
    toml = copy_example(tmp_path / "ex")
    proc = pswift("sbatch", "--dry-run", "-p", "high", "-t", "5", "-N", "1-2", "-J", "sweep", str(toml))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n# Rendered by pipeswift-slurm ")
    for line in ("#SBATCH --partition=high\n", "#SBATCH --time=5\n", "#SBATCH --job-name=sweep\n"):
        assert line in proc.stdout
    assert re.search(r"#SBATCH --nodes=\d-\d\n", proc.stdout)
    assert "# plan: " in proc.stderr and "# plan: " not in proc.stdout
    assert ('# from the command line: [job] partition = "high", [job] time = "5", [job] time_policy = "as_written", '
            '[job] name = "sweep", [resources] nodes = [1, 2]') in proc.stderr


def test_plan_takes_the_same_overrides_as_sbatch(tmp_path):
    """Issue 59: `plan` took none of -p/-t/-N; it takes sbatch's, says them, and plans with them."""
    toml = copy_example(tmp_path / "ex")
    proc = pswift("plan", "--no-live", "-t", "30", "-N", "1-2", "-J", "sweep", str(toml))
    assert proc.returncode == 0, proc.stderr
    assert ('# from the command line: [job] time = "30", [job] time_policy = "as_written", [job] name = "sweep", '
            '[resources] nodes = [1, 2]') in proc.stderr
    assert "--time=30 (minutes)" in proc.stdout
    as_json = json.loads(pswift("plan", "--no-live", "-N", "1", "--json", str(toml), check=True).stdout)
    assert {c["nodes"] for c in as_json["candidates"]} == {1}


def test_an_explicit_time_is_the_limit_asked_unless_the_policy_says_predicted(tmp_path):
    """Issue 59: `-t 30` quietly became `--time=3` (the planner's prediction within it). An
    explicit -t is asked as sbatch takes it; --time-policy predicted asks the prediction, and
    the plan says which and why."""
    toml = copy_example(tmp_path / "ex")
    asked = pswift("sbatch", "--dry-run", "-t", "30", str(toml))
    assert asked.returncode == 0 and "#SBATCH --time=30\n" in asked.stdout, asked.stderr
    assert "[job] time as written (30.0 min)" in asked.stderr
    predicted = pswift("sbatch", "--dry-run", "-t", "30", "--time-policy", "predicted", str(toml))
    limit = int(re.search(r"#SBATCH --time=(\d+)\n", predicted.stdout).group(1))
    assert limit < 30 and "predicted: " in predicted.stderr and "within [job] time 30.0 min" in predicted.stderr


@pytest.mark.parametrize("args,says", [
    (("-N", "two"), "-N two: give a node count or MIN-MAX"),
    (("-N", "3-1"), "[resources] nodes"),
    (("-t", "soon"), '[job] time = \'soon\' is not a Slurm time limit'),
    (("--timeout", "5"), "--timeout bounds --wait: add --wait"),
])
def test_a_bad_command_line_value_is_one_line_exit_2(tmp_path, args, says):
    toml = copy_example(tmp_path / "ex")
    proc = pswift("sbatch", "--dry-run", *args, str(toml))
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len([x for x in proc.stderr.splitlines() if not x.startswith("warning:")]) == 1
    assert proc.stdout == ""
    if says.startswith("["):   # a TOML check: it says the value came from the command line
        assert "from the command line" in proc.stderr


def test_the_old_spelling_after_the_double_dash_points_to_the_new_one(tmp_path):
    proc = pswift("sbatch", "--dry-run", str(copy_example(tmp_path / "ex")), "--", "-p", "high")
    assert proc.returncode == 2
    assert "give --partition before the TOML" in proc.stderr and "[job] partition" in proc.stderr


def test_jobs_lists_my_registered_jobs_newest_first_even_without_slurm(tmp_path):
    for job_id, steps in (("7", "30"), ("12", "50")):
        p = submit.prepare(copy_example(tmp_path / f"ex{job_id}", {"steps": steps}), tmp_path / f"run{job_id}",
                           live=False, learn=False)
        submit.write_run_dir(p)
        rundir.register_job(job_id, p.run_dir)
    proc = pswift("jobs", "--json", env={"SLURM_CONF": "/nonexistent/slurm.conf"})
    assert proc.returncode == 0 and "warning: Slurm not asked" in proc.stderr, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["job_id"], r["name"], r["steps"], r["state"]) for r in rows] == [
        ("12", "tiny-gpt", 50, "UNKNOWN"), ("7", "tiny-gpt", 30, "UNKNOWN")]
    assert rows[0]["run_dir"] == str(tmp_path / "run12")
    assert pswift("jobs", "-L", "1", "-P", "-o", "job_id,steps", env={"SLURM_CONF": "/nonexistent/slurm.conf"},
                  check=True).stdout.splitlines()[1:] == ["12|50"]


@pytest.mark.slurm
@pytest.mark.every_version
def test_overrides_reach_slurm_a_dry_run_script_submits_and_cancel_takes_several_jobs(cluster, tmp_path):
    started = pswift("init", str(tmp_path / "ex"), check=True)   # item 1: the site's default partition, asked
    assert started.stderr == ""
    toml = tmp_path / "ex" / "train.toml"
    text = toml.read_text()
    assert re.search(r'(?m)^partition = "low" +# written by pswift init', text), text[:400]
    toml.write_text(text.replace('time_policy = "predicted"', 'time_policy = "as_written"')   # as copy_example
                    .replace("jct_slack = 0.05", "jct_slack = 0"))
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "-p", "high", "-t", "5", "-N", "1-2", "--run-dir", str(run), str(toml),
                  "--", "--hold")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.strip()
    assert "overrode: [job] partition" in (run / "train.toml").read_text()
    script = tmp_path / "job.sh"
    script.write_text(pswift("sbatch", "--dry-run", "-t", "7", str(toml), check=True).stdout)
    second = subprocess.run(["sbatch", "--parsable", "--hold", str(script)], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.strip().split(";")[0]
    try:
        show = subprocess.run(["scontrol", "show", "job", first], capture_output=True, text=True).stdout
        assert "Partition=high" in show and "TimeLimit=00:05:00" in show and "NumNodes=1-2" in show, show
        show = subprocess.run(["scontrol", "show", "job", second_id], capture_output=True, text=True).stdout
        assert "TimeLimit=00:07:00" in show, show
        mine = json.loads(pswift("jobs", "--json", check=True).stdout)
        assert mine[0]["job_id"] == first and mine[0]["state"] == "PENDING" and mine[0]["run_dir"] == str(run)
        # an admin's view (squeue -u, -a): the pswift job (its working directory is its run
        # directory), not the script submitted by hand from elsewhere
        me = getpass.getuser()
        everyone = [j for j in json.loads(pswift("jobs", "-a", "--json", check=True).stdout)
                    if j["job_id"] in (first, second_id)]
        assert [(j["job_id"], j["user"], j["state"], j["run_dir"], j["steps"]) for j in everyone] == [
            (first, me, "PENDING", str(run), 40)], everyone
        assert [j["job_id"] for j in json.loads(pswift("jobs", "-u", me, "--json", check=True).stdout)
                if j["job_id"] in (first, second_id)] == [first]
        assert json.loads(pswift("jobs", "-u", "nobody", "--json", check=True).stdout) == []
        both = pswift("jobs", "-u", me, "-a")
        assert both.returncode == 2 and both.stderr.count("\n") == 1
        out = pswift("cancel", first, second_id, check=True).stdout
        assert out.splitlines() == [f"cancelled job {first} (run directory {run})", f"cancelled job {second_id}"]
        states = subprocess.run(["squeue", "-h", "-t", "all", "-j", f"{first},{second_id}", "-o", "%T"],
                                capture_output=True, text=True).stdout.split()
        assert states == ["CANCELLED", "CANCELLED"], states
    finally:
        subprocess.run(["scancel", first, second_id])


@pytest.mark.slurm
@pytest.mark.every_version
def test_a_dry_run_script_runs_to_completed_and_status_logs_and_history_know_it(cluster, tmp_path):
    """Issue 59, item 1: `--dry-run > job.sh; sbatch job.sh` pointed at a run directory and a
    plan.json nothing wrote. The script carries them and makes the run directory at the job's
    first start; options after `--` are its #SBATCH lines; status, logs and the history know it."""
    toml = copy_example(tmp_path / "ex", {"steps": "6", "checkpoint_interval": "0"})
    dry = pswift("sbatch", "--dry-run", str(toml), "--", "--comment=from-dry-run", check=True)
    script = tmp_path / "job.sh"
    script.write_text(dry.stdout)
    assert "#SBATCH --comment=from-dry-run\n" in dry.stdout and "--output=" not in dry.stdout
    run = re.search(r"^RUN_DIR=(\S+)$", dry.stdout, re.M).group(1)
    assert not Path(run).exists()                                 # a dry run writes nothing
    sub = subprocess.run(["sbatch", "--parsable", "--dependency=singleton", str(script)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    try:
        assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=240) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    status = pswift("status", job, check=True).stdout
    assert f"job {job}: COMPLETED" in status and "step 6/6" in status and run in status, status
    assert (Path(run) / "JOB_ID").read_text().strip() == job
    assert "step 6" in pswift("logs", job, check=True).stdout or "6/6" in pswift("logs", job, check=True).stdout
    # the Python job object, attached by id after the fact (issue 59, item 8)
    from pipeswift_slurm import api
    got = api.Job.attach(job).result()
    assert got.step == 6 and got.loss is not None and got.run_dir == Path(run) and got.checkpoint is not None
    assert f"last loss {got.loss:.6f}" in status
    db = tmp_path / "h.db"
    pswift("history", "ingest", "--db", str(db), check=True)
    show = pswift("history", "show", job, "--db", str(db), check=True).stdout
    assert f"job {job}" in show and "tiny-gpt" in show, show
