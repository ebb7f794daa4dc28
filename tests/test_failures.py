"""Failures nobody announces (issue 23), through the real local Slurm and real DeepSpeed: a rank
SIGKILLed mid-run costs a restart inside the allocation, not the job; a model whose code raises
at the same step every time fails fast, its error in `pswift status`, no budget spent. The rules
themselves are tests/test_decide.py's."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers import (bring_back, pswift, rank_process, reference, run_events, slow_example, slurm_log, step_losses,
                     wait_state, wait_steps)
from pipeswift_slurm import submit
from pipeswift_slurm.slurm import client as slurm
from pipeswift_slurm.slurm.records import expand_hostlist

pytestmark = [pytest.mark.slurm, pytest.mark.deepspeed]


@pytest.mark.every_version
def test_a_rank_killed_mid_run_restarts_in_the_allocation_and_ends_bitwise_equal(cluster, tmp_path, background_reference):
    toml = slow_example(tmp_path / "ex", {"steps": "40", "checkpoint_interval": "10"})
    uninterrupted = background_reference(toml, nodes=2)
    run = tmp_path / "run"
    submitted = submit.sbatch(toml, run_dir=run)             # the job object, as from Python
    job = submitted.job_id
    wait_steps(run, 24)
    pid, node = rank_process(run, 1)
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    assert submitted.wait(timeout=240) == "COMPLETED", slurm_log(run)[-3000:]
    assert slurm.job_info(job).restarts == 0            # the same Slurm job: no requeue
    evs = run_events(run, torn_ok=True)
    (crash,) = [e for e in evs if e["event"] == "crash"]
    assert (crash["how"], crash["rank"], crash["node"], crash["action"], crash["restart"]) == (
        "signal 9", 1, node, "restart", 1), crash
    starts = [e for e in evs if e["event"] == "start"]
    assert [e["attempt"] for e in starts] == [0, 0]
    # at most one checkpoint interval lost, and the ranks were back within seconds
    assert crash["step"] - starts[1]["step"] <= 10 and starts[1]["resumed_from"]
    assert starts[1]["time"] - t_kill < 60, starts[1]["time"] - t_kill
    # every step, the repeated ones too, has the uninterrupted run's loss bit for bit
    ref = step_losses(uninterrupted.wait(), torn_ok=True)
    assert all(e["loss_hex"] == ref[e["step"]] for e in evs if e["event"] == "step")
    assert sorted(step_losses(run, torn_ok=True)) == sorted(ref) == list(range(1, 41))
    st = json.loads(pswift("status", job, "--json", check=True).stdout)
    (a,) = st["attempts"]
    assert a["ended"] == "completed" and a["crashes"][0]["how"] == "signal 9"
    text = pswift("status", job, check=True).stdout
    assert f"crashed after step {crash['step']}: rank 1 on {node} was killed by signal 9" in text
    assert "restart 1 of 3 in this allocation" in text
    doctor = pswift("doctor", job, "--db", str(tmp_path / "h.db"), check=True).stdout
    assert f"attempt 0 crashed after step {crash['step']}: rank 1 on {node} was killed by signal 9" in doctor


RAISING = '''
from model import batch as _batch


def batch(step, **kw):
    if step == 4:     # the 5th step, every time
        raise ValueError(f"token ids out of range in the batch of step {step}")
    return _batch(step=step, **kw)
'''


def test_a_model_that_raises_at_the_same_step_fails_after_two_launches_without_a_requeue(cluster, tmp_path):
    toml = slow_example(tmp_path / "ex", {"steps": "40", "checkpoint_interval": "0"})
    (toml.parent / "raising.py").write_text(RAISING)
    toml.write_text(toml.read_text().replace('data = "slow:batch"', 'data = "raising:batch"'))
    run = tmp_path / "run"
    job = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), check=True).stdout.strip()
    assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180) == "FAILED", slurm_log(run)[-3000:]
    assert slurm.job_info(job).restarts == 0
    evs = run_events(run, torn_ok=True)
    assert len([e for e in evs if e["event"] == "start"]) == 2          # two launches, no more
    crashes = [e for e in evs if e["event"] == "crash"]
    assert [(c["how"], c["step"], c["action"]) for c in crashes] == [("exception", 5, "restart"),
                                                                     ("exception", 5, "fail")]
    assert all(c["error"] == "ValueError: token ids out of range in the batch of step 4" for c in crashes)
    text = pswift("status", job, check=True).stdout
    assert "ValueError: token ids out of range in the batch of step 4" in text and ", failed" in text
    assert "fix it and resubmit" in text
    assert "same error at the same step in two launches" in slurm_log(run)


@pytest.mark.every_version
def test_a_step_and_checkpoint_longer_than_gracetime_is_said_at_plan_time(cluster, tmp_path):
    """The dev cluster's preemptible partition gives 20 s of GraceTime; a model whose step takes
    about a minute cannot checkpoint within it: `pswift plan` says so with the numbers, and
    `pswift doctor` lists each preemptible partition's GraceTime."""
    from helpers import copy_example
    slow = copy_example(tmp_path / "slow", {"layer_costs": "[0.5, 5.0, 5.0, 5.0, 5.0, 0.5]"})
    proc = pswift("plan", str(slow))
    assert proc.returncode == 0, proc.stderr
    line = next((x for x in proc.stderr.splitlines() if "GraceTime" in x), "")
    assert line.startswith("warning: partition low preempts (REQUEUE) with GraceTime = 20 s, but the steps to the stop (~"), proc.stderr
    assert "ask for GraceTime >= " in line
    fast = copy_example(tmp_path / "fast")
    assert "GraceTime" not in pswift("plan", str(fast), check=True).stderr
    assert "ok  preemption on low: REQUEUE, GraceTime 20 s" in pswift("doctor", check=True).stdout


