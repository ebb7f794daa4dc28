"""In-job re-balancing (issue 12, item 1): a job cut from wrong layer costs measures its layers,
re-cuts them and comes back with the new boundaries in the same allocation, once, with the
losses of a static run that used the final cut from the start.

The decision rule is tested on synthetic profiles (pure functions); the whole loop through the
real local Slurm (the batch script's re-launch) and real DeepSpeed on CPU.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PSWIFT, copy_example, plan_with, pswift, rank_process, run_events, step_losses, wait_state
from pipeswift_slurm.history import eventfold
from pipeswift_slurm.history import rows as runrows
from pipeswift_slurm.history.store import History
from pipeswift_slurm.planning.partition import balanced_boundaries
from pipeswift_slurm.planning.decide import MAX_RELAYOUTS
from pipeswift_slurm.userfiles import read_run_files
from pipeswift_launch import relayout

# ---------------------------------------------------------------- the decision (pure functions)


def plan_for(steps: int, device_memory: float | None = None) -> dict:
    return plan_with(device="cpu", device_memory=device_memory, host_cores=None, ranks_per_host=None,
                     cpus_per_task=1, training={"steps": steps, "precision": "fp32", "zero_stage": 0,
                                                "activation_checkpoint_interval": 0},
                     layouts={"2": {"stages": 2, "data_parallel": 1}, "3": {"stages": 3, "data_parallel": 1}})


LAYOUT = {"nodes": 2, "tasks_per_node": 1, "world_size": 2, "stages": 2, "data_parallel": 1,
          "micro_batches": 8, "micro_batch_size": 8, "boundaries": [0, 5, 6], "partition": "cost"}


def profiled(seconds: list[float], params: list[int] | None = None) -> dict:
    params = params or [1000] * len(seconds)
    return {"seconds": {str(i): s for i, s in enumerate(seconds)},
            "param_bytes": {str(i): p for i, p in enumerate(params)},
            "activation_bytes": {str(i): 1000 for i in range(len(seconds))}, "instructions": {}}


SKEWED = [0.0005, 0.019, 0.0065, 0.0065, 0.0073, 0.0008]   # the slow block of the example, measured


def propose(seconds, steps=1000, step_s=0.37, done=0, bounds=(0, 5, 6), plan=None, params=None):
    return relayout.propose(plan or plan_for(steps), LAYOUT, list(bounds), profiled(seconds, params),
                            [step_s] * 3, 4, 3.0, 0.05, done)


def test_a_skewed_cut_is_re_cut_to_the_exact_min_max_of_the_measured_times():
    p = propose(SKEWED)
    assert p.go, p.why
    assert p.boundaries == balanced_boundaries(SKEWED, 2) == [0, 2, 6]
    assert p.predicted_step_s < 0.9 * p.step_s and p.gain_s >= relayout.COST_MARGIN * p.cost_s
    assert p.cost_s == pytest.approx(3.0 + relayout.LAUNCH_S + 0.05)   # setup + load, a launch, a checkpoint
    assert p.remaining == 996 and p.gain_s == pytest.approx((p.step_s - p.predicted_step_s) * 996)


def test_noise_few_steps_and_a_spent_budget_never_move_a_job():
    """Hysteresis: each rule declines with its numbers in the reason."""
    assert propose(SKEWED, bounds=(0, 2, 6)).why == "the measured cut is the one in use"
    near = [0.010, 0.010, 0.002, 0.010, 0.010, 0.010]    # [0, 3, 6]: 30 ms; [0, 4, 6] 32 ms
    p = propose(near, bounds=(0, 4, 6))
    assert p.boundaries == [0, 3, 6] and not p.go and "under 10% faster" in p.why
    few = propose(SKEWED, steps=30)
    assert not few.go and "under 2x its cost" in few.why and "over 26 step(s)" in few.why
    spent = propose(SKEWED, done=MAX_RELAYOUTS)
    assert not spent.go and f"already re-laid out {MAX_RELAYOUTS} time(s)" in spent.why


def test_the_memory_cap_bounds_the_new_cut():
    """A stage may not hold more training state than the device memory: with the first two
    layers too big to share a stage, the min-max cut [0, 2, 6] is out; the cap's best is taken."""
    params = [400_000_000, 400_000_000, 1000, 1000, 1000, 1000]   # fp32: x4 state bytes each
    p = propose(SKEWED, plan=plan_for(1000, device_memory=2.0e9), params=params)
    assert p.boundaries == [0, 1, 6]
    assert propose(SKEWED, plan=plan_for(1000, device_memory=1.0e9), params=params).why.startswith("no cut fits")


