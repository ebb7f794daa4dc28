"""bench/workload_outcome.py's check of a training job's events (every step trained, and none
trained twice by launches that overlap: a run of members whose epochs overlapped did, issue 62),
its goodput, and bench/workload.py's end of a policy's run (--until-trained)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import workload  # noqa: E402
import workload_outcome  # noqa: E402


def outcome(tmp_path: Path, events: list[dict], steps: int) -> tuple[bool, int, int]:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    job = {"run": str(tmp_path), "state": "COMPLETED", "steps": steps}
    return workload_outcome._train_outcome(job, workload_outcome.events_of(job))


def start(step: int) -> dict:
    return {"event": "start", "step": step}


def steps(*ns: int) -> list[dict]:
    return [{"event": "step", "step": n} for n in ns]


def test_a_restart_from_a_checkpoint_runs_steps_again_in_order_and_is_not_an_overlap(tmp_path):
    evs = [start(0), *steps(1, 2, 3, 4, 5), start(3), *steps(4, 5, 6), {"event": "end", "reason": "completed"}]
    assert outcome(tmp_path, evs, 6) == (True, 0, 0)


def test_two_trainings_of_one_run_side_by_side_are_counted(tmp_path):
    evs = [start(0), *steps(1, 2), start(1), *steps(3, 2, 4, 3, 5, 4, 6, 5, 6)]
    ok, _, overlapped = outcome(tmp_path, evs, 6)
    assert ok and overlapped == 4          # every step there, yet four went back without a launch


def test_a_step_missing_is_lost(tmp_path):
    assert outcome(tmp_path, [start(0), *steps(1, 2, 4)], 4)[0] is False


def test_until_trained_ends_a_run_once_training_ended_and_every_other_job_started():
    jobs = [{"id": "1", "kind": "train"}, {"id": "2", "kind": "plain"}]
    seen = {"1": {"start": 5.0, "end": 50.0}, "2": {"start": 10.0, "end": None}}
    assert workload.settled(jobs, seen.__getitem__, until_trained=True)
    assert not workload.settled(jobs, seen.__getitem__, until_trained=False)     # the plain job still sleeps
    seen["2"]["start"] = None
    assert not workload.settled(jobs, seen.__getitem__, until_trained=True)      # it has not started
    seen["2"]["end"] = 12.0
    assert workload.settled(jobs, seen.__getitem__, until_trained=True)          # it ended within a poll
    seen["2"]["end"] = None
    seen["1"]["end"], seen["2"]["start"] = None, 10.0
    assert not workload.settled(jobs, seen.__getitem__, until_trained=True)      # training goes on


def test_a_plain_job_cut_short_ends_at_its_start_plus_its_sleep_and_says_so():
    j = {"kind": "plain", "start": 100.0, "end": None, "state": "RUNNING", "run_s": 30.0}
    workload.cut_short(j)
    assert j == {"kind": "plain", "start": 100.0, "end": 130.0, "state": "COMPLETED", "run_s": 30.0, "cut": True}
    t = {"kind": "train", "start": 100.0, "end": None, "state": "RUNNING", "run_s": 30.0}
    workload.cut_short(t)
    assert t["end"] is None and "cut" not in t                                   # a training job is never cut


def test_goodput_counts_each_step_once_at_its_launchs_nodes_over_the_node_seconds_held(tmp_path):
    evs = [{"event": "start", "nodes": 2, "step": 0},
           *({"event": "step", "step": n, "step_time": 1.0} for n in (1, 2, 3)),
           {"event": "start", "nodes": 1, "step": 2},
           *({"event": "step", "step": n, "step_time": 2.0} for n in (3, 4))]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    held = [(float(t), "node[1-2]") for t in range(10)] + [(10.0 + t, "node1") for t in range(10)]   # 30 node-s
    job = {"run": str(tmp_path), "held": held}
    # steps 1, 2 on 2 nodes (2 node-s each), 3 run again and 4 on 1 node (2 node-s each): 8 of 30
    assert workload_outcome.goodput([job], [workload_outcome.events_of(job)]) == 8 / 30
    assert workload_outcome.goodput([{"run": str(tmp_path), "held": []}], [workload_outcome.events_of(job)]) is None
    assert workload_outcome.events_of({"run": str(tmp_path / "gone")}) is None


def test_lost_counts_training_jobs_and_other_users_jobs_a_preemption_ended_stand_apart(tmp_path):
    """``lost`` is pswift's own claim (a training job not COMPLETED with every step); another
    user's plain job the high tenant preempted (JobRequeue=0 ends it) is counted apart."""
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [start(0), *steps(1, 2)]))
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [start(0), *steps(1)]))

    def train(run: str) -> dict:
        return {"kind": "train", "run": str(tmp_path / run), "state": "COMPLETED", "steps": 2, "submit": 0.0,
                "start": 1.0, "end": 9.0, "held": [(1.0, "node1")]}

    def plain(state: str) -> dict:
        return {"kind": "plain", "state": state, "submit": 0.0, "start": 1.0, "end": 5.0, "held": [(1.0, "node2")]}
    run = {"t0": 0.0, "jobs": [train("done"), plain("PREEMPTED"), plain("COMPLETED")]}
    got = workload_outcome.summarise([run], 4)
    assert (got["lost"], got["others_not_completed"], got["others_preempted"]) == (0, 1, 1)
    run["jobs"].append(train("short"))
    assert workload_outcome.summarise([run], 4)["lost"] == 1


def test_several_seeds_keep_each_seeds_paired_ratio_beside_the_pooled_one(tmp_path):
    """A pooled ratio can hide a window that goes the other way: per_seed keeps each seed's
    (S's jobs twice as long as P's in seed 1, as long in seed 2); with one seed there is none."""
    def run(seed: int, jct: float) -> dict:
        (tmp_path / f"{seed}-{jct}").mkdir(exist_ok=True)
        (tmp_path / f"{seed}-{jct}" / "events.jsonl").write_text(json.dumps(start(0)) + "\n")
        jobs = [{"kind": "train", "submit": 0.0, "start": 1.0, "end": jct * (k + 1), "state": "COMPLETED",
                 "steps": 0, "run": str(tmp_path / f"{seed}-{jct}"), "held": []} for k in range(3)]
        return {"t0": 0.0, "seed": seed, "jobs": jobs}
    runs = {"S": [run(1, 20.0), run(2, 10.0)], "P": [run(1, 10.0), run(2, 10.0)]}
    got = workload.per_seed(runs)
    assert {s: round(v["paired"]["P/S"]["ratio"], 3) for s, v in got.items()} == {"1": 0.5, "2": 1.0}
    assert got["1"]["summary"]["P"]["jct_mean_s"] == 20.0 and got["1"]["summary"]["S"]["jct_mean_s"] == 40.0
    assert workload.paired(runs)["P/S"]["ratio"] not in (0.5, 1.0)       # the pooled one is neither
    assert workload.per_seed({p: rs[:1] for p, rs in runs.items()}) == {}
