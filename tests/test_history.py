"""History store: idempotent ingest of real runs, profiles and measured step times feeding the
planner, the learning loop's error report, and graceful degradation."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from helpers import copy_example, pswift
from pipeswift_slurm.autoplan import read_profile
from pipeswift_slurm.config import load_config
from pipeswift_slurm.history.store import History
from pipeswift_slurm.planning.costmodel import model_passes
from pipeswift_slurm.planning.simulate import simulate

pytestmark = [pytest.mark.deepspeed]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real local run of the example (12 steps), shared by the tests below."""
    d = tmp_path_factory.mktemp("hist")
    toml = copy_example(d / "ex", {"steps": "12", "checkpoint_interval": "0"})
    home = d / "home"
    run = d / "run"
    proc = pswift("run", "--run-dir", str(run), str(toml), env={"PSWIFT_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return toml, run, home


def test_ingest_is_idempotent_and_keeps_attempts_profiles_and_stats(trained, tmp_path):
    toml, run, home = trained
    db = tmp_path / "h.db"
    first = pswift("history", "ingest", str(run), "--db", str(db))
    assert first.returncode == 0 and "ingested 1 changed run directory; 0 Slurm attempt(s), 1 pswift job(s)" in first.stdout
    again = pswift("history", "ingest", str(run), "--db", str(db))
    assert "ingested 0 changed run directories; 0 Slurm attempt(s), 1 pswift job(s)" in again.stdout
    h = History(db)
    try:
        (a,) = list(h.db["attempts"].rows)
        assert (a["nodes"], a["stages"], a["ended"], a["end_step"], a["step_count"]) == (2, 2, "completed", 12, 11)
        assert a["step_p50"] <= a["step_p95"] and a["step_var"] >= 0
        # the hardware the launch measured at its start (pipeswift_launch.probe): the link
        # between its 2 stages, 2 ranks on this host sharing its memory and its cores
        assert (a["device"], a["ranks_per_host"], a["host_cores"]) == ("cpu", 2, os.cpu_count())
        assert 0 < a["p2p_latency_s"] < 0.05 and a["p2p_bandwidth"] > 1e6, a
        host_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        assert a["device_memory"] == host_memory // 2
        layers = sorted((r["layer"], r["seconds"]) for r in h.db["layer_profiles"].rows)
        assert [x[0] for x in layers] == list(range(6)) and all(x[1] > 0 for x in layers)
        # transformer blocks cost more than the embedding and the head
        assert min(x[1] for x in layers[1:5]) > max(layers[0][1], layers[5][1])
        # the engine's time outside the layers, from the launcher's instruction timing (2 stages)
        (o,) = list(h.db["pipe_overheads"].rows)
        assert (o["stages"], o["micro_batches"]) == (2, 4)
        assert o["send_s"] > 0 and o["step_overhead_s"] > 0 and o["overhead_s"] >= 0
        # sends of 8 x 32 x 128 floats and the optimizer of a 0.8 M-parameter model: far below a step
        assert o["send_s"] < a["step_p50"] / 8 and o["step_overhead_s"] < a["step_p50"]
        (job,) = list(h.db["jobs"].rows)
        assert job["predicted_step_s"] > 0 and job["actual_step_s"] > 0 and job["actual_jct_s"] > 0
        decisions = list(h.db["plan_decisions"].rows)  # every candidate the planner weighed
        assert decisions and sum(d["chosen"] for d in decisions) == 1
        assert all(d["jct_s"] is not None or d["rejected"] for d in decisions)
    finally:
        h.close()


def test_planner_uses_the_measured_profile_and_reports_its_error(trained, tmp_path):
    toml, run, home = trained
    env = {"PSWIFT_HOME": str(home), "PSWIFT_DB": str(tmp_path / "h.db")}
    proc = pswift("plan", str(toml), "--no-live", env=env)  # read-only: makes no database
    assert proc.returncode == 0 and "profile: toml" in proc.stdout, proc.stderr
    assert "hardware: links 50 us + 1.00 GB/s between stages, 16.00 GB per cpu rank (assumed)" in proc.stdout
    assert not (tmp_path / "h.db").exists()
    assert pswift("history", "ingest", env=env).returncode == 0   # (pswift sbatch learns by itself)
    proc = pswift("plan", str(toml), "--no-live", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "profile: history" in proc.stdout and "measured" in proc.stdout
    # the links and memory the launch measured, not the defaults
    h = History(tmp_path / "h.db")
    (a,) = list(h.db["attempts"].rows)
    h.close()
    assert (f"hardware: links {a['p2p_latency_s'] * 1e6:.0f} us + {a['p2p_bandwidth'] / 1e9:.2f} GB/s between "
            f"stages, {a['device_memory'] / 1e9:.2f} GB per cpu rank (measured by 1 recent launch(es))") in proc.stdout
    assert "model error over the last 1 planned job(s): step time" in proc.stdout
    d = json.loads(pswift("plan", str(toml), "--no-live", "--json", env=env).stdout)
    assert d["profile_source"] == "history" and d["chosen"]["estimate"]["step_source"] == "measured"
    assert d["model_error"][0]["actual_step_s"] > 0
    # beside the measured step, the one the model predicts from the profile that run measured
    e = d["chosen"]["estimate"]
    assert e["model_step_s"] > 0 and e["model_step_s"] != e["step_s"]
    beside = f"{e['step_s']:.4g} s/step, measured; the model predicts {e['model_step_s']:.4g} s"
    assert beside in proc.stdout
    sim = pswift("simulate", str(toml), "--schedule", "1f1b,zb-h1", env=env)
    assert sim.returncode == 0 and f"pswift plan's step of this layout under 1f1b: {beside}" in sim.stdout, sim.stderr
    # what it simulates: the passes the step model simulates, from the profile this run measured
    assert "stage times from the history's profile (measured)" in sim.stdout
    c = d["chosen"]
    prof = read_profile(load_config(toml), tmp_path / "h.db", lambda msg: None)
    f, b, _ = model_passes(prof, c["boundaries"], c["micro_batch_size"])
    assert prof.source == "history" and prof.overhead_s + prof.send_s > 0
    got = json.loads(pswift("simulate", str(toml), "--json", env=env).stdout)
    assert got["step_time"] == pytest.approx(simulate(f, b, c["micro_batches"]).step_time, rel=1e-9)
    bare = toml.with_name("bare.toml")    # no layer_costs: the measured profile is enough
    bare.write_text("\n".join(x for x in toml.read_text().splitlines() if not x.startswith("layer_costs")))
    sim = pswift("simulate", str(bare), env=env)
    assert sim.returncode == 0 and "stage times from the history's profile (measured)" in sim.stdout, sim.stderr
    # a 1F1B step measured is not a ZB-H1 one: the same layout under the other schedule is estimated
    zb = toml.with_name("zb.toml")
    zb.write_text(toml.read_text().replace("[pipeline]", '[pipeline]\nschedule = "zb-h1"'))
    z = json.loads(pswift("plan", str(zb), "--no-live", "--json", env=env).stdout)
    def layout(c: dict) -> tuple:
        return c["nodes"], c["stages"], c["micro_batches"], c["boundaries"]
    (same,) = [c for c in z["candidates"] if layout(c) == layout(d["chosen"])]
    assert same["estimate"]["step_source"] != "measured"


def test_corrupt_or_missing_db_degrades_with_a_warning(trained, tmp_path):
    toml, run, home = trained
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    proc = pswift("plan", str(toml), "--no-live", "--db", str(bad))
    assert proc.returncode == 0, proc.stderr
    assert "warning: history database" in proc.stderr and "planning without history" in proc.stderr
    assert "profile: toml" in proc.stdout and "Traceback" not in proc.stderr
    assert bad.read_bytes().startswith(b"this is not a database")  # nothing overwritten
    fresh = pswift("plan", str(toml), "--no-live", "--db", str(tmp_path / "new" / "h.db"))
    assert fresh.returncode == 0 and "profile: toml" in fresh.stdout
    assert not (tmp_path / "new").exists()                     # plan writes nothing


def test_locked_db_does_not_break_planning(trained, tmp_path):
    toml, run, home = trained
    db = tmp_path / "locked.db"
    History(db).close()
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        proc = pswift("plan", str(toml), "--no-live", "--db", str(db),
                      env={"PSWIFT_HOME": str(home)}, timeout=120)
    finally:
        holder.rollback()
        holder.close()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_layers_weight_share_measured_under_zb_h1_outlives_a_later_1f1b_profile(tmp_path):
    """A ZB-H1 run measures each layer's weight pass W: the planner reads W's share of the
    layer's seconds; a later 1F1B profile (which cannot measure W) renews the seconds and keeps
    the share; a model never run under ZB-H1 has none (the planner then assumes one)."""
    from helpers import run_dir
    prof = {"event": "layer_profile", "attempt": 0, "micro_batch_size": 1}
    zb = {**prof, "time": 12.5, "seconds": {"0": 0.2, "1": 400.0}, "weight_seconds": {"0": 0.05, "1": 100.0}}
    later = {**prof, "time": 20.0, "seconds": {"0": 0.3, "1": 500.0}}
    h = History(tmp_path / "h.db")
    try:
        h.ingest_run_dir(run_dir(tmp_path / "1f1b-only"))
        mkey = h.conn.execute("SELECT model_key FROM layer_profiles").fetchone()[0]
        assert h.layer_profile(mkey).weight_fraction == [None, None]
        h.ingest_run_dir(run_dir(tmp_path / "zb", [json.dumps(zb).encode()]))
        assert h.layer_profile(mkey).weight_fraction == [0.25, 0.25]
        h.ingest_run_dir(run_dir(tmp_path / "1f1b", [json.dumps(later).encode()]))
        got = h.layer_profile(mkey)
        assert got.seconds == [0.3, 500.0] and got.weight_fraction == [0.25, 0.25]
    finally:
        h.close()


def test_a_submission_passes_over_completed_jobs_in_the_registry_unread(tmp_path, monkeypatch):
    """Each submission ingests the user's registered runs: one the history holds as completed is
    passed over (its registry entry predates its end) even if its files changed; an entry
    written after that end (a new job reusing the id) is read and ingested."""
    from helpers import run_dir
    from pipeswift_slurm.history.rundir import register_job, state_dir
    monkeypatch.setenv("PSWIFT_HOME", str(tmp_path / "home"))
    done = run_dir(tmp_path / "done")           # completes at time 13.0 (helpers.GOOD), job 4242
    register_job("4242", done)
    os.utime(state_dir() / "jobs" / "4242.json", (5.0, 5.0))       # registered at its submission
    h = History(tmp_path / "h.db")
    try:
        assert h.ingest_registered() == 1
        with open(done / "events.jsonl", "a") as f:                # changed since: not read again
            f.write(json.dumps({"event": "step", "attempt": 0, "time": 14.0, "step": 3, "loss": 1.0}) + "\n")
        assert h.ingest_registered() == 0
        again = run_dir(tmp_path / "again")     # Slurm gave the id to a new job: its entry is newer
        register_job("4242", again)
        assert h.ingest_registered() == 1
        assert {r[0] for r in h.conn.execute("SELECT run_dir FROM jobs")} == {str(done), str(again)}
    finally:
        h.close()


def test_partition_preemption_history_raises_expected_loss(tmp_path):
    from pipeswift_slurm.history.store import History
    db = tmp_path / "h.db"
    h = History(db)
    recs = []
    for i in range(10):  # 10 jobs of 1 h on "low", every other one preempted once
        start = 1_700_000_000 + i * 10_000
        if i % 2:
            recs.append({"JOBID": str(i), "PARTITION": "low", "JOBSTATE": "PREEMPTED", "SUBMIT": start - 60,
                         "START": start, "END": start + 1800})
            start += 1900
        recs.append({"JOBID": str(i), "PARTITION": "low", "JOBSTATE": "COMPLETED", "SUBMIT": start - 60,
                     "START": start, "END": start + (1800 if i % 2 else 3600)})
    h.add_slurm_records(recs, "test")
    assert h.preemptions_per_hour("low", now=1_700_100_000) == pytest.approx(0.5)
    assert h.preemptions_per_hour("high", now=1_700_100_000) == 0.0
    assert h.preemptions_per_hour("low", now=1_700_100_000 + 40 * 86400) == 0.0  # older than 30 days
    h.close()


def test_a_preempted_plain_job_loses_its_whole_attempts_and_doctor_says_so(tmp_path):
    """No pswift checkpoints: each preempted attempt is lost whole (elapsed x CPUs); an attempt
    whose end is not on record makes the waste unknown, never 0."""
    from pipeswift_slurm.history.store import History
    from pipeswift_slurm.reports.jct import diagnose, job_reports
    h = History(tmp_path / "h.db")
    rec = {"CLUSTER": "c", "JOBNAME": "plain", "USERNAME": "bob", "PARTITION": "low", "PROCS": "4",
           "NODECNT": "1", "SUBMIT": 50}
    h.add_slurm_records([
        {**rec, "JOBID": "7", "START": 100, "END": 1900, "JOBSTATE": "PREEMPTED"},
        {**rec, "JOBID": "7", "START": 2000, "END": 2600, "JOBSTATE": "COMPLETED"},
        {**rec, "JOBID": "8", "START": 100, "JOBSTATE": "PREEMPTED"},
        {**rec, "JOBID": "8", "START": 300, "END": 400, "JOBSTATE": "COMPLETED"},
        {**rec, "JOBID": "9", "START": 100, "END": 200, "JOBSTATE": "REQUEUED"},
        {**rec, "JOBID": "9", "START": 300, "END": 400, "JOBSTATE": "COMPLETED"}], "test")
    by_id = {r.job_id: r for r in job_reports(h)}
    seven, eight, nine = by_id["7"], by_id["8"], by_id["9"]
    assert (seven.pswift, seven.preemptions, seven.cpu_hours_wasted) == (False, 1, 1800 * 4 / 3600)
    (finding,) = [f for f in diagnose(seven) if f.startswith("preemption:")]
    assert "no checkpoints pswift knows of: each stop lost its whole attempt, 2 CPU-hours" in finding
    assert "each stop checkpointed" not in finding
    assert eight.preemptions == 1 and eight.cpu_hours_wasted is None
    assert "an unknown amount of work" in " ".join(diagnose(eight))
    # `scontrol requeue` (the job's own, an admin's) is REQUEUED: its attempt's work is lost, but
    # it is no preemption (the partition's rate, which steers every user's plan, leaves it out)
    assert (nine.preemptions, nine.cpu_hours_wasted) == (0, 100 * 4 / 3600)
    assert h.preemptions_per_hour("low", now=2000) == pytest.approx(2 / ((1800 + 600 + 100 + 100 + 100) / 3600))


def test_a_pswift_jobs_waste_is_cpu_hours_on_slurms_count_of_each_attempts_cpus(tmp_path):
    """Lost steps x median step + the next attempt's setup, on the stopped attempt's CPUs as
    Slurm recorded them: the same unit as a plain job's waste; unknown without those records."""
    from pipeswift_slurm.reports.jct import job_reports
    h = History(tmp_path / "h.db")
    rec = {"CLUSTER": "c", "JOBID": "5", "JOBNAME": "p", "USERNAME": "u", "PARTITION": "low", "SUBMIT": 50,
           "WORK_DIR": "/r"}
    h.add_slurm_records([{**rec, "START": 100, "END": 200, "JOBSTATE": "PREEMPTED", "PROCS": "8", "NODECNT": "4"},
                         {**rec, "START": 300, "END": 400, "JOBSTATE": "COMPLETED", "PROCS": "4", "NODECNT": "2"}],
                        "test")
    job = h.conn.execute("INSERT INTO jobs (cluster, run_dir, job_id, name, user, partition, state, submit_time) "
                         "VALUES ('c', '/r', '5', 'p', 'u', 'low', 'COMPLETED', 50)").lastrowid
    h.conn.executemany("INSERT INTO attempts (job, attempt, nodes, stages, data_parallel, start_step, end_step, "
                       "ended, setup_s, step_p50) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, 0.5)",
                       [(job, 0, 4, 4, 0, 40, "preempted", 5.0), (job, 1, 2, 2, 38, 100, "completed", 10.0)])
    h.conn.commit()
    (rep,) = job_reports(h)
    assert rep.pswift and rep.preemptions == 1 and rep.steps_lost == 2
    assert rep.cpu_hours_wasted == pytest.approx((2 * 0.5 + 10.0) * 8 / 3600)
    h.conn.execute("DELETE FROM slurm_jobs WHERE start = 300")
    h.conn.commit()
    (rep,) = job_reports(h)
    assert rep.cpu_hours_wasted is None and rep.steps_lost == 2
    h.close()


def test_a_run_of_members_is_as_its_last_end_says_not_its_last_attempt_to_begin(tmp_path):
    """A run of members: each epoch's rank 0 writes the events as its own member job's attempt,
    so attempts of several jobs interleave in time. Member 1, requeued once (attempt 1), held
    rank 0 of a middle epoch; member 0 (attempt 0) held it at the end: the run completed, at the
    last end's time (before: the last attempt to begin, 'members_changed')."""
    from helpers import GOOD, run_dir
    start = {k: v for k, v in GOOD[0].items() if k not in ("time", "attempt", "step")}

    def ev(kind: str, job: str, attempt: int, t: float, **more) -> bytes:
        return json.dumps({"event": kind, "job_id": job, "attempt": attempt, "time": t, **more}).encode()
    evs = [ev("start", "11", 0, 10.0, step=0, **start), ev("end", "11", 0, 20.0, reason="members_changed", step=5),
           ev("start", "12", 1, 21.0, step=5, **start), ev("end", "12", 1, 30.0, reason="members_changed", step=9),
           ev("start", "11", 0, 31.0, step=9, **start), ev("end", "11", 0, 40.0, reason="completed", step=12)]
    run = run_dir(tmp_path / "run")
    (run / "events.jsonl").write_bytes(b"\n".join(evs) + b"\n")
    h = History(tmp_path / "h.db")
    try:
        h.ingest_run_dir(run)
        assert h.conn.execute("SELECT state, end_time FROM jobs").fetchall() == [("completed", 40.0)]
    finally:
        h.close()