def test_every_node_counts_layout_is_re_cut_from_the_measured_profile():
    prof = relayout.measured_profile(plan_for(10), LAYOUT, profiled(SKEWED), [0, 5, 6])
    cuts = relayout.cuts_for_all(plan_for(10), prof)
    assert cuts == {"2": [0, 2, 6], "3": balanced_boundaries(SKEWED, 3)}


# ------------------------------------------------- the events' reading (synthetic, no training)

def _ev(kind: str, t: float, **f) -> dict:
    return {"event": kind, "time": t, "attempt": 0, "job_id": "7", **f}


def relaid_out_events() -> list[dict]:
    start = dict(nodes=2, world_size=2, stages=2, data_parallel=1, micro_batches=8, micro_batch_size=8,
                 partition="cost", resumed_from=None, load_s=0.0)
    evs = [_ev("start", 100.0, **start, step=0, boundaries=[0, 5, 6], setup_s=3.0)]
    evs += [_ev("step", 100.0 + 0.4 * s, step=s, loss=1.0, step_time=0.4) for s in range(1, 5)]
    evs += [_ev("checkpoint", 102.0, step=4, seconds=0.5, reason="relayout"),
            _ev("relayout", 102.5, step=4, nodes=2, boundaries_from=[0, 5, 6], boundaries_to=[0, 2, 6],
                step_s=0.4, predicted_step_s=0.25, gain_s=15.0, cost_s=5.0, remaining=96),
            _ev("end", 102.6, reason="relayout", step=4),
            _ev("start", 106.5, **{**start, "resumed_from": "/c/step_00000004", "load_s": 0.2},
                step=4, boundaries=[0, 2, 6], setup_s=3.5)]
    evs += [_ev("step", 106.5 + 0.25 * s, step=4 + s, loss=1.0, step_time=0.25 if s > 1 else 0.9)
            for s in range(1, 97)]
    evs.append(_ev("end", 131.0, reason="completed", step=100))
    return evs


def test_a_relayout_is_one_attempt_with_its_prediction_against_what_was_measured():
    (a,) = eventfold.by_attempt(relaid_out_events())
    assert a["ended"] == "completed" and len(a["starts"]) == 2 and a["start"]["boundaries"] == [0, 5, 6]
    (r,) = eventfold.relayout_outcomes(a)
    assert (r["from"], r["to"], r["step_s"], r["predicted_step_s"]) == ([0, 5, 6], [0, 2, 6], 0.4, 0.25)
    assert r["measured_step_s"] == 0.25                      # the next launch's first step left out
    assert r["measured_gain_s"] == pytest.approx((0.4 - 0.25) * 96)
    assert r["measured_cost_s"] == pytest.approx(106.5 - 102.5 + 0.5)   # checkpoint + the gap


def test_the_history_keeps_the_final_layouts_steps_and_the_relayout(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"version": 1, "job_name": "rl", "training": {"steps": 100},
                                               "model": {}, "layouts": {}}))
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in relaid_out_events()))
    got = runrows.rows(str(run), read_run_files(str(run)), runrows.Owner("u", 0, 0, "7"))
    (a,) = got.attempts
    assert json.loads(a["boundaries"]) == [0, 2, 6] and a["relayouts"] == 1
    assert a["step_count"] == 95 and a["step_p50"] == 0.25     # only the final cut's steps
    assert a["setup_s"] == 6.5 and a["load_s"] == pytest.approx(0.2) and a["start_time"] == 97.0
    db = tmp_path / "h.db"
    h = History(db)
    try:
        assert h.ingest_run_dir(str(run))
        (row,) = h.job_relayouts(str(run))
        assert (row["from"], row["to"], row["measured_step_s"]) == ([0, 5, 6], [0, 2, 6], 0.25)
    finally:
        h.close()


# ------------------------------------------------------ the whole loop: real Slurm, real DeepSpeed

# 200 steps: the re-layout must save 2x its cost over the steps left. At 120 steps CI hosts
# rightly kept the cut twice (14.6 s saved against a 7.3 s cost; 9.9 s against 5.2 s): a later
# cut of CI time back to 120 brought the flake back.
WRONG = {"layer_costs": "[0.0001, 0.001, 0.001, 0.001, 0.001, 0.1]",    # cuts [0, 5, 6] on 2 stages
         "kwargs": "{ vocab = 96, hidden = 128, heads = 4, blocks = 4, seq_len = 32, slow_block = 0, slow_factor = 3 }",
         "steps": "200", "global_batch_size": "64", "checkpoint_interval": "0"}


