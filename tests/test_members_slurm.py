"""A run made of members (issue 62) through the real local Slurm and real DeepSpeed: a job array
of two 1-node members trains as one run; a higher-priority job preempts one member, and the
other trains on in its own allocation, never leaving the queue."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from helpers import CLUSTER_DB, bring_back, paced_example, pswift, run_events, slow_example, slurm_log, step_losses, wait_steps

pytestmark = [pytest.mark.slurm, pytest.mark.deepspeed, pytest.mark.every_version]


def members_of(array: str) -> dict[int, dict[str, str]]:
    """Each array task's own job id, state, node and restart count (scontrol, one line a task)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", array], capture_output=True, text=True,
                         timeout=30).stdout
    got = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("ArrayTaskId", "").isdigit():
            got[int(fields["ArrayTaskId"])] = fields
    return got


def wait_members(array: str, states: set[str], timeout: float = 300) -> dict[int, dict[str, str]]:
    deadline = time.time() + timeout
    while True:
        got = members_of(array)
        if got and all(m["JobState"] in states for m in got.values()):
            return got
        assert time.time() < deadline, {t: m["JobState"] for t, m in got.items()}
        time.sleep(1)


def test_a_preempted_member_leaves_and_the_other_trains_on_in_its_own_allocation(cluster, tmp_path,
                                                                                background_reference):
    """Two members of one node each train steps 1..k as 2 stages; a high-priority job takes
    member 1's node; member 0 commits the stop's checkpoint with it, then trains on alone (1
    stage) from step k + 1 in its own allocation (Restarts=0), and the run completes; every step
    trained once, each loss the uninterrupted 2-node run's (bit for bit to the stop, on 1 stage
    after it within the 1- and 2-stage runs' own difference). Member 1, requeued, ends without
    training again (the run is done, or growing onto it would not pay: declined), or, back on a
    free node before member 0 launched again, trains in that next epoch beside it."""
    toml = slow_example(tmp_path / "ex", {"nodes": "[1, 2]", "steps": "40", "checkpoint_interval": "0"})
    # members on nodes of their own (the dev cluster's nodes would hold both): a node's preemption takes one
    toml.write_text(toml.read_text().replace("[resources]\n", "[resources]\nmembers = 2\nmember_wait_s = 120\n", 1)
                    .replace("[job]\n", '[job]\nsbatch_options = ["--exclusive"]\n', 1))
    uninterrupted = background_reference(toml, nodes=2)
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr
    array = proc.stdout.strip()
    high = None
    try:
        wait_steps(run, 8, timeout=240)
        running = members_of(array)
        node1 = running[1]["NodeList"]
        job0, job1 = running[0]["JobId"], running[1]["JobId"]
        high = subprocess.run(["sbatch", "--parsable", "-p", "high", "-N1", "--exclusive", f"--nodelist={node1}",
                               "-o", "/dev/null", "--wrap", "sleep 300"],
                              capture_output=True, text=True, check=True).stdout.strip()
        deadline = time.time() + 240
        while members_of(array)[0]["JobState"] != "COMPLETED":
            assert time.time() < deadline, slurm_log(run)[-4000:]
            time.sleep(1)
        ended = members_of(array)
        assert ended[0]["Restarts"] == "0" and ended[0]["JobId"] == job0          # never left the queue
        assert ended[1]["JobId"] == job1 and ended[1]["Restarts"] == "1"          # requeued once, by the preemption
    finally:
        if high:
            subprocess.run(["scancel", high], timeout=30)
    final = wait_members(array, {"COMPLETED", "CANCELLED"})
    assert final[1]["Restarts"] == "1", slurm_log(run)[-4000:]
    log = slurm_log(run)
    # member 1 still queued when member 0 trained the last step: the run cancels it (it would have
    # waited for a node ahead of other users' jobs only to find the run done); the run reads COMPLETED
    cancelled = final[1]["JobState"] == "CANCELLED"
    assert final[0]["JobState"] == "COMPLETED" and (not cancelled or f"its members still queued (array {array}) "
                                                    "are cancelled" in log), (final, log[-4000:])
    assert json.loads(pswift("status", array, "--json", check=True).stdout)["state"] == "COMPLETED"
    # member 1, requeued, comes back after the run is done; or (a node free sooner, as in CI) while
    # member 0 trains on, and is declined (on this host 2 nodes step under 10 % faster than 1: it
    # gives its node back); or, back on a free node before member 0's relaunch, it sits in that
    # next epoch with it (CI under load: the relaunch took 10 s): the run goes on on 2 nodes
    rejoined = "member 1 trains in epoch 1 with members 0,1" in log
    assert (rejoined or cancelled or "the run has trained every step; this member ends" in log
            or "the run does not grow onto it" in log and "member(s) 1 not taken" in log), log[-4000:]
    evs = run_events(run, torn_ok=True)
    starts = [e for e in evs if e["event"] == "start"]
    assert [(e["nodes"], e["stages"]) for e in starts] == [(2, 2), (2, 2) if rejoined else (1, 1)], starts
    assert starts[1]["job_id"] == job0 and starts[0]["job_id"] == job0   # member 0 holds rank 0 both times
    steps = [e["step"] for e in evs if e["event"] == "step"]
    assert sorted(steps) == list(range(1, 41)) and len(steps) == 40      # every step once
    stop = [e for e in evs if e["event"] == "checkpoint" and e["reason"] == "signal"]
    assert len(stop) == 1 and starts[1]["resumed_from"].endswith(f"step_{stop[0]['step']:08d}")
    assert 8 <= stop[0]["step"] < 40
    # the same bits while the layout is the reference's; on 1 stage after it, within what an
    # uninterrupted 1-stage run differs from a 2-stage one by (their reductions part from step 28
    # of this example by up to 1.1e-4; a step lost or run twice moves the loss by ~1e-2)
    ours, ref = step_losses(run, torn_ok=True), step_losses(uninterrupted.wait(), torn_ok=True)
    k = stop[0]["step"]
    assert {s: ours[s] for s in range(1, k + 1)} == {s: ref[s] for s in range(1, k + 1)}
    far = {s: (float.fromhex(ours[s]), float.fromhex(ref[s])) for s in range(k + 1, 41)
           if abs(float.fromhex(ours[s]) - float.fromhex(ref[s])) > 1e-3 * abs(float.fromhex(ref[s]))}
    assert not far, far
    ends = [e for e in evs if e["event"] == "end"]
    assert ends[0]["reason"] == "members_changed" and ends[-1]["reason"] == "completed", ends
    in_history_as_one_run(run, array, {0: job0, 1: job1}, requeued={1},
                          states={0: "COMPLETED", 1: final[1]["JobState"]})


