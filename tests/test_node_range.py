"""The node request as a range (issue 12, item 3): a requeued attempt whose plan has a layout
for fewer nodes asks for that many at least, so it never waits for its original count."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import copy_example, wait_state
from pipeswift_slurm import events as events_mod
from pipeswift_slurm import slurm, submit
from pipeswift_slurm.config import load_config
from pipeswift_slurm.plan import nodes_request, requeue_range
from pipeswift_slurm.sbatch import options_for, render
from test_preemption import slow_example, slurm_log, wait_steps


def test_a_ranged_toml_always_asks_in_range_form(tmp_path):
    fixed = load_config(copy_example(tmp_path / "a"))                     # nodes = 2
    ranged = load_config(copy_example(tmp_path / "b", {"nodes": "[1, 4]"}))
    assert nodes_request(fixed, 2, waiting=True) == "2"
    assert nodes_request(ranged, 4, waiting=True) == "4-4"               # exactly 4, widenable
    assert nodes_request(ranged, 3, waiting=False) == "1-3"              # starts on what is there
    assert nodes_request(ranged, 1, waiting=False) == "1-1"
    assert "#SBATCH --nodes=4-4" in render(options_for(ranged, "/r", None, nodes="4-4"), "/r", "/py")
    assert "#SBATCH --ntasks-per-node" not in render(options_for(ranged, "/r", None, nodes="4-4"), "/r", "/py")


@pytest.mark.parametrize("request_, counts, want", [
    ("4-4", ["1", "2", "3", "4"], "1-4"),
    ("2-4", ["2", "3", "4"], None),          # already starts at the smallest layout
    ("1-3", ["1", "2", "3"], None),
    ("4", ["1", "4"], None),                 # a fixed request fixes the task count too
    ("3-3", ["2", "3"], "2-3"),
])
def test_the_requeue_range_starts_at_the_smallest_layout(request_, counts, want):
    plan = {"nodes_request": request_, "layouts": {n: {} for n in counts}}
    assert requeue_range(plan) == want


@pytest.mark.slurm
@pytest.mark.deepspeed
def test_a_requeued_job_with_a_1_node_layout_restarts_on_the_one_free_node(cluster, tmp_path):
    """The job asks for exactly 2 nodes (the planner's choice when it decides to wait for them;
    forced here: every node is free), is preempted by a job holding node2-node4, and its
    requeued attempt starts at once on node1 with one stage instead of waiting for two."""
    if slurm.requeues_preempted_jobs():
        pytest.skip("from Slurm 24.05 Slurm requeues a preempted job itself, after the job's last "
                    "process ends: nothing of the job is left to widen its request (README)")
    toml = slow_example(tmp_path / "ex", {"nodes": "[1, 2]", "steps": "40", "checkpoint_interval": "0",
                                          "data_parallel": "1"})
    p = submit.prepare(toml, tmp_path / "run")
    assert set(p.plan["layouts"]) == {"1", "2"}
    script = render(options_for(p.config, str(p.run_dir), p.plan["signal_lead_s"], nodes="2-2"),
                    str(p.run_dir), p.plan["python"])
    job = submit.submit(p._replace(plan={**p.plan, "nodes_request": "2-2"}, script=script)).job_id
    run = p.run_dir
    holder = None
    try:
        wait_steps(run, 5)
        holder = subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", "node[2-4]", "--exclusive",
                                 "-o", "/dev/null", "--wrap", "sleep 600"],
                                capture_output=True, text=True, check=True).stdout.strip()
        assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300) == "COMPLETED", slurm_log(run)
        assert subprocess.run(["squeue", "-h", "-j", holder, "-o", "%T"], capture_output=True,
                              text=True).stdout.strip() == "RUNNING"     # done while node2 was held
    finally:
        if holder:
            subprocess.run(["scancel", holder])
    attempts = events_mod.by_attempt(events_mod.read(run)[0])
    assert [(a["start"]["nodes"], a["start"]["stages"]) for a in attempts] == [(2, 2), (1, 1)]
    assert attempts[0]["ended"] == "preempted" and attempts[-1]["ended"] == "completed"
    assert "asking for 1-2 node(s)" in slurm_log(run)
    assert json.loads((run / "plan.json").read_text())["nodes_request"] == "2-2"
