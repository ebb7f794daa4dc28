"""The walking skeleton through the real local Slurm cluster and real DeepSpeed on CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import copy_example, new_jobs_since, pswift, run_events, squeue_ids, step_losses

pytestmark = [pytest.mark.slurm, pytest.mark.every_version]


@pytest.mark.deepspeed
def test_sbatch_trains_two_stages_on_two_nodes_and_pswift_run_matches(cluster, example, tmp_path):
    run = tmp_path / "run"
    proc = pswift("sbatch", "--wait", "--run-dir", str(run), str(example))
    assert proc.returncode == 0, proc.stdout + proc.stderr + (run / "plan.json").read_text()
    job_id = (run / "JOB_ID").read_text().strip()
    assert f"Submitted pswift job {job_id}" in proc.stdout
    start = [e for e in run_events(run) if e["event"] == "start"]
    assert len(start) == 1 and start[0]["nodes"] == 2 and start[0]["stages"] == 2
    assert start[0]["job_id"] == job_id
    # what the launch measured at its start: node1 and node2 are one machine here, so its two
    # ranks share it; the link between the two stages crossed Slurm's two nodes
    assert (start[0]["device"], start[0]["ranks_per_host"], start[0]["host_cores"]) == ("cpu", 2, os.cpu_count())
    assert start[0]["p2p_latency_s"] > 0 and start[0]["p2p_bandwidth"] > 1e6, start[0]
    steps = [e for e in run_events(run) if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 13))
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.3, "loss must visibly fall"
    nodes = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%N"],
                           capture_output=True, text=True).stdout.strip()
    assert nodes == "node[1-2]"
    log = (run / f"slurm-{job_id}.out").read_text()
    assert "2 stage(s) x 1 data-parallel on 2 node(s)" in log and "step 12/12" in log

    st = json.loads(pswift("status", job_id, "--json", check=True).stdout)
    assert st["state"] == "COMPLETED" and st["step"] == 12 and st["run_dir"] == str(run)
    assert st["attempts"][0]["ended"] == "completed" and st["attempts"][0]["stages"] == 2

    # the same job locally, without Slurm: bitwise the same losses
    local = tmp_path / "local"
    proc = pswift("run", "--run-dir", str(local), str(example))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert step_losses(local) == step_losses(run)
    # the planner learns from both runs (`pswift plan` writes nothing: the ingest brings the
    # history up to date, as the next `pswift sbatch` would): each actual JCT against its band
    pswift("history", "ingest", check=True)
    out = pswift("plan", str(example), "--no-live", check=True).stdout
    assert re.search(r"JCT band coverage: [0-2] of 2 actual JCT\(s\) inside the predicted p10-p90 band", out), out
    assert re.search(r"hardware: links \d+ us \+ [0-9.]+ GB/s between stages, [0-9.]+ GB per cpu rank "
                     r"\(measured by [12] recent launch\(es\)\)", out), out
    # both virtual nodes' ranks were found on this one host: the planner shares its cores
    hw = json.loads(pswift("plan", str(example), "--no-live", "--json", check=True).stdout)["hardware"]
    assert (hw["host_cores"], hw["ranks_per_host"]) == (os.cpu_count(), 2), hw


def test_dry_run_submits_nothing(cluster, example, tmp_path):
    before = squeue_ids()
    run = tmp_path / "run"
    proc = pswift("sbatch", "--dry-run", "--run-dir", str(run), str(example), "--", "--qos=x")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout and "# sbatch arguments: --qos=x" in proc.stderr
    assert not new_jobs_since(before)
    assert not run.exists()


@pytest.mark.parametrize("args", [("--hold", "--comment=from pswift", "--mail-type=END"),
                                  ("--hold", "--comment", "from pswift", "--mail-type", "END")])
def test_pass_through_options_reach_sbatch(cluster, example, tmp_path, args):
    """Both of sbatch's forms, --opt=V and --opt V, pass through unchanged."""
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(example), "--", *args)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit()
    try:
        show = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        assert "Comment=from pswift" in show and "MailType=END" in show
        assert "Reason=JobHeldUser" in show and "Requeue=1" in show
    finally:
        subprocess.run(["scancel", job_id])


def test_an_hour_written_on_a_job_predicted_at_minutes_asks_slurm_for_minutes_and_a_time_min(cluster, tmp_path):
    """[job] time_policy = "predicted" (the default): Slurm holds the planner's limit, not the
    TOML's hour, and the --time-min backfill may shorten the job to."""
    toml = copy_example(tmp_path / "ex", {"time": '"1:00:00"', "steps": "2000", "time_policy": '"predicted"'})
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), "--", "--hold")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    plan = json.loads((run / "plan.json").read_text())
    try:
        show = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        limit = re.search(r"TimeLimit=(\S+)", show).group(1)
        time_min = re.search(r"TimeMin=(\S+)", show).group(1)
        assert limit == f"00:{plan['time_limit_s'] // 60:02d}:00" and plan["time_limit_s"] < 3600, show
        assert time_min == f"00:{plan['time_min_s'] // 60:02d}:00", show
    finally:
        subprocess.run(["scancel", job_id])