def test_a_run_done_with_a_member_still_queued_cancels_it_and_reads_completed(cluster, tmp_path):
    """Member 1 preempted while every other node is held: requeued, it waits in the queue while
    member 0 trains the run's last step. The run then cancels it (a member back only to find the
    run done would wait for a node ahead of other users' jobs: the workload bench's finished runs
    kept such members queued for minutes); nothing of the array is left in the queue, member 1
    ends CANCELLED, and the run reads COMPLETED in `pswift status` (from all its tasks)."""
    toml = slow_example(tmp_path / "ex", {"nodes": "[1, 2]", "steps": "60", "checkpoint_interval": "0"})
    toml.write_text(toml.read_text().replace("[resources]\n", "[resources]\nmembers = 2\nmember_wait_s = 120\n", 1)
                    .replace("[job]\n", '[job]\nsbatch_options = ["--exclusive"]\n', 1))
    run = tmp_path / "run"
    array = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), check=True).stdout.strip()
    held = []
    try:
        wait_steps(run, 6, timeout=240)
        running = members_of(array)
        others = 4 - len({m["NodeList"] for m in running.values()})   # the dev cluster's other nodes
        held.append(subprocess.run(["sbatch", "--parsable", "-p", "low", f"-N{others}", "--exclusive", "-o", "/dev/null",
                                    "--wrap", "sleep 300"], capture_output=True, text=True, check=True,
                                   timeout=30).stdout.strip())
        held.append(preempt(running[1]["NodeList"], 300))
        deadline = time.time() + 120
        while members_of(array)[1]["JobState"] != "PENDING":   # requeued, with no node to go to
            assert time.time() < deadline, members_of(array)
            time.sleep(1)
        # the run trains on member 0 whichever task holds the array's id (member 1, queued, here)
        assert json.loads(pswift("status", array, "--json", check=True).stdout)["state"] == "RUNNING"
        final = wait_members(array, {"COMPLETED", "CANCELLED"}, timeout=240)
    finally:
        subprocess.run(["scancel", *held], timeout=30)
    log = slurm_log(run)
    assert final[0]["JobState"] == "COMPLETED" and final[0]["Restarts"] == "0", (final, log[-3000:])
    assert final[1]["JobState"] == "CANCELLED" and final[1]["Restarts"] == "1", (final, log[-3000:])
    assert f"its members still queued (array {array}) are cancelled" in log, log[-3000:]
    assert not subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True, timeout=30).stdout.strip()
    assert json.loads(pswift("status", array, "--json", check=True).stdout)["state"] == "COMPLETED"
    steps = [e["step"] for e in run_events(run, torn_ok=True) if e["event"] == "step"]
    assert sorted(steps) == list(range(1, 61))


