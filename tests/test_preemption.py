"""Preemption-safe training through the real local Slurm and real DeepSpeed (issue: preemption).

Every scenario compares against an uninterrupted run of the same steps: losses and final
weights must be bitwise equal (fp32 on CPU, one data-parallel rank, seed_layers: the split does
not change the arithmetic of any layer, so any stage count gives the same bits).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import (all_idle, copy_example, preempted_once, pswift, rank_process, reference, run_events,
                     slow_example, slurm_log, step_losses, wait_state, wait_steps)
from pipeswift_slurm.slurm import client as slurm

pytestmark = [pytest.mark.slurm, pytest.mark.deepspeed]

def final_weights(ckpt_dir: Path, step: int) -> dict:
    from pipeswift_launch import ckptfiles as checkpoint
    return checkpoint.read_all(ckpt_dir / f"step_{step:08d}")["model"]


def assert_same_weights(a: dict, b: dict) -> None:
    import torch
    assert a.keys() == b.keys() and a
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


@pytest.fixture(params=["partition", pytest.param("qos", marks=pytest.mark.every_version)])
def preemption(request, monkeypatch) -> tuple[list[str], str, str]:
    """(sbatch options of the preempting job, [job] lines of the preemptible one, its pipeline
    schedule) for the two common site set-ups: partition priority (partition high preempts low)
    on the main dev cluster, the job under ZB-H1; and QOS preemption (normal preempts standby,
    PreemptType=preempt/qos, with slurmdbd) on the accounting dev cluster, under 1F1B."""
    if request.param == "partition":
        request.getfixturevalue("cluster")
        return ["-p", "high"], "", "zb-h1"
    monkeypatch.setenv("SLURM_CONF", request.getfixturevalue("acct_cluster"))
    return ["--qos=normal"], 'qos = "standby"\n', "1f1b"


def status_once_forgotten(job: str, run: Path, tmp_path: Path, home: Path) -> None:
    """`pswift status` of a job the controller has purged (MinJobAge): from sacct, and with no
    sacct to ask, from the history, with the run's step, loss and log all the same (``home``:
    the PSWIFT_HOME that submitted it)."""
    deadline = time.time() + 150
    while subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True,
                         text=True).stdout.strip():
        assert time.time() < deadline, f"job {job} still known to the controller"
        time.sleep(2)
    text = pswift("status", job, env={"PSWIFT_HOME": str(home)}, check=True).stdout
    assert text.startswith(f"job {job}: COMPLETED (from sacct: Slurm has forgotten the job)\n"), text
    assert "\nstep 4/4, last loss " in text and f"\nlog: {run / f'slurm-{job}.out'}\n" in text, text
    db = tmp_path / "h.db"
    pswift("history", "ingest", "--sacct", "--db", str(db), env={"PSWIFT_HOME": str(home)}, check=True)
    no_sacct = tmp_path / "bin"
    no_sacct.mkdir()
    for tool in ("squeue", "scontrol", "sinfo"):
        (no_sacct / tool).symlink_to(shutil.which(tool))
    text = pswift("status", job, "--db", str(db), env={"PATH": str(no_sacct), "PSWIFT_HOME": str(home)},
                  check=True).stdout
    assert text.startswith(f"job {job}: COMPLETED (from the history: Slurm has forgotten the job)\n"), text
    assert "None" not in text


def test_preempted_4_stages_resume_on_2_nodes_with_2_stages(preemption, tmp_path, background_reference):
    """Preempted on 4 nodes (4 stages), resumed on 2 (2 stages) from the signal's checkpoint:
    every step's loss and the final weights are an uninterrupted 1F1B run's, bit for bit, for a
    job under 1F1B (QOS preemption) and under ZB-H1 (partition priority)."""
    preemptor, job_lines, schedule = preemption
    early = None
    if "qos" in job_lines:   # a short job first: by this test's end the controller forgot it
        early_run = tmp_path / "early-run"
        proc = pswift("sbatch", "--wait", "--run-dir", str(early_run),
                      str(copy_example(tmp_path / "early", {"steps": "4", "checkpoint_interval": "0"})),
                      env={"PSWIFT_HOME": str(tmp_path / "early-home")})   # its own history
        assert proc.returncode == 0 and "COMPLETED" in proc.stdout, (proc.stdout, proc.stderr)
        early = proc.stdout.split()[3]
        all_idle()   # its nodes back, or the job below would be planned on the 2 others
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": "50", "checkpoint_interval": "0"})
    toml.write_text(toml.read_text().replace("[job]\n", "[job]\n" + job_lines, 1)
                    .replace("[pipeline]\n", f'[pipeline]\nschedule = "{schedule}"\n', 1))
    # the uninterrupted run under 1F1B: ZB-H1's deferred weight gradients give the same bits
    ref_toml = toml.with_name("reference.toml")
    ref_toml.write_text(toml.read_text().replace(f'schedule = "{schedule}"', 'schedule = "1f1b"'))
    uninterrupted = background_reference(ref_toml, nodes=4)
    run = tmp_path / "run"
    followed: list = []
    st = preempted_once(toml, run, 8, preemptor, followed=followed)
    starts = [e for e in run_events(run, torn_ok=True) if e["event"] == "start"]
    assert [(e["stages"], e["schedule"]) for e in starts] == [(4, schedule), (2, schedule)]
    a0, a1 = st["attempts"]
    assert (a0["nodes"], a0["stages"], a0["ended"]) == (4, 4, "preempted")
    assert (a1["nodes"], a1["stages"], a1["ended"]) == (2, 2, "completed")
    # `pswift logs JOB -f`, started while the job was queued, printed every attempt's lines of the
    # one log the attempts append to, and returned once Slurm said the job ended (issue 25)
    ((rc, out, err),) = followed
    job = st["job_id"]
    assert rc == 0, err
    assert f"pswift: job {job} attempt 0 on" in out and f"pswift: job {job} attempt 1 on" in out, out[-3000:]
    assert out.rstrip().endswith(slurm_log(run).rstrip().splitlines()[-1])    # all of it, to the last line
    tail = pswift("logs", job, "--lines", "1", check=True).stdout
    assert tail.count("\n") == 1 and f"job {job} attempt 1 launcher exit 0" in tail
    assert a1["resumed_from"].endswith(f"step_{a0['end_step']:08d}")
    assert a1["start_step"] == a0["end_step"]  # no step lost: stopped at a step boundary
    assert st["restarts"] == 1 and st["step"] == 50
    ckpt = [e for e in run_events(run, torn_ok=True) if e["event"] == "checkpoint" and e["reason"] == "signal"]
    assert len(ckpt) == 1 and ckpt[0]["seconds"] < 20  # within GraceTime (20 s)
    ref = uninterrupted.wait()
    assert step_losses(run, torn_ok=True) == step_losses(ref, torn_ok=True)
    assert_same_weights(final_weights(run / "checkpoints", 50), final_weights(ref / "checkpoints", 50))
    if early is not None:
        status_once_forgotten(early, tmp_path / "early-run", tmp_path, tmp_path / "early-home")


def test_a_bf16_zero1_job_with_recompute_is_preempted_and_resumes_on_2_of_4_nodes(cluster, tmp_path):
    """The settings real jobs use, through real Slurm: bf16, ZeRO-1 over 2 data-parallel ranks,
    activation checkpointing, clipping and a cosine schedule; preempted on 4 nodes (2 stages x 2),
    resumed on 2 (2 stages x 1), the loss curve within 1e-2 of an uninterrupted run."""
    steps = 20   # ~1.4 s each here (bf16 matmuls and the recompute on CPU)
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": str(steps), "checkpoint_interval": "0",
                                          "stages": "2", "data_parallel": "None"})
    toml.write_text(toml.read_text().replace("data_parallel = None", "").replace("seed = 1\n", """seed = 1