def test_with_no_restart_left_a_crash_requeues_the_job_without_the_dead_ranks_node(cluster, tmp_path,
                                                                                  background_reference):
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": "40", "checkpoint_interval": "5"})
    toml.write_text(toml.read_text().replace("[job]\n", "[job]\nmax_restarts = 0\n", 1))
    uninterrupted = background_reference(toml, nodes=4)
    run = tmp_path / "run"
    job = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), check=True).stdout.strip()
    wait_steps(run, 12)
    pid, node = rank_process(run, 1)
    os.kill(pid, signal.SIGKILL)
    assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240) == "COMPLETED", slurm_log(run)[-3000:]
    info = slurm.job_info(job)
    assert info.restarts == 1 and node in expand_hostlist(info.excluded), info
    (crash,) = [e for e in run_events(run, torn_ok=True) if e["event"] == "crash"]
    assert (crash["how"], crash["node"], crash["action"]) == ("signal 9", node, "requeue")
    assert "max_restarts = 0 spent in this attempt: requeueing the job without " + node in crash["why"]
    st = json.loads(pswift("status", job, "--json", check=True).stdout)
    a0, a1 = st["attempts"]
    assert a0["ended"] == "crashed" and a1["ended"] == "completed" and a1["start_step"] >= 10
    assert step_losses(run, torn_ok=True) == step_losses(uninterrupted.wait(), torn_ok=True)


def _parent(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def _on_four_nodes(tmp_path: Path, steps: int) -> tuple[str, Path, dict, str, tuple[int, int, int]]:
    """A slow example training on all 4 nodes, 12 steps in: (job id, run dir, its start event,
    its last node (not the batch script's), that node's slurmd, step daemon and rank pids)."""
    from helpers import CLUSTER_DIR
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": str(steps), "checkpoint_interval": "5"})
    run = tmp_path / "run"
    job = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), check=True).stdout.strip()
    wait_steps(run, 12)
    (first,) = [e for e in run_events(run, torn_ok=True) if e["event"] == "start"]
    assert first["nodes"] == 4, first
    pid, node = rank_process(run, first["world_size"] - 1)
    slurmd = int((CLUSTER_DIR / "run" / f"slurmd-{node}.pid").read_text())
    return job, run, first, node, (slurmd, _parent(pid), pid)