def in_history_as_one_run(run: Path, array: str, jobs: dict[int, str], requeued: set[int],
                          states: dict[int, str] | None = None) -> None:
    """The installed jobcomp plugin, at each member's end, ties it to the run: one pswift job
    (the array's id) for the run directory, and each member's Slurm job by its task, with its
    final state (``states``; COMPLETED each by default)."""
    states = states or {t: "COMPLETED" for t in jobs}
    db = sqlite3.connect(CLUSTER_DB)
    deadline = time.time() + 60
    while True:
        ended = db.execute("SELECT COUNT(DISTINCT job_id) FROM slurm_jobs WHERE array_job_id = ? AND state IN "
                           "('COMPLETED', 'CANCELLED')", [array]).fetchone()[0]
        if ended == len(jobs) or time.time() > deadline:
            break
        time.sleep(1)
    ids = sorted({array, *jobs.values()})   # (the run directory's path may have held other jobs before)
    runs = db.execute(f"SELECT job_id, state FROM jobs WHERE run_dir = ? AND job_id IN ({', '.join('?' * len(ids))})",
                      [str(run), *ids]).fetchall()
    assert runs == [(array, "completed")], runs
    shown = json.loads(pswift("history", "show", array, "--db", str(CLUSTER_DB), "--json", check=True).stdout)
    got = {m["task"]: (m["job_id"], m["state"], m["requeued"]) for m in shown["members"]}
    assert {t: g[:2] for t, g in got.items()} == {t: (j, states[t]) for t, j in jobs.items()}, shown["members"]
    assert all((g[2] >= 1) == (t in requeued) for t, g in got.items()), shown["members"]



#: growing back must pay when the second member returns: 1 stage x 4 data-parallel steps about
#: 0.1 s faster than 3 stages, and growth needs 2x its relaunch (setup about 4 s on a quiet host,
#: 10-15 s under CI's three streams on two cores) saved over the steps left. At 300 steps a member
#: back late in a loaded CI stream was, rightly, declined (4 -> 3 -> 3); 600 leaves some 500 at its return.
STEPS = 600