precision = "bf16"
zero_stage = 1
activation_checkpoint_interval = 1
gradient_clipping = 1.0
lr_warmup_steps = 5
lr_decay = "cosine"
""", 1))
    run = tmp_path / "run"
    waited: list = []
    st = preempted_once(toml, run, 5, waited=waited)
    a0, a1 = st["attempts"]
    assert (a0["nodes"], a0["stages"], a0["ended"]) == (4, 2, "preempted")
    assert (a1["nodes"], a1["stages"], a1["ended"]) == (2, 2, "completed")
    assert a1["start_step"] == a0["end_step"]
    # `pswift sbatch --wait` said the preemption, the requeue, the second attempt and progress
    ((rc, out, err),) = waited
    job = st["job_id"]
    assert rc == 0, (out, err)
    assert re.search(r"(?m)^\d\d:\d\d:\d\d job \d+: ", out), out   # each line with its time
    out = re.sub(r"(?m)^\d\d:\d\d:\d\d ", "", out)
    for line in (f"job {job}: RUNNING", f"job {job}: attempt 0 on 4 node(s), 2 stage(s)",
                 f"job {job}: attempt 0 ended (preempted) at step {a0['end_step']}",
                 f"job {job}: requeued (restart 1)",
                 f"job {job}: attempt 1 on 2 node(s), 2 stage(s), from step {a0['end_step']}",
                 f"job {job}: COMPLETED", f"log: {run / f'slurm-{job}.out'}"):
        assert line in out.splitlines(), (line, out)
    assert re.search(rf"job {job}: step \d+/{steps}, ETA [\d.]+ (ms|s|min)\n", out), out
    starts = [e for e in run_events(run, torn_ok=True) if e["event"] == "start"]
    assert [(e["stages"], e["data_parallel"]) for e in starts] == [(2, 2), (2, 1)]
    ref = reference(toml, tmp_path, nodes=4)
    got, want = step_losses(run, torn_ok=True), step_losses(ref, torn_ok=True)
    assert sorted(got) == sorted(want) == list(range(1, steps + 1))
    g, w = ({k: float.fromhex(v) for k, v in d.items()} for d in (got, want))
    assert all(abs(g[s] - w[s]) <= 1e-2 * abs(w[s]) for s in w), [(s, g[s], w[s]) for s in w if g[s] != w[s]]
    assert w[steps] < w[1]


def _limits_of_each_attempt(job: str, timeout: float) -> tuple[str, dict[int, str]]:
    """Poll the job until it ends: (its final state, TimeLimit as Slurm held it while each
    attempt, by restart count, ran)."""
    deadline, seen = time.time() + timeout, {}
    while time.time() < deadline:
        show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        state = re.search(r"JobState=(\S+)", show)
        if state and state.group(1) == "RUNNING":
            seen[int(re.search(r"Restarts=(\d+)", show).group(1))] = re.search(r"TimeLimit=(\S+)", show).group(1)
        if state and state.group(1) in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}:
            return state.group(1), seen
        time.sleep(1)
    raise AssertionError(f"job {job} did not end within {timeout} s")


@pytest.mark.every_version
def test_a_prediction_too_short_reaches_its_limit_requeues_for_what_remains_and_completes(cluster, tmp_path,
                                                                                          background_reference):
    # [job] time is an hour, but the planner predicts seconds (the data's sleep, 4 x 0.25 s a step,
    # is the fault: the model knows nothing of it), so the job asks Slurm for 3 minutes (twice the
    # USR2 lead of ~71 s, rounded up). USR2 comes 71 s before the limit (Slurm may send it up to a
    # minute early): the first attempt trains 20-85 of the 110 steps (~115 s), checkpoints, and
    # requeues itself asking for the steps left at the wall time per step it measured (x 1.25, plus
    # a setup, a checkpoint, the lead and the slack): the second attempt completes.
    toml = slow_example(tmp_path / "ex", {"time": '"1:00:00"', "steps": "110", "checkpoint_interval": "0",
                                          "max_requeues": "6", "time_policy": '"predicted"'}, sleep_s=0.25)
    uninterrupted = background_reference(toml, nodes=2)
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    plan = json.loads((run / "plan.json").read_text())
    assert plan["time_limit_s"] == 180 and plan["time_written_s"] == 3600, plan["time_why"]
    assert f"#SBATCH --signal=USR2@{plan['signal_lead_s']}" in (run / "job.sbatch").read_text()
    state, limits = _limits_of_each_attempt(job, timeout=900)
    log = slurm_log(run)
    assert state == "COMPLETED", log[-3000:]
    st = json.loads(pswift("status", job, "--json", check=True).stdout)
    ended = [a["ended"] for a in st["attempts"]]
    assert len(ended) >= 2 and set(ended[:-1]) == {"time_limit"} and ended[-1] == "completed", st
    for prev, nxt in zip(st["attempts"], st["attempts"][1:]):
        assert nxt["start_step"] == prev["end_step"]  # no step lost across a requeue
    assert log.count("requeueing job") == len(ended) - 1 and st["restarts"] == len(ended) - 1
    asked = [int(m) for m in re.findall(r"the next attempt asks for (\d+) min", log)]
    assert len(asked) == len(ended) - 1 and all(3 <= a < 60 for a in asked), log[-3000:]
    assert limits.get(0) == "00:03:00" and limits.get(1) == f"00:{asked[0]:02d}:00", (limits, asked)
    assert st["step"] == 110
    ref = uninterrupted.wait()
    assert step_losses(run, torn_ok=True) == step_losses(ref, torn_ok=True)
    assert_same_weights(final_weights(run / "checkpoints", 110), final_weights(ref / "checkpoints", 110))


def test_kill_9_mid_checkpoint_restarts_in_the_allocation_from_the_previous_committed_one(cluster, tmp_path,
                                                                                          background_reference):
    """The last stage's writer is SIGKILLed inside the checkpoint of step 8 (its stage file on
    disk, no manifest): the same Slurm job starts its ranks again, drops the half-written
    checkpoint, resumes from step 4 and ends with the uninterrupted run's weights."""
    ckpt = tmp_path / "ckpt"
    toml = copy_example(tmp_path / "ex", {"steps": "12", "checkpoint_interval": "4"})
    toml.write_text(toml.read_text().replace("seed = 1", f'seed = 1\ncheckpoint_dir = "{ckpt}"'))
    uninterrupted = background_reference(copy_example(tmp_path / "ex2", {"steps": "12", "checkpoint_interval": "4"}),
                                         nodes=2)
    run = tmp_path / "run"
    proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml),
                  env={"PSWIFT_FAULT_KILL_IN_CHECKPOINT": "8"})
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED", slurm_log(run)[-3000:]
    assert slurm.job_info(job).restarts == 0
    log = slurm_log(run)
    assert "removed half-written checkpoint(s) step_00000008" in log
    assert "resumed from step_00000004" in log and "restart 1: launching again" in log
    starts = [e for e in run_events(run, torn_ok=True) if e["event"] == "start"]
    assert [(e["attempt"], e["step"]) for e in starts] == [(0, 0), (0, 4)]
    assert starts[1]["resumed_from"] == str(ckpt / "step_00000004")
    (crash,) = [e for e in run_events(run, torn_ok=True) if e["event"] == "crash"]
    assert (crash["how"], crash["rank"], crash["action"]) == ("signal 9", 1, "restart")
    # keep_checkpoints = 2: only the two newest committed ones remain
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000008", "step_00000012"]

    ref = uninterrupted.wait()
    assert step_losses(run, torn_ok=True) == step_losses(ref, torn_ok=True)
    assert_same_weights(final_weights(ckpt, 12), final_weights(ref / "checkpoints", 12))


