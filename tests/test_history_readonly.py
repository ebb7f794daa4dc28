"""Issue 59, item 4: a read command never changes the history database. The first `history
jobs` on a copied 4 MB database migrated it in place (4.17 -> 7.11 MB, no notice, no backup).
Readers open the file read-only; an older schema is read from a migrated copy, said in one line;
`pswift history migrate` upgrades the file in place and keeps a backup."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from helpers import pswift
from pipeswift_slurm.history.schema import MIGRATIONS
from pipeswift_slurm.history.store import History
from pipeswift_slurm.slurm.accounting import normalise_record

T0 = 1_790_000_000.0
READS = [["jobs"], ["jobs", "--json"], ["jobs", "-P"], ["show", "41"], ["show", "41", "--json"], ["export"],
         ["report"], ["usage"], ["waits"], ["efficiency"], ["utilisation"], ["failures"]]


def _record(job: str, start: float) -> dict:
    return {"JOBID": job, "USERNAME": "alice", "JOBNAME": "train", "JOBSTATE": "COMPLETED", "PARTITION": "low",
            "START": str(int(start)), "END": str(int(start + 3600)), "SUBMIT": str(int(start - 60)),
            "ELIGIBLE": str(int(start - 60)), "NODECNT": "2", "PROCS": "8", "LIMIT": "120", "EXITCODE": "0:0",
            "DERIVED_EC": "0:0", "CLUSTER": "c", "ACCOUNT": "research", "QOS": "normal"}


def _old_database(path: Path, version: int = 13) -> None:
    """A history written by an older pswift (schema ``version``) holding two Slurm attempts."""
    conn = sqlite3.connect(path)
    for sql in MIGRATIONS[:version]:
        conn.executescript(sql)
    conn.execute(f"PRAGMA user_version = {version}")
    have = [r[1] for r in conn.execute("PRAGMA table_info(slurm_jobs)")]
    for job, start in (("41", T0), ("42", T0 + 7200)):
        row = normalise_record(_record(job, start), "jobcomp")
        cols = [c for c in have if c in row]
        conn.execute(f"INSERT INTO slurm_jobs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                     [row[c] for c in cols])
    conn.commit()
    conn.close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_read_command_reads_a_read_only_old_schema_database_and_leaves_its_bytes(tmp_path):
    db = tmp_path / "old.db"
    _old_database(db)
    db.chmod(0o444)
    before = _sha(db)
    for args in READS:
        proc = pswift("history", *args, "--db", str(db))
        assert proc.returncode == 0, (args, proc.stderr)
        assert "read from a migrated copy, the file unchanged" in proc.stderr and "history migrate" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert "41" in pswift("history", "jobs", "-P", "--db", str(db), check=True).stdout
    assert _sha(db) == before and sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]


def test_a_current_database_is_read_without_a_write_even_when_its_views_are_stale(tmp_path):
    """Views a reader finds stale are made for its connection alone (TEMP views)."""
    db = tmp_path / "h.db"
    h = History(db)
    h.add_slurm_records([_record("41", T0)], "jobcomp")
    h.conn.execute("DROP VIEW job_waits")          # as an older pswift's views would differ
    h.close()
    db.chmod(0o444)
    before = _sha(db)
    for args in READS:
        proc = pswift("history", *args, "--db", str(db))
        assert proc.returncode == 0 and "migrated copy" not in proc.stderr, (args, proc.stderr)
    assert _sha(db) == before


def test_migrate_upgrades_in_place_and_keeps_the_file_before_as_a_backup(tmp_path):
    db = tmp_path / "old.db"
    _old_database(db)
    before = _sha(db)
    proc = pswift("history", "migrate", "--db", str(db))
    assert proc.returncode == 0 and "migrated; the file before is kept as" in proc.stdout, proc.stderr
    (backup,) = tmp_path.glob("old.db.schema13-*")
    assert sqlite3.connect(backup).execute("PRAGMA user_version").fetchone()[0] == 13
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert _sha(backup) == before or sqlite3.connect(backup).execute("SELECT COUNT(*) FROM slurm_jobs").fetchone()[0] == 2
    again = pswift("history", "jobs", "--db", str(db))
    assert again.returncode == 0 and "migrated copy" not in again.stderr
    assert "already at this pswift's schema" in pswift("history", "migrate", "--db", str(db), check=True).stdout