@pytest.mark.parametrize("args,key", [(("--nodes=3",), "[resources] nodes"), (("-N", "3"), "[resources] nodes"),
                                      (("-N3",), "[resources] nodes"), (("-p", "high"), "[job] partition"),
                                      (("--time", "5"), "[job] time"), (("--ntasks-per-node=2",), "tasks_per_node"),
                                      (("--part=high",), "[job] partition"),    # sbatch's own abbreviation
                                      (("-o", "/dev/null"), "slurm-%j.out"), (("--no-requeue",), "max_requeues"),
                                      (("--sig=USR1@60",), "[job] time"), (("--array=1-2",), "one pswift job each")])
def test_options_that_contradict_the_plan_are_refused_before_queueing(cluster, example, tmp_path, args, key):
    before = squeue_ids()
    proc = pswift("sbatch", "--run-dir", str(tmp_path / "run"), str(example), "--", *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert ("would override the planned" in proc.stderr or "cannot go with a pswift job" in proc.stderr)
    assert key in proc.stderr
    assert not new_jobs_since(before) and not (tmp_path / "run").exists()


def test_a_mistyped_pswift_option_gets_a_suggestion(cluster, example):
    proc = pswift("sbatch", "--dryrun", str(example))
    assert proc.returncode == 2 and "No such option '--dryrun'. Did you mean '--dry-run'?" in proc.stderr


@pytest.mark.deepspeed
def test_hostile_job_name_and_run_dir(cluster, tmp_path):
    hostile = "it's \"$(touch PWNED)\" `touch PWNED` ; x"
    toml = copy_example(tmp_path / "ex", {"steps": "3", "checkpoint_interval": "0",
                                          "name": json.dumps(hostile)})
    run = tmp_path / "run dir 'quoted' $(touch PWNED)"
    proc = pswift("sbatch", "--wait", "--run-dir", str(run), str(toml), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = (run / "JOB_ID").read_text().strip()
    name = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%j"],
                          capture_output=True, text=True).stdout.rstrip("\n")
    assert name == hostile
    assert [e["step"] for e in run_events(run) if e["event"] == "step"] == [1, 2, 3]
    assert not list(tmp_path.rglob("PWNED"))


def test_slurm_refusal_is_one_clear_line_and_leaves_nothing(cluster, example, tmp_path):
    run = tmp_path / "run"
    proc = pswift("sbatch", "--run-dir", str(run), str(example), "--", "--constraint=nosuchfeature")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: `sbatch ") and "--parsable" in lines[0]
    assert "invalid feature specification" in lines[0].lower()
    assert not run.exists() and not list(tmp_path.glob(".run*"))


@pytest.mark.parametrize("key,value,says", [
    ("job.partition", '"nosuchpartition"', "[job] partition = 'nosuchpartition': Slurm has no such partition"),
    ("resources.nodes", "[6, 8]", "[resources] nodes asks for at least 6 node(s), but partition 'low' has 4"),
])
def test_a_job_that_can_never_run_is_refused_before_queueing(cluster, tmp_path, key, value, says):
    """No such partition, or fewer nodes in it than the job's least: `pswift plan` and `pswift
    sbatch` say so in one line with the fix and exit 2; nothing is queued or written (issue 25)."""
    toml = copy_example(tmp_path / "ex", {key: value})
    before = squeue_ids()
    for cmd in (["plan", str(toml)], ["sbatch", "--run-dir", str(tmp_path / "run"), str(toml)]):
        proc = pswift(*cmd)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not new_jobs_since(before) and not (tmp_path / "run").exists()


def test_a_job_with_nothing_to_plan_with_is_refused_too(cluster, tmp_path):
    """No [model] layer_costs and no profile in the history (the planner steps aside): a
    partition Slurm does not have is still refused before anything is queued."""
    toml = copy_example(tmp_path / "ex", {"job.partition": '"nosuchpartition"'})
    toml.write_text("\n".join(line for line in toml.read_text().splitlines()
                               if not line.startswith("layer_costs")) + "\n")
    before = squeue_ids()
    proc = pswift("sbatch", "--run-dir", str(tmp_path / "run"), str(toml), env={"PSWIFT_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2 and "Slurm has no such partition" in proc.stderr, proc.stderr
    assert not new_jobs_since(before) and not (tmp_path / "run").exists()


def test_status_of_unknown_job_is_clear(cluster):
    proc = pswift("status", "999999")
    assert proc.returncode == 1 and "unknown to Slurm" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


HOSTILE = ["it's", "a\\'b --qos=smuggled", 'q"uote --time=1', "$(touch PWNED) `touch PWNED`",
           "100% #not-a-comment", "back\\slash\\", "  lead and trail  ", "unicode ✓ ß", "'", '"', "\\"]


def test_sbatch_reads_back_exactly_what_pswift_wrote(cluster, tmp_path):
    """Round trip through Slurm's own #SBATCH parser (not bash): each hostile value comes back
    as the job's name and comment, and none smuggles an option (a --qos=smuggled or --time=1
    would change the job, or make sbatch refuse it)."""
    from pipeswift_slurm.slurm.sbatch import SbatchOptions, render
    jobs = {}
    try:
        for i, value in enumerate(HOSTILE):
            opts = SbatchOptions(job_name=value, nodes="1", ntasks_per_node=1, cpus_per_task=1,
                                 output="/dev/null", extra=(f"--comment={value}",))
            script = tmp_path / f"s{i}.sbatch"
            script.write_text(render(opts, str(tmp_path), "/bin/true"))
            proc = subprocess.run(["sbatch", "--parsable", "--hold", str(script)], capture_output=True,
                                  text=True, cwd=tmp_path)
            assert proc.returncode == 0, (value, proc.stderr)
            jobs[proc.stdout.strip()] = value
        doc = json.loads(subprocess.run(["squeue", "--json", "-j", ",".join(jobs)], capture_output=True,
                                        text=True, check=True).stdout)
        got = {str(j["job_id"]): j for j in doc["jobs"]}
        for jid, value in jobs.items():
            assert (got[jid]["name"], got[jid]["comment"]) == (value, value)
            assert got[jid]["qos"] != "smuggled"
            limit = got[jid]["time_limit"]
            assert (limit.get("number") if isinstance(limit, dict) else limit) != 1
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs])
    assert not list(tmp_path.rglob("PWNED"))


def test_values_sbatch_cannot_hold_are_refused_in_one_line(cluster, tmp_path):
    toml = copy_example(tmp_path / "ex", {"name": json.dumps("tab\there")})
    proc = pswift("sbatch", "--dry-run", str(toml))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "contains a control character" in proc.stderr
    run = tmp_path / "back\\slash"
    proc = pswift("sbatch", "--dry-run", "--run-dir", str(run), str(copy_example(tmp_path / "ex2")))
    assert proc.returncode == 2 and "contains a backslash" in proc.stderr and not run.exists()


def test_a_login_only_python_is_refused_before_queueing(cluster, tmp_path):
    """[job] python without torch (a login-node install): one line with the fix, exit 2, nothing
    queued or written (issue 25: it used to queue, and every rank died after the wait)."""
    venv = tmp_path / "login"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    toml = copy_example(tmp_path / "ex", {"steps": "4"})
    toml.write_text(toml.read_text().replace("[job]\n", f'[job]\npython = "{venv}/bin/python"\n', 1))
    before = squeue_ids()
    proc = pswift("sbatch", "--run-dir", str(tmp_path / "run"), str(toml))
    assert proc.returncode == 2 and "cannot import" in proc.stderr and "torch" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not new_jobs_since(before) and not (tmp_path / "run").exists()


@pytest.mark.every_version
def test_wait_times_out_with_its_own_code_and_cancel_is_recorded(cluster, tmp_path):
    """A held job: `--wait --timeout 2` leaves it queued and exits 124 (not 1, which means the
    job failed); `pswift cancel` cancels it, and status says who did, from the run directory."""
    toml = copy_example(tmp_path / "ex")
    run = tmp_path / "run"
    proc = pswift("sbatch", "--wait", "--timeout", "2", "--run-dir", str(run), str(toml), "--", "--hold")
    assert proc.returncode == 124, (proc.stdout, proc.stderr)
    job = re.search(r"Submitted pswift job (\d+)", proc.stdout).group(1)
    assert f"job {job}: PENDING (JobHeldUser)" in proc.stdout
    assert proc.stderr.count("\n") == 1 and f"job {job} still PENDING after 2 s; it goes on" in proc.stderr
    try:
        assert subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                              text=True).stdout.strip() == "PENDING"
        out = pswift("cancel", job, check=True).stdout
        assert out == f"cancelled job {job} (run directory {run})\n"
    finally:
        subprocess.run(["scancel", job])
    status = pswift("status", str(run), check=True).stdout
    assert status.startswith(f"job {job}: CANCELLED") and "cancelled by root with `pswift cancel` at" in status
    assert "None" not in status
    st = json.loads(pswift("status", job, "--json", check=True).stdout)
    assert st["cancelled"]["user"] == "root" and st["source"] == "slurm" and st["steps_total"] == 40