@pytest.mark.every_version
def test_max_requeues_stops_a_job_preempted_twice_with_a_clear_reason(cluster, tmp_path):
    toml = slow_example(tmp_path / "ex", {"steps": "1000", "max_requeues": "1", "checkpoint_interval": "0"})
    run = tmp_path / "run"
    job = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), check=True).stdout.strip()
    highs = []
    try:
        for attempt in (0, 1):
            deadline = time.time() + 120
            while not any(e["event"] == "step" and e["attempt"] == attempt for e in run_events(run, torn_ok=True)):
                assert time.time() < deadline, slurm_log(run)
                time.sleep(0.3)
            nodes = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True,
                                   text=True).stdout.strip()
            highs.append(subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", nodes, "--exclusive",
                                         "-o", "/dev/null", "--wrap", "sleep 3"],
                                        capture_output=True, text=True, check=True).stdout.strip())
            if attempt == 0:
                wait_state(job, {"PENDING"}, timeout=60)
        # before 24.05 the launcher's exit 3 ends the job FAILED; from 24.05 Slurm would requeue
        # a preempted job itself, so the launcher forbids it and the job ends PREEMPTED
        final = "PREEMPTED" if slurm.requeues_preempted_jobs() else "FAILED"
        assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "PREEMPTED"}, timeout=120) == final
        assert slurm.job_info(job).restarts == 1
    finally:
        subprocess.run(["scancel", *highs])
    log = slurm_log(run)
    assert "this was attempt 1 and max_requeues = 1 is spent: not requeueing" in log, log[-2000:]
    ends = [e for e in run_events(run, torn_ok=True) if e["event"] == "end"]
    assert [(e["attempt"], e["reason"], e["requeue"]) for e in ends] == [(0, "preempted", True),
                                                                          (1, "preempted", False)]