def preempt(node: str, hold_s: int) -> str:
    """A high-priority exclusive job on ``node`` for ``hold_s`` seconds: the member there is preempted."""
    return subprocess.run(["sbatch", "--parsable", "-p", "high", "-N1", "--exclusive", f"--nodelist={node}",
                           "-o", "/dev/null", "--wrap", f"sleep {hold_s}"],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def hold_until_relaunched_without(run: Path, node: str, timeout: float = 240) -> str:
    """Preempt the member on ``node`` and hold the node until the members left have launched an
    epoch on fewer than the dev cluster's 4 nodes; then free it. (A fixed 10 s hold raced the
    relaunch: in a loaded CI stream the survivors took longer than that to launch, the requeued
    member was back in time to sit in their epoch, and the run never trained on fewer nodes.)"""
    before = sum(e["event"] == "start" for e in run_events(run, torn_ok=True))
    high = preempt(node, 900)
    deadline = time.time() + timeout
    try:
        while not [e for e in [e for e in run_events(run, torn_ok=True) if e["event"] == "start"][before:]
                   if e["nodes"] < 4]:
            assert time.time() < deadline, slurm_log(run)[-3000:]
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", high], timeout=30)
    return high


def quiet_seconds(evs: list[dict]) -> list[float]:
    """Per epoch that ended for a change of members: seconds from its last step to the next step."""
    steps = [e for e in evs if e["event"] == "step"]
    out = []
    for end in (e for e in evs if e["event"] == "end" and e["reason"] == "members_changed"):
        last = max(e["time"] for e in steps if e["step"] == end["step"])
        out.append(min(e["time"] for e in steps if e["step"] == end["step"] + 1) - last)
    return out


def test_four_members_two_preempted_at_different_steps_the_run_completes_and_grows_back(cluster, tmp_path,
                                                                                      background_reference):
    """Four members of one node each (every node of the dev cluster). A high-priority job takes
    member 1's node at step 8 and another member 2's some 25 steps later, each until the
    members left have launched without it: the members left train on from each stop's step, in their own allocations (members 0 and 3:
    Restarts=0); each preempted member, requeued, starts again when its preemptor ends, sits in
    the next epoch, and the run grows back to it at a step boundary. The run completes with every
    step once; each loss is the uninterrupted 4-node run's, bit for bit to the first stop, and
    within 1e-5 relative after it (the issue's bound: another layout's all-reduce sums in another
    order; 1.6e-7 measured across 4 -> 3 -> 4 nodes). The layers sleep their cost
    (bench/workload.py's), so more nodes step faster, as on machines of their own."""
    toml = paced_example(tmp_path / "ex", steps=STEPS, members=4, nodes="[2, 4]")   # growing back pays: steps left
    uninterrupted = background_reference(toml, nodes=4)
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr
    array = proc.stdout.strip()
    highs = []
    try:
        wait_steps(run, 8, timeout=240)
        highs.append(hold_until_relaunched_without(run, members_of(array)[1]["NodeList"]))
        first = max(e["step"] for e in run_events(run, torn_ok=True) if e["event"] == "step")
        wait_steps(run, first + 25, timeout=240)
        highs.append(hold_until_relaunched_without(run, members_of(array)[2]["NodeList"]))
        final = wait_members(array, {"COMPLETED"}, timeout=400)
    finally:
        subprocess.run(["scancel", *highs], timeout=30)
    # the survivors never left the queue; a preempted member was requeued once, or twice where
    # Slurm's preemption requeue and the member's own came apart under load (25.11, CI: 2)
    restarts = [int(final[t]["Restarts"]) for t in range(4)]
    assert restarts[0] == restarts[3] == 0 and 1 <= restarts[1] <= 2 and 1 <= restarts[2] <= 2, \
        (restarts, slurm_log(run)[-4000:])
    in_history_as_one_run(run, array, {t: final[t]["JobId"] for t in range(4)}, requeued={1, 2})
    evs = run_events(run, torn_ok=True)
    starts = [e for e in evs if e["event"] == "start"]
    nodes = [e["nodes"] for e in starts]
    declined = [line for line in slurm_log(run).splitlines() if "not taken" in line or "not growing" in line]
    assert nodes[0] == 4 and 3 in nodes and nodes[-1] == 4 and len(nodes) >= 4, (nodes, declined, slurm_log(run)[-3000:])
    assert len([e for e in evs if e["event"] == "grow"]) >= 1
    reasons = [e["reason"] for e in evs if e["event"] == "end"]
    assert reasons == ["members_changed"] * (len(starts) - 1) + ["completed"], reasons
    steps = [e["step"] for e in evs if e["event"] == "step"]
    assert sorted(steps) == list(range(1, STEPS + 1))                           # every step once
    status = pswift("status", array, check=True).stdout
    assert "members: epoch " in status and "on 4 node(s) (done)\n" in status and status.count(" (in it): job ") == 4
    quiet = quiet_seconds(evs)
    # a relaunch in place (the survivors' Restarts=0 above: never the queue), prompt: beyond the next
    # launch's own setup, the checkpoint, the seats, srun and the first step take about 5-6 s on a
    # quiet host (quiet 9-10 s in all); CI's three streams on two cores stretch everything 2-3x
    # (19-31 s in all), so the bound is on what is not setup, with that room
    beyond = [q - float(s.get("setup_s") or 0.0) for q, s in zip(quiet, starts[1:])]
    assert len(quiet) == len(starts) - 1 and max(beyond) < 30, (quiet, beyond)
    ours, ref = step_losses(run, torn_ok=True), step_losses(uninterrupted.wait(), torn_ok=True)
    k = starts[1]["step"]
    assert {s: ours[s] for s in range(1, k + 1)} == {s: ref[s] for s in range(1, k + 1)}
    far = {s: (ours[s], ref[s]) for s in range(k + 1, STEPS + 1)
           if abs(float.fromhex(ours[s]) - float.fromhex(ref[s])) > 1e-5 * abs(float.fromhex(ref[s]))}
    assert not far, far


@pytest.mark.parametrize("how", ["pswift cancel", "scancel"])
def test_cancelling_the_run_ends_every_member(cluster, tmp_path, how):
    """`pswift cancel JOB` and `scancel` of the array each end every member: each one's ranks
    stop together, each member's first rank finds its job cancelled (not preempted), nothing is
    requeued and nothing is left running; `pswift status` of the array shows each member."""
    toml = paced_example(tmp_path / "ex", steps=400)
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr
    array = proc.stdout.strip()
    wait_steps(run, 5, timeout=240)
    if how == "scancel":
        subprocess.run(["scancel", array], check=True, timeout=30)
    else:
        pswift("cancel", array, check=True)
    final = wait_members(array, {"CANCELLED", "COMPLETED"}, timeout=120)
    assert all(m["Restarts"] == "0" for m in final.values()), final
    assert not subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True, timeout=30).stdout.strip()
    evs = run_events(run, torn_ok=True)
    assert [e["reason"] for e in evs if e["event"] == "end"] == ["cancelled"], slurm_log(run)[-3000:]
    assert max(e["step"] for e in evs if e["event"] == "step") < 400
    status = pswift("status", array, check=True).stdout   # the run, and each member's job and node
    assert "members: epoch 0 on 2 node(s)\n" in status, status
    for t in (0, 1):
        assert f"  member {t} (in it): job {final[t]['JobId']} on {final[t]['NodeList']}\n" in status, status


