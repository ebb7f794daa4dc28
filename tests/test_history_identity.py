"""Identity from Slurm only (issue 24): a plan's queue waits come from Slurm's own submit and
start times, never from a user's plan.json; its step-model errors from its own user's runs."""

from __future__ import annotations

import json

import pytest

from pipeswift_slurm.history.store import History
from pipeswift_slurm.history.rows import Owner

from helpers import H, T0, rec


def _run(tmp_path, name: str, user: str, predicted: float, actual: float,
         measured: dict | None = None) -> tuple[str, Owner]:
    run = tmp_path / name
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({
        "version": 1, "job_name": name, "partition": "low", "submitted_at": 1.0,   # a forged submit
        "training": {"steps": 2}, "model": {"entry": "m:f"},
        "prediction": {"nodes": 2, "step_s": predicted, "jct_s": 10.0}}))
    evs = [{"event": "start", "time": 1000.0, "attempt": 0, "nodes": 2, "world_size": 2, "stages": 2,
            "data_parallel": 1, "micro_batches": 2, "micro_batch_size": 1, "step": 0, "setup_s": 1.0,
            **(measured or {})}]
    evs += [{"event": "step", "time": 1000.0 + s, "attempt": 0, "step": s, "loss": 1.0, "step_time": actual}
            for s in (1, 2, 3)]
    evs.append({"event": "end", "time": 1004.0, "attempt": 0, "reason": "completed", "step": 3})
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    return str(run), Owner(user, 0, 0, name[-1])


def test_waits_are_slurms_and_errors_are_the_users_own(tmp_path):
    h = History(tmp_path / "h.db")
    try:
        for name, user, pred, actual in (("mine-1", "alice", 1.0, 1.1), ("theirs-2", "mallory", 1.0, 50.0)):
            run, owner = _run(tmp_path, name, user, pred, actual)
            assert h.ingest_run_dir(run, owner)
        # the forged submitted_at = 1.0 would make a wait of ~1000 s: it is not read
        assert h.partition_waits("low", 2) == []
        h.add_slurm_records([rec("5", T0 + H, T0 + 2 * H, NODECNT="2", SUBMIT=T0 + H - 90),
                             rec("6", T0 + 3 * H, T0 + 4 * H, NODECNT="2", SUBMIT=T0 + 3 * H - 30),
                             rec("7", T0 + 5 * H, T0 + 6 * H, NODECNT="4", SUBMIT=T0 + 5 * H - 999)], "jobcomp")
        assert sorted(h.partition_waits("low", 2)) == [30.0, 90.0]
        mine = h.recent_errors(user="alice")
        assert [e["actual_step_s"] for e in mine] == [1.1]
        assert {e["actual_step_s"] for e in h.recent_errors()} == {1.1, 50.0}   # an admin's view: all
    finally:
        h.close()


def test_the_planners_hardware_is_what_the_users_own_launches_measured(tmp_path):
    """Links and device memory come from this user's launches on the partition (medians), never
    from another user's events: mallory's forged tiny memory and slow links cannot shrink
    alice's layouts."""
    from pipeswift_slurm.planning.costmodel import Hardware
    h = History(tmp_path / "h.db")
    try:
        assert h.measured_hardware("low", "cpu", "alice") is None
        for name, user, lat, bw, mem, on_host, cores in (
                ("mine-1", "alice", 1e-4, 5e9, 40e9, 1, 8), ("mine-2", "alice", 3e-4, 7e9, 20e9, 2, 8),
                ("theirs-3", "mallory", 9.0, 1.0, 1, 64, 1)):
            run, owner = _run(tmp_path, name, user, 1.0, 1.1, {"device": "cpu", "p2p_latency_s": lat,
                                                               "p2p_bandwidth": bw, "device_memory": int(mem),
                                                               "ranks_per_host": on_host, "host_cores": cores})
            assert h.ingest_run_dir(run, owner)
        got = h.measured_hardware("low", "cpu", "alice")
        # 2 ranks of a 2-node launch on one host: its 2 nodes share a host (the most seen counts)
        assert got == (pytest.approx(2e-4), pytest.approx(6e9), pytest.approx(30e9), 2, 8, 2)
        assert h.measured_hardware("low", "cuda", "alice") is None        # another device
        assert h.measured_hardware("high", "cpu", "alice") is None        # another partition
        line = Hardware(device="cpu", p2p_latency=got.p2p_latency_s, p2p_bandwidth=got.p2p_bandwidth,
                        device_memory=got.device_memory, measured=got.launches).line()
        assert line == ("hardware: links 200 us + 6.00 GB/s between stages, 30.00 GB per cpu rank "
                        "(measured by 2 recent launch(es))")
    finally:
        h.close()


