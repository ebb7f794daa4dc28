"""The node request on requeue (issue 12, item 3): a requeued attempt whose plan has a layout
for fewer nodes asks for the count it can have when it restarts, so it never waits for its
original count (and takes more when more are free)."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers import (copy_example, plan_with, pswift, slow_example, slurm_log, tensorboard_scalars, wait_state,
                     wait_steps)
from pipeswift_slurm.history import eventfold
from pipeswift_slurm import events as events_mod
from pipeswift_slurm import submit
from pipeswift_slurm.slurm import client as slurm
from pipeswift_slurm.config import load_config
from pipeswift_slurm.planning.build import limits_of, nodes_request, time_limits
from pipeswift_slurm.slurm.cluster import ClusterState, NodeState, PendingJob, RunningJob
from pipeswift_slurm.planning.build import options_for
from pipeswift_slurm.slurm.sbatch import render
from pipeswift_slurm.planning import decide


def test_a_ranged_toml_always_asks_in_range_form(tmp_path):
    fixed = load_config(copy_example(tmp_path / "a"))                     # nodes = 2
    ranged = load_config(copy_example(tmp_path / "b", {"nodes": "[1, 4]"}))
    assert nodes_request(fixed, 2, waiting=True) == "2"
    assert nodes_request(ranged, 4, waiting=True) == "4-4"               # exactly 4, widenable
    assert nodes_request(ranged, 3, waiting=False) == "1-3"              # starts on what is there
    assert nodes_request(ranged, 1, waiting=False) == "1-1"
    assert "#SBATCH --nodes=4-4" in render(options_for(ranged, "/r", time_limits(ranged), nodes="4-4"), "/r", "/py")
    assert "#SBATCH --ntasks-per-node" not in render(options_for(ranged, "/r", time_limits(ranged), nodes="4-4"), "/r", "/py")


def cluster_of(idle: list[str], mine: list[str], pending: list[tuple[str, int]]) -> ClusterState:
    nodes = [NodeState(f"node{i}", "idle" if f"node{i}" in idle else "allocated", 8,
                       8 if f"node{i}" in idle else 0, ("low", "high")) for i in range(1, 5)]
    return ClusterState(now=0.0, nodes=nodes, running=[RunningJob("7", tuple(mine), 1e9)],
                        pending=[PendingJob(str(k), part, n, 600.0) for k, (part, n) in enumerate(pending)])


PLAN = plan_with(partition="low", layouts={"1": {}, "2": {}, "4": {}}, candidates=[])


@pytest.mark.parametrize("idle, mine, pending, want", [
    (["node3", "node4"], ["node1", "node2"], [("high", 3)], 1),   # the preemptor takes 3 of our 4
    (["node3", "node4"], ["node1", "node2"], [], 4),              # a time limit: all four
    (["node3"], ["node1", "node2"], [], 2),                       # three: the largest layout under
    ([], ["node1"], [("low", 4)], 1),                             # nothing: the smallest layout
])
def test_a_requeued_attempt_asks_for_what_it_can_have_when_it_restarts(idle, mine, pending, want):
    got, why = decide.requeue_target(PLAN, cluster_of(idle, mine, pending), 1, set(mine))
    assert got == want, why


def test_the_planners_estimates_pick_the_fastest_count_that_fits():
    plan = {**PLAN, "layouts": {n: {"nodes": int(n), "stages": int(n), "data_parallel": 1,
                                    "micro_batch_size": 8} for n in ("1", "2", "4")},
            "candidates": [{"nodes": n, "stages": n, "data_parallel": 1, "micro_batch_size": 8,
                            "rejected": None, "estimate": {"step_s": s}} for n, s in ((1, 0.4), (2, 0.2), (4, 0.3))]}
    got, why = decide.requeue_target(plan, cluster_of(["node3", "node4"], ["node1", "node2"], []), 1,
                                   {"node1", "node2"})
    assert got == 2 and "2 predicted fastest" in why


@pytest.mark.parametrize("stop, preempted, slurm_requeues, want", [
    ("TERM", True, False, (1, "0 node(s) available: the smallest layout")),   # a preemptor holds them all
    ("TIME", None, False, (1, "0 node(s) available: the smallest layout")),
    ("TERM", True, True, (None, "")),            # Slurm requeues it itself: its request stays
    ("GROW", None, False, (4, "growing")),
])
def test_a_requeue_decision_carries_its_node_count_as_a_shrink_does(stop, preempted, slurm_requeues, want):
    """Issue 60: the requeued attempt's node count is decide's, from the facts rank 0 gathers
    (plan.json, the cluster, the job's nodes, a growth's target); train.py only carries it out."""
    from pipeswift_slurm.codes import Stop
    plan = {**PLAN, "nodes_request": "2-4"}
    facts = decide.RequeueFacts(plan, cluster_of([], ["node1", "node2"], [("high", 4)]), frozenset({"node1", "node2"}),
                                1, grow_to=4)
    d = decide.what_follows(decide.Stopped(Stop[stop], 5, 50, preempted=preempted, slurm_requeues=slurm_requeues,
                                           requeue=facts),
                            decide.Budgets(0, 2, 0, attempt=0, max_requeues=3, in_slurm=True))
    assert (d.nodes, "; ".join(d.notes)) == want, d
    unknown = decide.RequeueFacts(plan, None, error="slurmctld is down")
    assert decide.requeue_nodes(unknown, "preempted") == (None, "cannot read the cluster (slurmctld is down)")
    assert decide.requeue_nodes(decide.RequeueFacts({**plan, "nodes_request": "2"}, None), "preempted") == (None, "")


@pytest.mark.slurm
@pytest.mark.every_version
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
    toml.write_text(toml.read_text().replace("seed = 1", 'seed = 1\nmetrics = ["csv", "tensorboard"]', 1))
    p = submit.prepare(toml, tmp_path / "run")
    assert set(p.plan["layouts"]) == {"1", "2"}
    script = render(options_for(p.config, str(p.run_dir), limits_of(p.plan), nodes="2-2"),
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
        subprocess.run(["scancel", job])     # a failure here must not leave it to later tests
    attempts = eventfold.by_attempt(events_mod.read(run)[0])
    assert [(a["start"]["nodes"], a["start"]["stages"]) for a in attempts] == [(2, 2), (1, 1)]
    assert attempts[0]["ended"] == "preempted" and attempts[-1]["ended"] == "completed"
    assert "for 1 node(s) (1 node(s) available" in slurm_log(run)
    assert json.loads((run / "plan.json").read_text())["nodes_request"] == "2-2"
    # issue 42 item 4: the picture of both attempts, each marked with its layout and cause
    drawn = pswift("plot", job, "-o", str(tmp_path / "run.png"), check=True).stdout
    assert f"attempt 0 2 node(s) x 2 stage(s): steps 0-{attempts[0]['end']['step']}, ended: preempted" in drawn, drawn
    assert "attempt 1 1 node(s) x 1 stage(s)" in drawn and drawn.rstrip().endswith("ended: completed"), drawn
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # ... and the TensorBoard runs, read with TensorBoard's own reader: one loss curve over both
    # attempts, equal to the job's events, and the requeue marked where attempt 0 ended
    losses = {e["step"]: e["loss"] for e in events_mod.read(run)[0] if e["event"] == "step"}
    curve = tensorboard_scalars(run, "train/loss")
    assert [s for s, _ in curve] == list(range(1, 41))
    assert all(abs(v - losses[s]) <= 1e-6 * abs(losses[s]) for s, v in curve)
    assert [s for s, _ in tensorboard_scalars(run, "events/requeue")] == [attempts[0]["end"]["step"]]
    assert [s for s, _ in tensorboard_scalars(run, "events/start")] == [0, attempts[0]["end"]["step"]]
    assert (run / "metrics.csv").read_text().count("\n") > 40
