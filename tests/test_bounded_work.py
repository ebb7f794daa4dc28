"""Linear by construction (issue 37): what a user writes into their run directory costs a
root-run reader (the jobcomp plugin, an admin's `history ingest`) work bounded by the caps the
schema checks at parse time, never by the numbers a line carries; one spool file that still
takes too long is set aside at its deadline and the others merge. Each test reproduces a shape
that hung or blew up before the fix."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from helpers import pswift, run_dir
from pipeswift_slurm import events
from pipeswift_slurm.history.store import History

#: the most an ingest with the hanging line may take: it once ran minutes; an unhindered one takes
#: ~0.5 s, and a busy CI host (both cores on other tests) has taken over 2
PROMPT_S = 10.0

#: a layer profile whose boundaries span 10^13 layers: the row builder looped over that range
#: (2e7 took 2.4 s; this one ran 7 min of CPU before it was stopped)
HUGE_RANGE = (b'{"event": "layer_profile", "attempt": 0, "time": 12.0, "micro_batch_size": 1, '
              b'"seconds": {"0": 0.1}, "micro_batches": 2, "boundaries": [0, 10000000000000], '
              b'"instructions": {"0": {"ForwardPass": 0.1}}}')


@pytest.mark.parametrize("line", [
    HUGE_RANGE,
    HUGE_RANGE.replace(b"[0, 10000000000000]", b"[5, 3]"),                  # not sorted
    HUGE_RANGE.replace(b"[0, 10000000000000]", b"[0, 513]"),                # past the layer cap
    HUGE_RANGE.replace(b"[0, 10000000000000]", b"[" + b"0, " * 600 + b"1]"),   # more stages than layers
    HUGE_RANGE.replace(b'"seconds": {"0": 0.1}', b'"seconds": {"999999999": 0.1}'),
    HUGE_RANGE.replace(b'{"0": {"ForwardPass": 0.1}}',
                       json.dumps({"0": {f"I{k}": 0.1 for k in range(40)}}).encode()),
])
def test_the_schema_refuses_numbers_that_would_drive_a_readers_loop(line):
    assert events.parse([line]) == ([], 1)


def test_a_profile_within_the_caps_still_reads():
    ok = HUGE_RANGE.replace(b"[0, 10000000000000]", b"[0, 256, 512]")
    (ev,), skipped = events.parse([ok])
    assert skipped == 0 and ev["boundaries"] == [0, 256, 512]


def test_ingest_of_a_run_dir_with_the_hanging_line_ends_at_once_and_counts_it(tmp_path):
    run = run_dir(tmp_path / "run", [HUGE_RANGE])
    t0 = time.monotonic()
    proc = pswift("history", "ingest", str(run), "--db", str(tmp_path / "h.db"), timeout=60)
    assert proc.returncode == 0 and time.monotonic() - t0 <= PROMPT_S, (proc.stderr, time.monotonic() - t0)
    assert "1 bad event line(s) skipped" in proc.stdout


def _spool(spool: Path, job: int, work: Path) -> None:
    spool.mkdir(mode=0o750, exist_ok=True)
    rec = {"JOBID": str(job), "UID": str(os.geteuid()), "GID": str(os.getegid()), "USERNAME": "root",
           "JOBSTATE": "COMPLETED", "START": "1796092180", "END": "1796092280", "SUBMIT": "1796092100",
           "PARTITION": "low", "CLUSTER": "c", "NODECNT": "1", "WORK_DIR": str(work)}
    (spool / f"{job}.json").write_text(json.dumps(rec))


def test_ingest_of_the_spool_merges_every_file_at_once_with_the_hanging_line_counted(tmp_path):
    spool = tmp_path / "spool"
    for job in (1, 2, 3):
        _spool(spool, job, run_dir(tmp_path / f"run{job}", [HUGE_RANGE] if job == 2 else []))
    t0 = time.monotonic()
    proc = pswift("history", "ingest", "--spool", str(spool), "--no-registered", "--db", str(tmp_path / "h.db"),
                  timeout=60)
    assert proc.returncode == 0 and time.monotonic() - t0 <= PROMPT_S, (proc.stderr, time.monotonic() - t0)
    assert "1 bad event line(s) skipped" in proc.stdout
    assert list(spool.glob("*.json")) == []
    h = History(tmp_path / "h.db")
    try:
        assert sorted(r[0] for r in h.conn.execute("SELECT job_id FROM jobs")) == ["1", "2", "3"]
    finally:
        h.close()


def test_a_spool_file_past_its_deadline_is_set_aside_and_the_others_merge(tmp_path, monkeypatch):
    """Whatever still takes too long (a file system that stalls, a shape not thought of): the
    file's merge is stopped at its deadline, it moves to bad/ with the reason, the rest merge."""
    spool = tmp_path / "spool"
    for job in (1, 2, 3):
        _spool(spool, job, run_dir(tmp_path / f"run{job}"))
    h = History(tmp_path / "h.db")
    real = History.ingest_spool_file

    def slow_on_2(self, path, timeout=30.0):
        if Path(path).name == "2.json":
            time.sleep(30)
        return real(self, path, timeout)
    monkeypatch.setattr(History, "ingest_spool_file", slow_on_2)
    t0 = time.monotonic()
    try:
        merged, problems = h.ingest_spool(spool, timeout=1.0)
    finally:
        h.close()
    assert time.monotonic() - t0 < 10 and merged == 2, problems
    assert problems == [f"2.json: merging took over 1 s; moved to {spool / 'bad'}"]
    assert (spool / "bad" / "2.json.why").read_text() == "merging took over 1 s\n"
    assert list(spool.glob("*.json")) == []
