"""Several partitions (issue 27): `[job] partition = ["a", "b"]` plans the job in each, submits
it to all of them soonest-finishing first (Slurm's partition list: it starts the job where it
can first), and plan.json keeps each partition's layouts where its hardware cuts them otherwise."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from helpers import copy_example, pswift, plan_with
from pipeswift_slurm import autoplan
from pipeswift_slurm.planning import planner
from pipeswift_slurm.config import load_config
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.plan import for_partition
from pipeswift_slurm.planning.build import build_plan, time_limits
from pipeswift_slurm.slurm.cluster import ClusterState, NodeState, RunningJob
from pipeswift_slurm.planning.build import options_for


def two_partition_toml(tmp_path, names: str = '["left", "right"]'):
    return copy_example(tmp_path / "ex", {"job.partition": names, "nodes": "[1, 2]", "steps": "4"})


def test_a_list_of_partitions_is_read_in_order_and_bad_lists_are_one_line(tmp_path):
    cfg = load_config(two_partition_toml(tmp_path))
    assert (cfg.job.partition, cfg.job.partitions) == ("left", ("left", "right"))
    one = load_config(copy_example(tmp_path / "one"))
    assert (one.job.partition, one.job.partitions) == ("low", ("low",))
    for bad, says in (("[]", "lists 0 partitions"), ('["a", "a"]', "lists 'a' twice"),
                      ('"a,b"', "without commas"), ("[1]", "string or an array of strings"),
                      (str([f"p{i}" for i in range(9)]).replace("'", '"'), "give 1 to 8")):
        toml = two_partition_toml(tmp_path / bad.strip('[]"').replace(",", "_").replace(" ", "")[:20] / "x", bad)
        with pytest.raises(ConfigError, match=says):
            load_config(toml)
        proc = pswift("plan", str(toml), "--no-live")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


def cluster_with_left_busy() -> ClusterState:
    """node1-2 in "left", held by another job for an hour; node3-4 in "right", idle."""
    nodes = [NodeState(f"node{i}", "allocated" if i <= 2 else "idle", 8, 0 if i <= 2 else 8,
                       ("left",) if i <= 2 else ("right",)) for i in range(1, 5)]
    return ClusterState(now=0.0, nodes=nodes, running=[RunningJob("7", ("node1", "node2"), 3600.0)])


def plan_each(tmp_path, usable):
    cfg = load_config(two_partition_toml(tmp_path))
    cluster = cluster_with_left_busy()
    profile = autoplan.load_profile(cfg, None)
    return cfg, autoplan.by_partition(
        cfg, usable, lambda c: planner.plan(c, profile, autoplan.hardware(c, cluster), cluster))


def test_each_partition_is_planned_and_the_soonest_finishing_goes_first(tmp_path):
    cfg, res = plan_each(tmp_path, {"left": None, "right": None,
                                    "gone": "[job] partition = 'gone': Slurm has no such partition"})
    assert res.partition_order() == ("right", "left")           # the TOML's order was left first
    right, left, gone = res.partitions
    assert right.score_s is not None and left.score_s is not None and right.score_s < left.score_s
    assert left.score_s >= 3600 - 1                              # its queue: the hour the holder has left
    assert (gone.usable, gone.score_s) == (False, None) and "no such partition" in gone.why
    assert res.chosen is not None and res.chosen.est.queue_s == 0
    text = planner.explain(res)
    assert "partitions, in the order Slurm is given them: right: expected JCT" in text, text
    assert "gone: left out ([job] partition = 'gone'" in text
    # what is submitted: that order, the first one planned for; its layouts in plan.json
    cfg = cfg._replace(job=cfg.job._replace(partition="right", partitions=res.partition_order()))
    plan = build_plan(cfg, tmp_path / "run", planned=res)
    assert (plan["partition"], plan["partitions"]) == ("right", ["right", "left"])
    assert plan["partition_layouts"] == {}                       # one kind of node: the same cuts
    assert options_for(cfg, str(tmp_path / "run"), time_limits(cfg)).partition == "right,left"
    assert res.to_dict()["partitions"][0]["name"] == "right"


def test_when_every_listed_partition_is_unusable_the_reasons_are_one_error(tmp_path):
    cfg = load_config(two_partition_toml(tmp_path, '["nope", "nada"]'))
    with pytest.raises(ConfigError, match="'nope'.*; .*'nada'"):
        autoplan._usable_partitions(cfg, cluster_with_left_busy())


def test_a_job_started_in_another_listed_partition_takes_that_partitions_layouts():
    other = {"1": {"nodes": 1, "stages": 1, "data_parallel": 1, "micro_batch_size": 2}}
    plan = plan_with(partition="a", partitions=["a", "b", "c"], partition_layouts={"b": other})
    assert for_partition(plan, "a") is plan and for_partition(plan, None) is plan
    assert for_partition(plan, "zzz") is plan                       # not one of its partitions
    b = for_partition(plan, "b")
    assert (b["partition"], b["layouts"]) == ("b", other)
    c = for_partition(plan, "c")
    assert (c["partition"], c["layouts"]) == ("c", plan["layouts"])  # the same nodes: the same cuts


def _scontrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)


@pytest.mark.slurm
@pytest.mark.deepspeed
def test_two_partitions_the_first_full_the_job_starts_in_the_second(cluster, tmp_path):
    """Partitions "left" (node1-2, held by another job for 10 minutes) and "right" (node3-4,
    idle), made for this test: a job listing left first is planned in both, submitted with
    --partition=right,left, and Slurm starts it in right at once."""
    for name, nodes in (("left", "node[1-2]"), ("right", "node[3-4]")):
        got = _scontrol("create", f"PartitionName={name}", f"Nodes={nodes}", "State=UP", "MaxTime=INFINITE")
        assert got.returncode == 0, got.stderr
    holder = None
    try:
        holder = subprocess.run(["sbatch", "--parsable", "-p", "left", "-N2", "--exclusive", "--time=10",
                                 "-o", "/dev/null", "--wrap", "sleep 600"],
                                capture_output=True, text=True, check=True).stdout.strip()
        deadline = time.time() + 60
        while subprocess.run(["squeue", "-h", "-j", holder, "-o", "%T"], capture_output=True,
                             text=True).stdout.strip() != "RUNNING":
            assert time.time() < deadline, "the holder did not start"
            time.sleep(0.5)
        toml = two_partition_toml(tmp_path)
        shown = pswift("plan", str(toml), check=True).stdout
        assert "partitions, in the order Slurm is given them: right: expected JCT" in shown, shown
        run = tmp_path / "run"
        proc = pswift("sbatch", "--wait", "--run-dir", str(run), str(toml))
        assert proc.returncode == 0 and "COMPLETED" in proc.stdout, (proc.stdout, proc.stderr)
        job = proc.stdout.split()[3]
        assert "#SBATCH --partition=right,left" in (run / "job.sbatch").read_text()
        plan = json.loads((run / "plan.json").read_text())
        assert (plan["partition"], plan["partitions"]) == ("right", ["right", "left"])
        ran_in = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%P"], capture_output=True,
                                text=True).stdout.strip()
        assert ran_in == "right"
        st = json.loads(pswift("status", job, "--json", check=True).stdout)
        assert st["state"] == "COMPLETED" and st["step"] == 4
    finally:
        if holder:
            subprocess.run(["scancel", holder])
        deadline = time.time() + 60
        for name in ("left", "right"):
            while _scontrol("delete", f"PartitionName={name}").returncode != 0 and \
                    "Invalid partition name" not in _scontrol("show", "partition", name).stderr + \
                    _scontrol("show", "partition", name).stdout and time.time() < deadline:
                time.sleep(1)