@pytest.mark.every_version
def test_a_lost_node_ends_nothing_the_ranks_go_on_with_fewer_stages(cluster, tmp_path):
    """A node lost mid-run (its slurmd, its step daemon and its rank killed; marked DOWN at once,
    as slurmctld does after SlurmdTimeout): the job, submitted with --no-kill, keeps its
    allocation less that node, and the ranks restart on the nodes left with plan.json's layout
    for them, from the last committed checkpoint: the same Slurm job COMPLETES (issue 23)."""
    import subprocess
    job, run, first, node, doomed = _on_four_nodes(tmp_path, 40)
    try:
        for p in doomed:
            os.kill(p, signal.SIGKILL)
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=pswift test: node lost"],
                       check=True, timeout=30)
        state = wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
        bring_back(node)
    assert state == "COMPLETED", slurm_log(run)[-4000:]
    assert slurm.job_info(job).restarts == 0            # the same Slurm job: no requeue
    evs = run_events(run, torn_ok=True)
    crash = [e for e in evs if e["event"] == "crash"]
    assert [(c["how"], c["node"], c["action"]) for c in crash] == [("lost", node, "restart")], crash
    plan = json.loads((run / "plan.json").read_text())
    fewer = plan["layouts"]["3"]["stages"]
    starts = [e for e in evs if e["event"] == "start"]
    assert [(s["attempt"], s["nodes"], s["stages"]) for s in starts] == [(0, 4, first["stages"]), (0, 3, fewer)]
    assert starts[1]["resumed_from"] and crash[0]["step"] - starts[1]["step"] <= 5
    text = pswift("status", job, check=True).stdout
    assert f"{node} lost: restart 1 of 3 on the 3 node(s) left" in text, text
    assert sorted(step_losses(run, torn_ok=True)) == list(range(1, 41))


@pytest.mark.every_version
def test_a_node_that_dies_before_slurm_knows_is_left_out_within_a_minute(cluster, tmp_path):
    """The issue's real case (38): node4's slurmd, step daemon and rank killed, Slurm NOT told (it
    still calls the node up for SlurmdTimeout). The ranks on the other nodes break their
    collectives, srun waits for node4's, launchwatch finds node4 silent and stops srun, and the
    ranks start again at once on node1-3 (a step that leaves node4 out): the same Slurm job
    COMPLETES within a minute of the loss, no healthy node excluded, no requeue, and node4 given back
    to Slurm (scontrol update NodeList=) so the scheduler no longer counts it as the job's."""
    import subprocess
    job, run, first, node, doomed = _on_four_nodes(tmp_path, 60)
    try:
        lost_at = time.time()
        for p in doomed:
            os.kill(p, signal.SIGKILL)
        state = wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        took = time.time() - lost_at
        info = slurm.job_info(job)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
        bring_back(node)
    assert state == "COMPLETED", slurm_log(run)[-4000:]
    assert info.restarts == 0 and info.excluded == ""           # the same Slurm job, nothing excluded
    assert node not in expand_hostlist(info.nodes)              # given back to Slurm at the restart
    evs = run_events(run, torn_ok=True)
    crash = [e for e in evs if e["event"] == "crash"]
    assert [(c["how"], c["node"], c["action"]) for c in crash] == [("lost", node, "restart")], crash
    starts = [e for e in evs if e["event"] == "start"]
    assert [(s["attempt"], s["nodes"]) for s in starts] == [(0, 4), (0, 3)], starts
    restarted = starts[1]["time"] - starts[1]["setup_s"]
    assert restarted - lost_at <= 60, (restarted - lost_at, took)
    text = pswift("status", job, check=True).stdout
    assert f"{node} lost (silent, before Slurm knew): restart 1 of 3 on the 3 node(s) left" in text, text