def test_a_new_job_at_the_same_path_keeps_the_other_jobs_rows(tmp_path):
    """A shared scratch path reused by another user's job: two jobs, each its own rows; the same
    job ingested again replaces its own rows only (issue 24: rows keyed by cluster and job id)."""
    h = History(tmp_path / "h.db")
    try:
        run, _ = _run(tmp_path, "scratch", "alice", 1.0, 1.1)
        assert h.ingest_run_dir(run, Owner("alice", 0, 0, "5", cluster="c"))
        (tmp_path / "again").mkdir()
        _run(tmp_path / "again", "scratch", "mallory", 1.0, 9.0)           # mallory's files...
        for name in ("plan.json", "events.jsonl"):                          # ...at the same path
            (tmp_path / "scratch" / name).write_bytes((tmp_path / "again" / "scratch" / name).read_bytes())
        with open(tmp_path / "scratch" / "events.jsonl", "a") as fh:
            fh.write("\n")
        assert h.ingest_run_dir(run, Owner("mallory", 0, 0, "6", cluster="c"))
        jobs = h.conn.execute("SELECT job_id, user, actual_step_s FROM jobs ORDER BY job_id").fetchall()
        assert jobs == [("5", "alice", 1.1), ("6", "mallory", 9.0)]
        with open(tmp_path / "scratch" / "events.jsonl", "a") as fh:
            fh.write("\n\n")
        assert h.ingest_run_dir(run, Owner("mallory", 0, 0, "6", cluster="c"))   # mallory's again
        assert h.conn.execute("SELECT COUNT(*), COUNT(DISTINCT job_id) FROM jobs").fetchone() == (2, 2)
        assert h.conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 2
        assert set(h.pswift_runs()) == {(run, "5"), (run, "6")}
        # the plugin's row (cluster c) and the same run ingested by hand (no cluster): one job
        with open(tmp_path / "scratch" / "events.jsonl", "a") as fh:
            fh.write("\n")
        assert h.ingest_run_dir(run, Owner("mallory", 0, 0, "6"))
        assert h.conn.execute("SELECT job_id, cluster FROM jobs ORDER BY job_id").fetchall() == [("5", "c"), ("6", "c")]
    finally:
        h.close()


def test_a_database_at_schema_10_keeps_its_jobs_and_their_attempts(tmp_path):
    import sqlite3
    from pipeswift_slurm.history.schema import MIGRATIONS
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for m in MIGRATIONS[:10]:
        conn.executescript(m)
    conn.execute("INSERT INTO jobs (id, run_dir, job_id, user, predicted_jct_p90_s) VALUES (1, '/r', '5', 'u', 9.5)")
    conn.execute("INSERT INTO attempts (job, attempt, restarts) VALUES (1, 0, 2)")
    conn.execute("INSERT INTO relayouts (job, attempt, step, kind) VALUES (1, 0, 7, 'grow')")
    conn.execute("PRAGMA user_version = 10")
    conn.commit()
    conn.close()
    h = History(path)
    try:
        assert h.conn.execute("SELECT cluster, run_dir, job_id, predicted_jct_p90_s FROM jobs").fetchall() == [
            ("", "/r", "5", 9.5)]
        assert h.conn.execute("SELECT COUNT(*) FROM job_listing").fetchone() is not None   # views made anew
        h.conn.execute("DELETE FROM jobs")                           # the references still cascade
        assert h.conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0
        assert h.conn.execute("SELECT COUNT(*) FROM relayouts").fetchone()[0] == 0
    finally:
        h.close()


def test_a_one_user_copy_keeps_that_users_jobs_and_what_hangs_off_them(tmp_path):
    from pipeswift_slurm.reports.serve import own_rows
    db = tmp_path / "odd?#%20dir" / "h.db"           # URI characters in the path are quoted
    h = History(db)
    try:
        for name, user in (("mine-5", "alice"), ("theirs-6", "mallory")):
            run, owner = _run(tmp_path, name, user, 1.0, 1.5)
            assert h.ingest_run_dir(run, owner)
        h.add_slurm_records([rec("5", T0, T0 + H, USERNAME="alice"), rec("6", T0, T0 + H, USERNAME="mallory"),
                             rec("7", T0, T0 + H, USERNAME="mallory")], "jobcomp")
    finally:
        h.close()
    (tmp_path / "copy").mkdir()
    copy = History(own_rows(db, "alice", tmp_path / "copy"))
    try:
        q = lambda sql: copy.conn.execute(sql).fetchall()    # noqa: E731
        assert q("SELECT job_id, user FROM slurm_jobs") == [("5", "alice")]
        assert q("SELECT job_id, user FROM job_rollup") == [("5", "alice")]
        assert q("SELECT job_id, user FROM jobs") == [("mine-5"[-1], "alice")]
        assert q("SELECT COUNT(*) FROM attempts") == [(1,)]
        assert q("SELECT run_dir FROM ingest_state") == [(str(tmp_path / "mine-5"),)]
        assert q("SELECT user FROM job_listing") == [("alice",)]         # the views read the copy
    finally:
        copy.close()


def test_who_is_served_whose_jobs(tmp_path):
    from pipeswift_slurm.reports.serve import ServeRefused, served_user
    db = tmp_path / "h.db"
    assert served_user(db, 0, 500, None, "root") is None                  # root: everyone's
    assert served_user(db, 500, 500, None, "admin") is None               # the database's owner too
    assert served_user(db, 500, 500, "bob", "admin") == "bob"             # or one user's, asked for
    assert served_user(db, 1000, 500, None, "alice") == "alice"           # anyone else: their own
    assert served_user(db, 1000, 500, "alice", "alice") == "alice"
    with pytest.raises(ServeRefused, match="only the owner of .* may serve another user's jobs"):
        served_user(db, 1000, 500, "bob", "alice")


