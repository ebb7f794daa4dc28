"""Issue 59, item 3: the history's reports see pswift's own jobs. With only the job's run
directory ingested (no jobcomp plugin, no sacct), `report`, `usage`, `waits`, `efficiency`,
`utilisation` and `failures` said "no job ... matches" while `history jobs` listed it, as
`completed` in lower case with a blank NNodes. A run's attempts now stand as Slurm's records
until Slurm's own record of the job comes, which replaces them."""

from __future__ import annotations

import json
import sqlite3

from helpers import GOOD, PLAN, pswift
from pipeswift_slurm.history.store import History

REPORTS = ["report", "usage", "waits", "efficiency", "utilisation", "failures"]


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(PLAN))
    (run / "JOB_ID").write_text("4242\n")
    events = [{**e, "job_id": "4242", "time": e["time"] + 1.79e9} for e in GOOD]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def test_every_report_shows_a_job_known_only_from_its_run_directory(tmp_path):
    run, db = _run(tmp_path), tmp_path / "h.db"
    pswift("history", "ingest", str(run), "--db", str(db), check=True)
    for report in REPORTS:
        proc = pswift("history", report, "--db", str(db), "-P")
        assert proc.returncode == 0 and len(proc.stdout.splitlines()) >= 2, (report, proc.stderr)
    row = json.loads(pswift("history", "jobs", "--json", "--db", str(db), check=True).stdout)
    assert [(r["job_id"], r["state"], r["nodes"]) for r in row] == [("4242", "COMPLETED", 1)], row
    assert "COMPLETED" in pswift("history", "failures", "--db", str(db), "-P", check=True).stdout
    assert "4242" in pswift("history", "show", "4242", "--db", str(db), check=True).stdout


def test_slurms_own_record_replaces_what_pswift_derived(tmp_path):
    run, db = _run(tmp_path), tmp_path / "h.db"
    pswift("history", "ingest", str(run), "--db", str(db), check=True)
    h = History(db)
    h.add_slurm_records([{"JOBID": "4242", "CLUSTER": "c", "USERNAME": "alice", "JOBNAME": "victim",
                          "JOBSTATE": "COMPLETED", "PARTITION": "low", "START": 1.79e9 + 8, "END": 1.79e9 + 14,
                          "SUBMIT": 1.79e9, "NODECNT": "1", "PROCS": "2", "WORK_DIR": str(run)}], "jobcomp")
    h.close()
    rows = sqlite3.connect(db).execute("SELECT cluster, source FROM slurm_jobs").fetchall()
    assert rows == [("c", "jobcomp")]
    assert len(sqlite3.connect(db).execute("SELECT * FROM job_rollup").fetchall()) == 1
    pswift("history", "ingest", str(run), "--db", str(db), check=True)      # the run again: no copy back
    assert sqlite3.connect(db).execute("SELECT cluster, source FROM slurm_jobs").fetchall() == [("c", "jobcomp")]
    listed = json.loads(pswift("history", "jobs", "--json", "--db", str(db), check=True).stdout)
    assert [r["job_id"] for r in listed] == ["4242"]


def test_a_local_run_listed_as_local_n_is_found_by_show(tmp_path):
    run, db = _run(tmp_path), tmp_path / "h.db"
    (run / "JOB_ID").unlink()
    pswift("history", "ingest", str(run), "--db", str(db), check=True)
    (listed,) = json.loads(pswift("history", "jobs", "--json", "--db", str(db), check=True).stdout)
    assert listed["job_id"].startswith("local:")
    show = pswift("history", "show", listed["job_id"], "--db", str(db))
    assert show.returncode == 0 and listed["job_id"] in show.stdout, show.stderr
