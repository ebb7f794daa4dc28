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
from pipeswift_slurm.planning.build import build_plan, limits_of, nodes_request, time_limits
from pipeswift_slurm.planning.costmodel import Hardware, Profile
from pipeswift_slurm.planning.planner import plan
from pipeswift_slurm.slurm.cluster import ClusterState, NodeState, PendingJob, RunningJob
from pipeswift_slurm.planning.build import options_for
from pipeswift_slurm.slurm.sbatch import render
from pipeswift_slurm.planning import decide


def test_a_ranged_toml_always_asks_in_range_form(tmp_path):
    fixed = load_config(copy_example(tmp_path / "a"))                     # nodes = 2
    ranged = load_config(copy_example(tmp_path / "b", {"nodes": "[1, 4]"}))
    assert nodes_request(fixed, 2, 2) == "2"
    assert nodes_request(ranged, 4, 4) == "4-4"               # waiting: exactly 4, widenable
    assert nodes_request(ranged, 3, 1) == "1-3"               # starts on what is there
    assert nodes_request(ranged, 1, 1) == "1-1"
    assert nodes_request(ranged, 4, 2) == "2-4"               # waiting where Slurm requeues as submitted
    assert "#SBATCH --nodes=4-4" in render(options_for(ranged, "/r", time_limits(ranged), nodes="4-4"), "/r", "/py")
    assert "#SBATCH --ntasks-per-node" not in render(options_for(ranged, "/r", time_limits(ranged), nodes="4-4"), "/r", "/py")


#: 8 layers of 1 s (fwd+bwd per micro-batch), m = 32: ~1 h on one node, ~16 min on four
BIG = {"nodes": "[1, 4]", "steps": "14", "global_batch_size": "32", "micro_batch_size": "1",
       "checkpoint_interval": "0", "num_layers": "8", "layer_costs": "[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]",
       "kwargs": "{ vocab = 96, hidden = 128, heads = 4, blocks = 6, seq_len = 32 }",
       "time": '"4:00:00"', "time_policy": '"predicted"'}


def planned_with_three_nodes_busy(tmp_path, busy_s: float, requeued_as_submitted: bool):
    """The planner's result for BIG when node1-node3 are busy for ``busy_s`` and node4 is free."""
    cfg = load_config(copy_example(tmp_path / f"big-{busy_s}-{requeued_as_submitted}", BIG))
    nodes = [NodeState(f"node{i}", "idle" if i == 4 else "allocated", 8, 8 if i == 4 else 0, ("low", "high"))
             for i in range(1, 5)]
    state = ClusterState(now=1000.0, nodes=nodes, running=[RunningJob("9", ("node1", "node2", "node3"), 1000.0 + busy_s)])
    res = plan(cfg, Profile(cfg.model.layer_costs, None, None, 1, "toml"), Hardware(host_cores=8), state)
    res.requeued_as_submitted = requeued_as_submitted
    return cfg, res


def test_a_job_that_waits_asks_down_to_the_count_that_finishes_no_later_after_waiting_again(tmp_path):
    """Issue 58: where Slurm requeues a preempted job with the request it was submitted with
    (PreemptMode=REQUEUE, 24.05 on), a job that waits 30 min for 4 nodes (its best JCT, ~46 min)
    would wait for 4 again after a preemption (~76 min): 1 node (~60 min, starting now) is no
    worse than that, so it asks for 1-4, with a time limit that covers the hour on 1 node.
    Where pswift requeues it (before 24.05: it sets the count it can have), exactly 4; a wait of
    3 min is cheap to pay again: exactly 4 as well."""
    cfg, res = planned_with_three_nodes_busy(tmp_path, 1800.0, True)
    assert res.chosen.nodes == 4 and res.chosen.est.queue_s == pytest.approx(1800.0)
    plan_json = build_plan(cfg, tmp_path / "run", planned=res)
    assert plan_json["nodes_request"] == "1-4"
    one_node = res.best_per_nodes()[1].est
    assert one_node.queue_s == 0 and plan_json["time_limit_s"] >= one_node.train_s > 50 * 60
    cfg, res = planned_with_three_nodes_busy(tmp_path, 1800.0, False)
    assert build_plan(cfg, tmp_path / "run", planned=res)["nodes_request"] == "4-4"
    assert build_plan(cfg, tmp_path / "run", planned=res)["time_limit_s"] < one_node.train_s
    cfg, res = planned_with_three_nodes_busy(tmp_path, 180.0, True)
    assert res.chosen.nodes == 4 and build_plan(cfg, tmp_path / "run", planned=res)["nodes_request"] == "4-4"


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
    """The job waits for 2 nodes (the planner's choice when waiting pays; forced here: every
    node is free), is preempted by a job holding node2-node4, and its requeued attempt starts at
    once on node1 with one stage instead of waiting for two. Before Slurm 24.05 it asks for
    exactly 2 and pswift's requeue sets the count it can have; from 24.05, where Slurm requeues it
    with the request it was submitted with, the planner asks for 1-2 (the test above) and
    Slurm's own requeue starts it on the free node (issue 58)."""
    by_slurm = slurm.requeues_as_submitted("low")
    asked = "1-2" if by_slurm else "2-2"
    assert by_slurm == slurm.requeues_preempted_jobs()   # the dev cluster's low partition: PreemptMode=REQUEUE
    toml = slow_example(tmp_path / "ex", {"nodes": "[1, 2]", "steps": "40", "checkpoint_interval": "0",
                                          "data_parallel": "1"})
    toml.write_text(toml.read_text().replace("seed = 1", 'seed = 1\nmetrics = ["csv", "tensorboard"]', 1))
    p = submit.prepare(toml, tmp_path / "run")
    assert set(p.plan["layouts"]) == {"1", "2"}
    script = render(options_for(p.config, str(p.run_dir), limits_of(p.plan), nodes=asked),
                    str(p.run_dir), p.plan["python"])
    job = submit.submit(p._replace(plan={**p.plan, "nodes_request": asked}, script=script)).job_id
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
    assert [(a["start"]["nodes"], a["start"]["stages"]) for a in attempts][:2] == [(2, 2), (1, 1)], slurm_log(run)
    assert attempts[0]["ended"] == "preempted" and attempts[-1]["ended"] == "completed"
    assert ("Slurm requeues preempted job" if by_slurm else "for 1 node(s) (1 node(s) available") in slurm_log(run)
    assert json.loads((run / "plan.json").read_text())["nodes_request"] == asked
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