def test_a_sacct_record_slurmdbd_has_not_finished_is_read_again_and_filled(tmp_path):
    """22.05's slurmdbd shows a job COMPLETED with no QOS for ~2 s after it ends (seen on the
    real accounting cluster): the read mark stays at that job's end, so the next ingest reads it
    again and fills the QOS in; a record still without one after SACCT_SETTLE_S no longer holds
    the mark back."""
    from pipeswift_slurm.slurm.accounting import SACCT_SETTLE_S
    h = History(tmp_path / "h.db")
    rec = {"CLUSTER": "c", "USERNAME": "u", "PARTITION": "low", "JOBSTATE": "COMPLETED", "SUBMIT": 50}
    settled = {**rec, "JOBID": "1", "START": 100, "END": 200, "QOS": "normal"}
    fresh = {**rec, "JOBID": "2", "START": 150, "END": 250, "QOS": None}
    newest = {**rec, "JOBID": "3", "START": 200, "END": 300, "QOS": "normal"}
    assert h.add_sacct("c", [settled, fresh, newest], now=302) == 3
    assert h.sacct_since("c") == 250                        # not 300: job 2 is read again
    assert h.add_sacct("c", [{**fresh, "QOS": "normal"}, newest], now=304) == 0
    assert h.sacct_since("c") == 300
    qos = dict(h.conn.execute("SELECT job_id, qos FROM slurm_jobs").fetchall())
    assert qos == {"1": "normal", "2": "normal", "3": "normal"}
    h2 = History(tmp_path / "h2.db")
    h2.add_sacct("c", [fresh, newest], now=250 + SACCT_SETTLE_S + 1)
    assert h2.sacct_since("c") == 300                       # long ended: stays without a QOS
    h.close()
    h2.close()


def test_the_planner_shares_a_host_as_the_users_launches_found_it(tmp_path, monkeypatch):
    """Virtual nodes on one machine: Slurm says 8 CPUs a node, the launches found 4 nodes' ranks
    on one host of 2 cores. The planner takes the measured cores and sharing (a 4-stage step is
    then estimated slower than Slurm's figures make it) unless PSWIFT_HOST_CORES /
    PSWIFT_RANKS_PER_HOST say otherwise; `pswift plan` says so."""
    from helpers import copy_example
    from pipeswift_slurm import autoplan
    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.history import rows as runrows
    from pipeswift_slurm.planning.costmodel import Profile, estimate_step
    from pipeswift_slurm.planning.partition import balanced_boundaries
    from pipeswift_slurm.slurm.cluster import ClusterState
    from pipeswift_slurm.slurm.records import NodeState
    for var in ("PSWIFT_HOST_CORES", "PSWIFT_RANKS_PER_HOST", "PSWIFT_DEVICE_MEMORY"):
        monkeypatch.delenv(var, raising=False)
    cfg = load_config(copy_example(tmp_path / "ex", {"nodes": "[1, 4]"}))
    cluster = ClusterState(now=0.0, nodes=[NodeState(f"node{i}", "idle", 8, 8, ("low",)) for i in range(1, 5)])

    def cores_and_sharing() -> tuple[int | None, int | None]:
        hw = autoplan.hardware(cfg, cluster, h)
        return hw.host_cores, hw.ranks_per_host
    me = runrows.current_user()
    h = History(tmp_path / "h.db")
    try:
        assert cores_and_sharing() == (8, None)   # nothing measured: Slurm's CPUs of a node
        run, _ = _run(tmp_path, "four", me, 1.0, 1.1, {  # a 4-node launch: 4 ranks found on its host
            "nodes": 4, "world_size": 4, "stages": 4, "device": "cpu", "p2p_latency_s": 1e-4,
            "p2p_bandwidth": 1e9, "device_memory": int(4e9), "ranks_per_host": 4, "host_cores": 2})
        assert h.ingest_run_dir(run, Owner(me, 0, 0, "4"))
        hw = autoplan.hardware(cfg, cluster, h)
        assert (hw.host_cores, hw.ranks_per_host) == (2, 4)
        assert hw.line().endswith("; up to 4 ranks x 1 thread(s) share a host's 2 cores"), hw.line()
        prof = Profile((1.0,) * 8, None, None, 8, "toml")
        cuts = balanced_boundaries(prof.costs, 4)
        shared = estimate_step(prof, cuts, 8, 8, 1, 1, hw)
        apart = estimate_step(prof, cuts, 8, 8, 1, 1, hw._replace(host_cores=8, ranks_per_host=None))
        assert shared.contention > 1.5 and shared.step_s > 1.5 * apart.step_s
        monkeypatch.setenv("PSWIFT_HOST_CORES", "16")
        monkeypatch.setenv("PSWIFT_RANKS_PER_HOST", "1")
        assert cores_and_sharing() == (16, 1)
    finally:
        h.close()