def kill_node_of(job_id: str, node: str) -> None:
    """``node`` dies without a word: its slurmd and every process of member job ``job_id`` on it
    (its batch script, step daemons and rank) killed; Slurm is not told."""
    import os
    import signal

    import psutil

    from helpers import CLUSTER_DIR
    doomed = {int((CLUSTER_DIR / "run" / f"slurmd-{node}.pid").read_text())}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if f"[{job_id}." in " ".join(p.info["cmdline"] or []) or p.environ().get("SLURM_JOB_ID") == job_id:
                doomed.add(p.pid)
        except psutil.Error:
            continue
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_member_whose_node_dies_without_a_word_is_left_behind_within_a_minute(cluster, tmp_path):
    """Member 1's node dies silently (slurmd and all its job's processes killed, Slurm not told):
    member 0's ranks lose their peer, launch again in their allocation (Restarts=0), sit in the
    next epoch, wait members.REJOIN_WAIT_S for member 1, which never comes, and train on alone
    from the newest committed checkpoint; the run completes, every step trained, within a minute
    of the death to member 0's next start."""
    steps = 120
    toml = paced_example(tmp_path / "ex", steps=steps)
    toml.write_text(toml.read_text().replace("checkpoint_interval = 0", "checkpoint_interval = 10"))
    run = tmp_path / "run"
    array = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), check=True).stdout.strip()
    wait_steps(run, 25, timeout=240)
    running = members_of(array)
    node = running[1]["NodeList"]
    try:
        died = time.time()
        kill_node_of(running[1]["JobId"], node)
        deadline = time.time() + 300
        while members_of(array)[0]["JobState"] != "COMPLETED":
            assert time.time() < deadline, slurm_log(run)[-4000:]
            time.sleep(1)
        assert members_of(array)[0]["Restarts"] == "0"
    finally:
        subprocess.run(["scancel", array], timeout=30)
        bring_back(node)
    evs = run_events(run, torn_ok=True)
    starts = [e for e in evs if e["event"] == "start"]
    assert [e["nodes"] for e in starts] == [2, 1], slurm_log(run)[-4000:]
    assert starts[1]["resumed_from"] and starts[1]["step"] % 10 == 0 and starts[1]["step"] >= 20
    assert starts[1]["time"] - starts[1]["setup_s"] - died <= 60, (starts[1], died)
    assert sorted(step_losses(run, torn_ok=True)) == list(range(1, steps + 1))
    assert [e["reason"] for e in evs if e["event"] == "end"][-1] == "completed"