def static_run(run: Path, cut: list[int], steps: int) -> Path:
    """The WRONG example trained locally on 2 slots with an explicit ``cut`` (an explicit cut
    stays: no re-layout)."""
    toml = copy_example(run.with_name(run.name + "-ex"), {**WRONG, "pipeline.partition": str(cut), "steps": str(steps)})
    proc = pswift("run", "--nodes", "2", "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not any(e["event"] == "relayout" for e in run_events(run))
    return run


@pytest.mark.slurm
@pytest.mark.deepspeed
def test_a_job_cut_from_wrong_costs_rebalances_once_in_place_and_matches_a_static_run(cluster, tmp_path):
    toml = copy_example(tmp_path / "ex", WRONG)
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    log = lambda: "".join(p.read_text() for p in run.glob("slurm-*.out"))  # noqa: E731
    assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=600) == "COMPLETED", log()
    (a,) = eventfold.by_attempt(run_events(run))          # one Slurm attempt: no requeue
    assert a["ended"] == "completed" and len(a["starts"]) == 2, log()
    (r,) = a["relayouts"]
    assert r["boundaries_from"] == [0, 5, 6] and r["boundaries_to"] == [0, 2, 6]
    assert "re-layout 1: launching again" in log()
    # plan.json: the measured cut for the next attempts, revision 1, the record
    plan = json.loads((run / "plan.json").read_text())
    assert plan["revision"] == 1 and plan["layouts"]["2"]["boundaries"] == [0, 2, 6]
    assert plan["layouts"]["2"]["partition"] == "measured" and plan["relayouts"][0]["job_id"] == job
    # bitwise the losses of a static run that used the final cut from the start (its first 40
    # steps: the re-layout resumed at step 4)
    ref = static_run(tmp_path / "reference", [0, 2, 6], 40)
    got, want = step_losses(run), step_losses(ref)
    assert len(got) == 200 and len(want) == 40 and all(got[s] == want[s] for s in want), \
        [s for s in want if got.get(s) != want[s]][:5]
    # How much sooner a re-balancing job ends is bench/dynamic.py's figure (a straggler mid-run:
    # re-balanced vs the best static cut), not an assertion here: step times measured in a test on 2 cores shared with
    # other streams move with their load (a CI run measured the job's steps after the re-layout
    # at 0.94 s while a static run of the same cut, minutes later, took 0.64 s).
    # status and doctor say what was predicted and what was measured
    # (at step 4, or 5 where the flags agree a step late under load: CI's three streams did)
    status = pswift("status", job, check=True).stdout
    assert f"re-laid out at step {r['step']}: [0, 5, 6] -> [0, 2, 6]" in status and "(predicted" in status, status
    db = tmp_path / "h.db"
    doc = pswift("doctor", job, "--db", str(db), check=True).stdout
    assert f"attempt 0 re-laid out at step {r['step']}" in doc and "saved" in doc, doc
    (n,) = sqlite3.connect(db).execute("SELECT count(*) FROM relayouts").fetchone()
    assert n == 1


def test_rebalance_is_a_switch_that_reaches_plan_json(tmp_path):
    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.errors import ConfigError
    from pipeswift_slurm.planning.build import build_plan
    toml = copy_example(tmp_path / "ex")
    assert build_plan(load_config(toml), tmp_path / "run")["rebalance"] is True
    toml.write_text(toml.read_text().replace("[pipeline]\n", "[pipeline]\nrebalance = false\n"))
    assert build_plan(load_config(toml), tmp_path / "run")["rebalance"] is False
    toml.write_text(toml.read_text().replace("rebalance = false", 'rebalance = "no"'))
    with pytest.raises(ConfigError, match=r"\[pipeline\] rebalance = 'no' must be true or false"):
        load_config(toml)


def test_drifting_step_times_call_for_another_profile_a_bounded_number_of_times():
    w = relayout.DRIFT_WINDOW
    d = relayout.Drift()
    assert not d.drifted(100, [1.0] * 50)                      # nothing profiled yet
    d.settle(4)                                                # the profile of steps 2-4 ended
    assert not d.drifted(4 + w - 1, [0.45] * 3 + [0.30] * (w - 1))   # the base is still being measured
    assert not d.drifted(4 + w, [0.45] * 3 + [0.30] * w)       # the base: the w steps after the profile
    assert not d.drifted(4 + relayout.DRIFT_STEPS - 1, [0.5] * 30)   # too soon after the profile
    assert not d.drifted(40, [0.30] * 20 + [0.35] * 10)        # 17 %: noise
    assert d.drifted(40, [0.30] * 20 + [0.40] * 10)            # 33 % slower: profile again
    assert d.drifted(40, [0.30] * 20 + [0.20] * 10)            # or faster
    for _ in range(relayout.MAX_PROFILES - 1):
        d.settle(40)
    assert not d.drifted(100, [0.60] * 30)                     # the launch's profiles are spent