def test_a_stopped_rank_is_found_and_the_ranks_restart_in_the_allocation(cluster, tmp_path):
    """A rank alive to the kernel but making no progress (SIGSTOP: no error, no exit) is found by
    the watchdog, named, and treated as a fault: the ranks start again in the same allocation
    from the last committed checkpoint (issue 23; a second hang on that node would requeue
    without it: test_decide)."""
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": "60", "checkpoint_interval": "5"})
    toml.write_text(toml.read_text().replace("seed = 1", "seed = 1\nhang_timeout_min_s = 8\nhang_timeout_factor = 10"))
    run = tmp_path / "run"
    job = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml), check=True).stdout.strip()
    wait_steps(run, 12)
    pid, node = rank_process(run, 2)
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300) == "COMPLETED", slurm_log(run)[-3000:]
    (crash,) = [e for e in run_events(run, torn_ok=True) if e["event"] == "crash"]
    assert (crash["how"], crash["rank"], crash["node"], crash["action"]) == ("hung", 2, node, "restart"), crash
    assert f"rank 2 on node {node} stopped running" in crash["error"]
    # found within its limit (max(8 s, 10 x the p95 step): CI's three streams on two cores made
    # steps of 2-3 s, so a limit of 8 s did not hold there), the watchdog's 1 s ticks, srun's kill
    limit = float(re.search(r"\(limit ([0-9.]+) s", crash["error"]).group(1))
    assert limit >= 8 and crash["time"] - t_stop < limit + 15, (limit, crash["time"] - t_stop)
    assert slurm.job_info(job).restarts == 0            # the same Slurm job: no requeue
    st = json.loads(pswift("status", job, "--json", check=True).stdout)
    (a0,) = st["attempts"]
    assert (a0["nodes"], a0["ended"]) == (4, "completed") and [c["how"] for c in a0["crashes"]] == ["hung"]
    assert "hung" in pswift("status", job, check=True).stdout
    ref = reference(toml, tmp_path, nodes=4)
    assert step_losses(run, torn_ok=True) == step_losses(ref, torn_ok=True)


