"""A jobcomp spool record and its run directory's rows merge in one transaction: a reader (an
admin's report, a test polling the history) that sees Slurm's record of a member's end sees the
run as it was then, never Slurm's record beside the run's rows of before (CI's 2-member run was
read as 'running' between the two writes); a store that fails leaves neither, the file set aside."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from helpers import run_dir
from pipeswift_slurm.history.store import History


def _spool(spool: Path, job: int, work: Path) -> Path:
    spool.mkdir(mode=0o750, exist_ok=True)
    rec = {"JOBID": str(job), "UID": str(os.geteuid()), "GID": str(os.getegid()), "USERNAME": "root",
           "JOBSTATE": "COMPLETED", "START": "1796092180", "END": "1796092280", "SUBMIT": "1796092100",
           "PARTITION": "low", "CLUSTER": "c", "NODECNT": "1", "WORK_DIR": str(work)}
    path = spool / f"{job}.json"
    path.write_text(json.dumps(rec))
    return path


def _seen(db: Path) -> tuple[int, int]:
    """(Slurm's records of job 4242, pswift's rows of it) as another connection reads them."""
    other = sqlite3.connect(db)
    try:
        return (other.execute("SELECT COUNT(*) FROM slurm_jobs WHERE job_id = '4242' AND source = 'jobcomp'")
                .fetchone()[0], other.execute("SELECT COUNT(*) FROM jobs WHERE job_id = '4242'").fetchone()[0])
    finally:
        other.close()


def test_a_reader_sees_the_slurm_record_and_the_run_together_or_neither(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    spooled = _spool(tmp_path / "spool", 4242, run_dir(tmp_path / "run"))
    h = History(db)
    real = History._store_run
    midway = []

    def store_and_look(self, read):
        midway.append(_seen(db))     # Slurm's record is written (in the transaction), the run not yet
        real(self, read)
        midway.append(_seen(db))
    monkeypatch.setattr(History, "_store_run", store_and_look)
    try:
        assert h.ingest_spool_file(spooled) is None
    finally:
        h.close()
    assert midway == [(0, 0), (0, 0)]     # neither, until the one commit
    assert _seen(db) == (1, 1) and not spooled.exists()


def test_a_run_that_fails_to_store_leaves_neither_and_the_file_set_aside(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    spool = tmp_path / "spool"
    _spool(spool, 4242, run_dir(tmp_path / "run"))

    def fails(self, read):
        raise OSError("disk full")
    monkeypatch.setattr(History, "_store_run", fails)
    h = History(db)
    try:
        merged, problems = h.ingest_spool(spool)
    finally:
        h.close()
    assert merged == 0 and len(problems) == 1 and "disk full" in problems[0], problems
    assert _seen(db) == (0, 0)
    assert (spool / "bad" / "4242.json").is_file()


def test_a_read_older_than_the_stored_one_does_not_write_over_it(tmp_path):
    """Two members' ends merge at once: the one that read the events file before the run's last
    event commits after the one that read it whole; the history keeps the whole read."""
    db = tmp_path / "h.db"
    run = run_dir(tmp_path / "run")
    events = run / "events.jsonl"
    *before, end = events.read_bytes().splitlines(keepends=True)
    assert json.loads(end)["reason"] == "completed"
    events.write_bytes(b"".join(before))      # the run before its end event
    h = History(db)
    try:
        early = h._read_run_dir(run, None, 30.0)
        with events.open("ab") as f:
            f.write(end)
        whole = h._read_run_dir(run, None, 30.0)
        assert early is not None and whole is not None and whole.size > early.size
        assert whole.rows.job["state"] == "completed" and early.rows.job["state"] != "completed"
        with h._writing():
            h._store_run(whole)
        with h._writing():
            h._store_run(early)
        assert h.conn.execute("SELECT state FROM jobs WHERE job_id = '4242'").fetchall() == [("completed",)]
    finally:
        h.close()