def test_steps_slowed_by_the_profile_itself_are_no_drift():
    """The profiled steps run with the profile's hooks (a third slower at a small model here):
    steady steps after it, as fast as ever, do not call for another profile."""
    d = relayout.Drift()
    d.settle(4)
    times = [0.45, 0.46, 0.44]                                 # steps 2-4, profiled
    for step in range(5, 60):
        times.append(0.30)
        assert not d.drifted(step, times), step



@pytest.mark.deepspeed
def test_a_local_run_restarts_a_killed_rank_as_a_slurm_job_does(tmp_path):
    """`pswift run` is driven as the batch script drives a job (issue 39: one relaunch rule):
    a rank killed with SIGKILL restarts the ranks from the newest committed checkpoint, and the
    steps trained again have the losses they had before, bit for bit. (Its re-layout, and the
    helper's part: test_decide.test_pswift_run_relaunches_as_the_batch_script_does.)"""
    toml = copy_example(tmp_path / "ex", {"steps": "24", "checkpoint_interval": "4"})
    run = tmp_path / "run"
    p = subprocess.Popen([*PSWIFT, "run", "--nodes", "2", "--run-dir", str(run), str(toml)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while not any(e["event"] == "checkpoint" and e["step"] >= 8 for e in run_events(run, torn_ok=True)):
            assert p.poll() is None and time.time() < deadline, (p.poll(), run_events(run, torn_ok=True)[-3:])
            time.sleep(0.05)
        os.kill(rank_process(run, 1)[0], signal.SIGKILL)
        out, _ = p.communicate(timeout=300)
    finally:
        p.kill()
    assert p.returncode == 0, out[-3000:]
    evs = run_events(run)
    (crash,) = [e for e in evs if e["event"] == "crash"]
    assert (crash["how"], crash["rank"], crash["action"], crash["restart"]) == ("signal 9", 1, "restart", 1), crash
    starts = [e["step"] for e in evs if e["event"] == "start"]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 8, starts
    assert [e["reason"] for e in evs if e["event"] == "end"][-1] == "completed"
    assert "restart 1: launching the ranks again" in out
    before = {e["step"]: e["loss_hex"] for e in evs if e["event"] == "step" and e["time"] < crash["time"]}
    again = {e["step"]: e["loss_hex"] for e in evs if e["event"] == "step" and e["time"] > crash["time"]}
    overlap = sorted(set(before) & set(again))
    assert overlap and overlap[0] == starts[1] + 1, (starts, overlap[:3])
    assert all(before[s] == again[s] for s in overlap), [s for s in overlap if before[s] != again[s]][:5]
    assert sorted(step_losses(run)) == list(range(1, 25))


@pytest.mark.deepspeed
def test_a_local_run_profiles_again_only_where_its_steady_steps_drift(tmp_path):
    """Every profile after the first is called for by the steady steps' drift: the median of
    the DRIFT_WINDOW steps before it is DRIFT away from that of the DRIFT_WINDOW steps after the
    profile before, never from the profiled steps themselves (the profile's hooks slow the
    steps they time: that read as drift at every launch, and a profile again inside steady
    training showed as pswift's own cost per step in bench/overhead.py). A host whose load
    changes mid-run (other tests beside this one) may drift for real: that is allowed."""
    from pipeswift_slurm.stats import median
    toml = copy_example(tmp_path / "ex", {"steps": "60", "checkpoint_interval": "0"})
    run = tmp_path / "run"
    proc = pswift("run", "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr[-3000:]
    times: list[float] = []       # rank 0's step times, in order
    ends: list[int] = []          # how many steps had ended when each profile was written
    for e in run_events(run):
        if e["event"] == "step":
            times.append(e["step_time"])
        elif e["event"] == "layer_profile":
            ends.append(len(times))
    assert ends, "no layer profile"
    w = relayout.DRIFT_WINDOW
    for before, after in zip(ends, ends[1:]):
        base = median(times[before:before + w])
        # the step that called for the profile: 4 steps before its last where the flags are
        # agreed at once (flagged, a step, 3 profiled), 5 where they are posted a step late
        nows = [median(times[:after - k][-w:]) for k in (4, 5)]
        assert any(abs(now - base) > 0.99 * relayout.DRIFT * base for now in nows), (before, after, base, nows)