def test_a_storm_of_preemptions_loses_at_most_an_interval_each_and_ends_bitwise_equal(cluster, tmp_path,
                                                                                      background_reference):
    """Three preemptions, the first and third at random steps, the second while a periodic
    checkpoint is half written (stage files on disk, no manifest yet): the job completes with the
    uninterrupted run's weights, each resume starts from a committed checkpoint at most one
    interval back.
    (Three rather than five: each one more is a requeue, ~15 s of CI, and tests nothing new.)"""
    import random
    rng = random.Random(7)
    interval, steps, preemptions = 5, 70, 3
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": str(steps), "max_requeues": "8",
                                          "checkpoint_interval": str(interval)})
    uninterrupted = background_reference(toml, nodes=4)
    run = tmp_path / "run"
    job = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml),
                 env={"PSWIFT_FAULT_SLOW_CHECKPOINT": "20:4"}, check=True).stdout.strip()
    ckpt = run / "checkpoints"
    highs = []
    try:
        for k in range(preemptions):
            attempt = k
            deadline = time.time() + 180
            if k == 1:   # inside the checkpoint of step 20: its stage files, no manifest yet
                half = ckpt / "step_00000020"
                while not (list(half.glob("stage_*.safetensors")) and not (half / "MANIFEST.json").exists()):
                    assert time.time() < deadline, slurm_log(run)[-2000:]
                    time.sleep(0.05)
            else:
                first = min([e["step"] for e in run_events(run, torn_ok=True) if e["event"] == "start" and e["attempt"] == attempt] or [0])
                target = first + rng.randint(2, 6)
                while not any(e["event"] == "step" and e["attempt"] == attempt and e["step"] >= target
                              for e in run_events(run, torn_ok=True)):
                    assert time.time() < deadline, slurm_log(run)[-2000:]
                    time.sleep(0.1)
            highs.append(subprocess.run(["sbatch", "--parsable", "-p", "high", "-N2", "--exclusive", "-o",
                                         "/dev/null", "--wrap", "sleep 1"],
                                        capture_output=True, text=True, check=True).stdout.strip())
            while not any(e["event"] == "end" and e["attempt"] == attempt for e in run_events(run, torn_ok=True)):
                assert time.time() < deadline, slurm_log(run)[-2000:]
                time.sleep(0.2)
        assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300) == "COMPLETED", slurm_log(run)[-3000:]
    finally:
        subprocess.run(["scancel", *highs])
    evs = run_events(run, torn_ok=True)
    ends = [e for e in evs if e["event"] == "end"]
    assert [e["reason"] for e in ends] == ["preempted"] * preemptions + ["completed"], ends
    committed_before = set()
    for e in evs:   # every resume loads a checkpoint committed earlier, never a partial one
        if e["event"] == "checkpoint":
            committed_before.add(e["path"])
        elif e["event"] == "start" and e["resumed_from"]:
            assert e["resumed_from"] in committed_before, e
    st = json.loads(pswift("status", job, "--json", check=True).stdout)
    for prev, nxt in zip(st["attempts"], st["attempts"][1:]):
        assert prev["end_step"] - interval <= nxt["start_step"] <= prev["end_step"], (prev, nxt)
    assert st["restarts"] == preemptions and st["step"] == steps
    ref = uninterrupted.wait()
    assert step_losses(run, torn_ok=True) == step_losses(ref, torn_ok=True)
    assert_same_weights(final_weights(run / "checkpoints", steps), final_weights(ref / "checkpoints", steps))
