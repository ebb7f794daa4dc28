"""`pswift run` of a run of members (issue 62): each member a loop of its own, as its array
task's batch script, with real DeepSpeed ranks and no Slurm. A member whose ranks alone are
signalled leaves, the other trains on, and the member, started again as Slurm's requeue would,
rejoins and the run grows back to it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import PSWIFT, paced_example, run_events, step_losses, wait_steps
from pipeswift_slurm.local import member_ranks

pytestmark = [pytest.mark.deepspeed]

STEPS = 150


def test_a_member_signalled_alone_leaves_the_other_trains_on_and_it_rejoins(tmp_path: Path):
    toml = paced_example(tmp_path / "ex", steps=STEPS, members=2, nodes="[1, 2]")
    toml.write_text(toml.read_text().replace("member_wait_s = 120", "member_wait_s = 30"))
    ref = tmp_path / "reference"
    proc = subprocess.Popen([*PSWIFT, "run", "--run-dir", str(tmp_path / "run"), str(toml)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_steps(tmp_path / "run", 20, timeout=180)
        plan = str(tmp_path / "run" / "plan.json")
        ranks = member_ranks(plan, 1)
        assert len(ranks) == 1 and len(member_ranks(plan)) == 2, (ranks, member_ranks(plan))
        for pid in ranks:
            os.kill(pid, signal.SIGTERM)        # Slurm's preemption signals member 1's job alone
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    evs = run_events(tmp_path / "run")
    starts = [(e["nodes"], e["stages"]) for e in evs if e["event"] == "start"]
    assert [n for n, _ in starts] == [2, 1, 2], starts                        # left, then grown back
    ends = [e["reason"] for e in evs if e["event"] == "end"]
    assert ends == ["members_changed"] * (len(starts) - 1) + ["completed"], ends
    steps = [e["step"] for e in evs if e["event"] == "step"]
    assert sorted(steps) == list(range(1, STEPS + 1)), steps                  # every step once
    assert (tmp_path / "run" / "members" / "done").exists()
    left = sorted(p.name for p in (tmp_path / "run" / "members").glob("epoch-*/left-*"))
    assert left == ["left-1"], left                                            # member 1 left once
    # the losses of one uninterrupted 2-node run: bit for bit to the stop, within 1e-5 after
    assert subprocess.run([*PSWIFT, "run", "--run-dir", str(ref), "--nodes", "2", str(_as_one_job(toml))],
                          capture_output=True, timeout=300).returncode == 0
    ours, want = step_losses(tmp_path / "run"), step_losses(ref)
    k = [e for e in evs if e["event"] == "start"][1]["step"]
    assert {s: ours[s] for s in range(1, k + 1)} == {s: want[s] for s in range(1, k + 1)}
    far = {s: (ours[s], want[s]) for s in range(k + 1, STEPS + 1)
           if abs(float.fromhex(ours[s]) - float.fromhex(want[s])) > 1e-5 * abs(float.fromhex(want[s]))}
    assert not far, far


def test_a_member_back_too_late_to_pay_is_declined_and_gives_its_node_back(tmp_path: Path):
    """Member 1 leaves; back from the queue, growing onto it would not pay (the user gives up
    to 60 % of JCT for fewer node-hours, and 2 nodes step 44 % faster), so rank 0 declines it
    and it ends while member 0 trains on: its node is not held idle to the run's end (the
    workload bench's other users paid for that). grow_check_s is an hour: a run of members
    checks its waiting seats every 5 s whatever it says (files, not a Slurm query)."""
    toml = paced_example(tmp_path / "ex", steps=STEPS, members=2, nodes="[1, 2]")
    toml.write_text(toml.read_text().replace("member_wait_s = 120", "member_wait_s = 30")
                    .replace("grow_check_s = 5\n", "grow_check_s = 3600\njct_slack = 0.6\n"))
    run = tmp_path / "run"
    proc = subprocess.Popen([*PSWIFT, "run", "--run-dir", str(run), str(toml)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_steps(run, 20, timeout=240)
        for pid in member_ranks(str(run / "plan.json"), 1):
            os.kill(pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    evs = run_events(run)
    # the planner would run 1 node (jct_slack), but `pswift run` starts both members: its first
    # epoch waits for both (plan.json's members_at_once, the array's throttle in a Slurm job)
    assert json.loads((run / "plan.json").read_text())["members_at_once"] == 2
    assert [e["nodes"] for e in evs if e["event"] == "start"] == [2, 1], out[-3000:]   # no growth back
    assert sorted(e["step"] for e in evs if e["event"] == "step") == list(range(1, STEPS + 1))
    declined = list((run / "members").glob("epoch-*/declined-1"))
    assert len(declined) == 1, out[-3000:]
    assert "does not grow onto it" in out and "not taken" in out, out[-3000:]
    assert not list(declined[0].parent.glob("seat-1.json"))                     # its seat given up
    last_step = max(e["time"] for e in evs if e["event"] == "step")
    assert declined[0].stat().st_mtime < last_step - 1.0                        # while member 0 trained


def _as_one_job(toml: Path) -> Path:
    one = toml.parent / "one.toml"
    one.write_text(toml.read_text().replace("members = 2\n", "").replace("member_wait_s = 30\n", ""))
    return one



def test_terminating_pswift_run_stops_every_member_and_leaves_nothing_running(tmp_path: Path):
    """TERM to `pswift run` is the run cancelled: every member's ranks checkpoint at one step and
    stop, no member comes back, and a member waiting for an epoch stops waiting."""
    toml = paced_example(tmp_path / "ex", steps=STEPS, members=2, nodes="[1, 2]")
    run = tmp_path / "run"
    proc = subprocess.Popen([*PSWIFT, "run", "--run-dir", str(run), str(toml)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_steps(run, 10, timeout=180)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out[-3000:]
    assert member_ranks(str(run / "plan.json")) == []
    evs = run_events(run)
    stop = [e for e in evs if e["event"] == "checkpoint" and e["reason"] == "signal"]
    assert len(stop) == 1 and [e["reason"] for e in evs if e["event"] == "end"] == ["stopped"], evs[-3:]
    assert len([e for e in evs if e["event"] == "start"]) == 1 and not (run / "members" / "done").exists()