def test_members_beyond_the_planners_node_count_wait_in_the_array_until_growing_onto_them_pays(cluster, tmp_path):
    """Two of the dev cluster's four nodes held by other jobs at submission: the planner chooses
    the two free ones, and the array of four one-node members runs two at once (``%2``): the
    other two wait as the array's, not ahead of other users' jobs for every node that frees.
    When the holders end, rank 0 finds growing onto the freed nodes pays, lets the array run
    more at once, and the run grows onto them in place; it completes with every step once."""
    holders = [subprocess.run(["sbatch", "--parsable", "-p", "low", "-N1", "--exclusive", "-t", "10", "-o", "/dev/null",
                               "--wrap", "sleep 600"], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip() for _ in range(2)]
    try:
        toml = paced_example(tmp_path / "ex", steps=STEPS, members=4, nodes="[2, 4]")
        run = tmp_path / "run"
        proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml))
        assert proc.returncode == 0, proc.stderr
        array = proc.stdout.strip()
        wait_steps(run, 10, timeout=240)
        tasks = subprocess.run(["squeue", "-h", "-r", "-j", array, "-o", "%K %T %r"], capture_output=True, text=True,
                               timeout=30).stdout.split("\n")
        held = sorted(line.split()[0] for line in tasks if line.endswith("JobArrayTaskLimit"))
        assert held == ["2", "3"], (tasks, (run / "plan.json").read_text()[:400])
    finally:
        subprocess.run(["scancel", *holders], timeout=30)
    final = wait_members(array, {"COMPLETED"}, timeout=400)
    log = slurm_log(run)
    assert f"members: array {array} lets " in log, log[-3000:]
    assert all(final[t]["Restarts"] == "0" for t in range(4)), (final, log[-3000:])
    evs = run_events(run, torn_ok=True)
    nodes = [e["nodes"] for e in evs if e["event"] == "start"]
    assert nodes[0] == 2 and nodes[-1] == 4, (nodes, log[-3000:])
    assert sorted(e["step"] for e in evs if e["event"] == "step") == list(range(1, STEPS + 1))
    assert json.loads(pswift("status", array, "--json", check=True).stdout)["state"] == "COMPLETED"
