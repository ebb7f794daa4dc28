"""Hostile and broken input (issue: security): run directories read as root, spool files,
event lines, the history DB's creation, admin output. Each test is one of the reproductions:
it failed (leaked, hung, crashed, forged) before the fix and passes now. Tests run as root (as
slurmctld's plugin does); a second, unprivileged user is created for the privilege drop."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import CLUSTER_DB, CLUSTER_SPOOL, PLAN, USER, pswift, run_dir, wait_state
from pipeswift_slurm import userfiles
from pipeswift_slurm.errors import IngestRefused
from pipeswift_slurm.history.store import History
from pipeswift_slurm.history.rows import Owner, model_key

HOSTILE_LINES = [b'{"event": "step", "attempt": null, "step": 3, "loss": 1.0, "step_time": "0.1"}',
                 b'{"event": "step", "attempt": 0, "step": 123456789012345678901234567890, "loss": 1, "step_time": 1}',
                 b'{"event": "step", "attempt": 0, "step": 4, "loss": 1e999, "step_time": 1}',
                 b'{"event": "layer_profile", "attempt": 0, "micro_batch_size": 1, "seconds": [1, 2]}',
                 b'{"event": "start", "attempt": "0"}', b'\xff\xfe not utf-8', b'[1, 2]', b'9' * 5000,
                 b'{"event": "end", "attempt": 0, "reason": {"x": 1}}', b'[' * 100_000]


def test_hostile_event_lines_are_skipped_and_counted_never_raised(tmp_path):
    run = run_dir(tmp_path / "run", HOSTILE_LINES)
    proc = pswift("history", "ingest", str(run), "--db", str(tmp_path / "h.db"))
    assert proc.returncode == 0, proc.stderr
    assert f"{len(HOSTILE_LINES)} bad event line(s) skipped" in proc.stdout
    db = sqlite3.connect(tmp_path / "h.db")
    assert db.execute("SELECT step_count, step_mean FROM attempts").fetchall() == [(1, 0.25)]
    assert pswift("history", "jobs", "--db", str(tmp_path / "h.db")).returncode == 0


def test_a_symlinked_event_log_is_not_followed(tmp_path):
    run = run_dir(tmp_path / "run")
    (run / "events.jsonl").unlink()
    (run / "events.jsonl").symlink_to("/etc/shadow")
    db = tmp_path / "h.db"
    proc = pswift("history", "ingest", str(run), "--db", str(db))
    assert proc.returncode == 0 and "symlinks are not followed" in proc.stderr
    assert b"root:" not in db.read_bytes()
    with pytest.raises(IngestRefused, match="symlinks are not followed"):
        History(tmp_path / "h2.db").ingest_run_dir(run)


@pytest.mark.timeout(30)
def test_a_fifo_cannot_hang_ingest(tmp_path):
    run = run_dir(tmp_path / "run")
    (run / "events.jsonl").unlink()
    os.mkfifo(run / "events.jsonl")
    with pytest.raises(IngestRefused, match="not a regular file"):
        History(tmp_path / "h.db").ingest_run_dir(run)


def test_files_of_another_owner_and_oversized_files_are_refused(tmp_path, other_user):
    run = run_dir(tmp_path / "run")
    os.chown(run / "plan.json", other_user.pw_uid, other_user.pw_gid)
    with pytest.raises(userfiles.UnsafeFile, match="belongs to uid"):
        userfiles.read_run_files(str(run))
    os.chown(run / "plan.json", 0, 0)
    with open(run / "events.jsonl", "ab") as f:          # 3 GB, sparse: costs no disk
        f.truncate(3 << 30)
    with pytest.raises(userfiles.UnsafeFile, match="larger than"):
        userfiles.read_run_files(str(run))


def test_the_reader_drops_to_the_jobs_user(public_tmp, other_user):
    """A file the user cannot read (mode 000) is read by root in-process, but not by the reader
    that dropped to the user: the drop really happens."""
    run = run_dir(public_tmp / "run", owner=other_user)
    (run / "plan.json").chmod(0)
    assert userfiles.read_run_files(str(run), other_user.pw_uid).data["plan.json"]   # root: yes
    with pytest.raises(userfiles.UnsafeFile, match="Permission denied"):
        userfiles.read_run_files_as(str(run), other_user.pw_uid, other_user.pw_gid, timeout=10)
    (run / "plan.json").chmod(0o644)
    got = userfiles.read_run_files_as(str(run), other_user.pw_uid, other_user.pw_gid, timeout=10)
    assert json.loads(got.data["plan.json"]) == PLAN and got.owner == other_user.pw_uid


@pytest.mark.timeout(30)
def test_a_stalled_reader_is_killed_at_the_deadline():
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # a reader stuck in a read that never returns
        os.close(rfd)
        time.sleep(60)
        os._exit(0)
    os.close(wfd)
    t0 = time.monotonic()
    with pytest.raises(userfiles.UnsafeFile, match="longer than the deadline"):
        userfiles._collect(rfd, pid, time.monotonic() + 1.0, "/stalled", 1 << 20, None)
    assert time.monotonic() - t0 < 10
    assert os.waitpid(pid, 0)[1] != 0          # SIGKILLed, not finished
    os.close(rfd)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sent, why", [
    (b"X\0\0\0\0", "malformed"),                                   # a kind that is not a frame's
    (b"D\3\0\0\0abc", "malformed"),                                # data where none was asked for
    (b"K\xff\xff\xff\x7f" + b"x" * (2 << 20), "sent more than"),   # a frame past the cap
    (b"K\5\0\0\0ab", "failed"),                                    # ends inside its answer
])
def test_a_reader_that_sends_what_it_may_not_is_refused(sent, why):
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # a reader the user has tampered with
        os.close(rfd)
        try:
            os.write(wfd, sent)
        finally:
            os._exit(0)
    os.close(wfd)
    with pytest.raises(userfiles.UnsafeFile, match=why):
        userfiles._collect(rfd, pid, time.monotonic() + 10.0, "/tampered", 1 << 20, None)
    os.waitpid(pid, 0)
    os.close(rfd)


def spool_record(owner: pwd.struct_passwd, work: Path, job: str = "4242") -> dict:
    return {"JOBID": job, "UID": str(owner.pw_uid), "GID": str(owner.pw_gid), "USERNAME": owner.pw_name,
            "PARTITION": "low", "JOBSTATE": "COMPLETED", "START": "100", "END": "200", "SUBMIT": "90",
            "WORK_DIR": str(work), "CLUSTER": "c", "recorded_at": 1.0}


def test_identity_comes_from_slurm_and_profiles_stay_with_their_user(tmp_path, public_tmp, other_user):
    run = run_dir(public_tmp / "run", owner=other_user)      # plan.json claims user alice
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "1.json").write_text(json.dumps(spool_record(other_user, run)))
    h = History(tmp_path / "h.db")
    merged, problems = h.ingest_spool(spool)
    assert (merged, problems) == (1, [])
    user, job_id = h.conn.execute("SELECT user, job_id FROM jobs").fetchone()
    assert (user, job_id) == (USER, "4242")
    model = PLAN["model"]
    assert h.layer_profile(model_key(model, USER)) is not None       # the job's own user: yes
    assert h.layer_profile(model_key(model, "alice")) is None        # the user it claimed: no
    assert h.layer_profile(model_key(model, "root")) is None


def test_a_run_dir_of_someone_else_is_not_taken_for_the_jobs(tmp_path, public_tmp, other_user):
    run = run_dir(public_tmp / "run")                     # root's directory, readable to all
    h = History(tmp_path / "h.db")
    with pytest.raises(IngestRefused, match="not the job's uid"):
        h.ingest_run_dir(run, Owner(USER, other_user.pw_uid, other_user.pw_gid, "1"), timeout=10)


@pytest.mark.timeout(60)
def test_bad_spool_files_move_aside_with_their_reason_and_the_rest_merge(tmp_path, other_user):
    spool = tmp_path / "spool"
    spool.mkdir()
    os.mkfifo(spool / "a-fifo.json")
    (spool / "b-garbage.json").write_bytes(b"\x00not json")
    (spool / "c-link.json").symlink_to("/etc/passwd")
    (spool / "d-big.json").write_text(json.dumps({"JOBID": "x" * 100_000}))
    (spool / "e-good.json").write_text(json.dumps(spool_record(other_user, tmp_path / "nowhere", "7")))
    h = History(tmp_path / "h.db")
    merged, problems = h.ingest_spool(spool)
    assert merged == 1 and len(problems) == 4, problems
    bad = sorted(p.name for p in (spool / "bad").iterdir())
    assert bad == sorted([f"{n}.json{s}" for n in ("a-fifo", "b-garbage", "c-link", "d-big") for s in ("", ".why")])
    assert "not a regular file" in (spool / "bad" / "a-fifo.json.why").read_text()
    assert h.conn.execute("SELECT job_id FROM slurm_jobs").fetchall() == [("7",)]
    assert not list(spool.glob("*.json"))


def test_one_spool_file_that_fails_anyhow_is_set_aside_and_the_rest_merge(tmp_path, other_user):
    """Numbers no schema caught (a start time of 10^400 overflows a float) end in bad/ with their
    reason, the next file still merges; a planted `bad` link is never followed."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a-huge.json").write_text(json.dumps({**spool_record(other_user, tmp_path / "nowhere", "5"),
                                                   "START": 10**400, "NODECNT": 10**400}))
    (spool / "b-good.json").write_text(json.dumps(spool_record(other_user, tmp_path / "nowhere", "6")))
    h = History(tmp_path / "h.db")
    merged, problems = h.ingest_spool(spool)
    assert merged == 1 and len(problems) == 1 and "OverflowError" in problems[0], problems
    assert "OverflowError" in (spool / "bad" / "a-huge.json.why").read_text()
    assert h.conn.execute("SELECT job_id FROM slurm_jobs").fetchall() == [("6",)]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(spool / "bad")
    (spool / "bad").symlink_to(elsewhere)
    (spool / "c-huge.json").write_text(json.dumps({**spool_record(other_user, tmp_path / "x", "7"), "START": 10**400}))
    merged, problems = h.ingest_spool(spool)
    assert merged == 0 and "left in place" in problems[0] and not list(elsewhere.iterdir())
    assert (spool / "c-huge.json").exists()


def test_a_spool_that_is_a_link_or_writable_by_others_is_not_read(tmp_path, other_user):
    real = tmp_path / "real"
    real.mkdir(mode=0o750)
    (real / "1.json").write_text(json.dumps(spool_record(other_user, tmp_path / "nowhere", "8")))
    (tmp_path / "link").symlink_to(real)
    h = History(tmp_path / "h.db")
    with pytest.raises(IngestRefused, match=r"is not a directory \(a link is not followed\)"):
        h.ingest_spool(tmp_path / "link")
    real.chmod(0o777)
    with pytest.raises(IngestRefused, match=r"writable by other users \(mode 777\).*chmod go-w"):
        h.ingest_spool(real)
    os.chown(real, other_user.pw_uid, other_user.pw_gid)
    real.chmod(0o750)
    with pytest.raises(IngestRefused, match=f"belongs to uid {other_user.pw_uid}"):
        h.ingest_spool(real)
    h.close()
    proc = pswift("history", "ingest", "--spool", str(tmp_path / "link"), "--db", str(tmp_path / "h.db"),
                  "--no-registered")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "a link is not followed" in proc.stderr
    os.chown(real, 0, 0)
    h = History(tmp_path / "h.db")
    assert h.ingest_spool(real) == (1, [])
    assert h.conn.execute("SELECT job_id FROM slurm_jobs").fetchall() == [("8",)]


def test_numbers_beyond_the_events_bounds_are_skipped_not_overflowed():
    """Step times near the float maximum and times at int64's edge pass no event check, so
    the ingest's means and sums never overflow (they raised before: nothing after them merged)."""
    lines = [{"event": "start", "time": -(2**63 - 1), "setup_s": 2**63 - 1, "nodes": 1, "world_size": 1,
              "stages": 1, "data_parallel": 1, "micro_batches": 1, "micro_batch_size": 1, "step": 0},
             *({"event": "step", "time": 10.0 + i, "step": i, "loss": 1.0, "step_time": 1.7e308} for i in range(1, 4)),
             {"event": "step", "time": 20.0, "step": 4, "loss": 1.0, "step_time": 0.5}]
    from pipeswift_slurm import events
    got, skipped = events.parse(json.dumps(x) for x in lines)
    assert skipped == 4 and [e["step_time"] for e in got] == [0.5]
    assert events.validate({"event": "step", "step": 1, "loss": 1.0, "step_time": 1e13}) is not None
    assert events.validate({"event": "step", "step": 1, "loss": 1.0, "step_time": 1.1e13}) is None


def test_admin_reads_of_a_run_dir_follow_no_link_wait_on_no_fifo_and_read_logs_from_the_end(tmp_path):
    """What `pswift doctor` and `pswift status` read: a FIFO log is refused at once (it hung
    doctor), a log linked to a root-only file is never read (root reported "out-of-memory"
    from /etc/shadow's neighbour), a big log gives its last 4 MiB."""
    run = tmp_path / "run"
    run.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("slurmstepd: error: Detected 1 oom_kill event\n")
    secret.chmod(0o600)
    (run / "slurm-7.out").symlink_to(secret)
    with pytest.raises(userfiles.UnsafeFile, match="symlinks are not followed"):
        userfiles.read_for_command(str(run), ("slurm-*.out",))
    (run / "slurm-7.out").unlink()
    os.mkfifo(run / "slurm-7.out")
    with pytest.raises(userfiles.UnsafeFile, match="not a regular file"):
        userfiles.read_for_command(str(run), ("slurm-*.out",), timeout=5)
    (run / "slurm-7.out").unlink()
    (run / "slurm-7.out").write_bytes(b"x" * (5 << 20) + b"the end\n")
    got = userfiles.read_for_command(str(run), ("plan.json", "slurm-*.out"))
    assert list(got) == ["slurm-7.out"] and len(got["slurm-7.out"]) == 4 << 20 and got["slurm-7.out"].endswith(b"the end\n")


def test_root_reads_a_users_run_dir_for_a_command_as_that_user(public_tmp, other_user):
    run = run_dir(public_tmp / "run", events=[b'{"event": "step"}\n'], owner=other_user)
    os.chmod(run / "events.jsonl", 0o600)
    (run / "slurm-1.out").write_text("mine\n")
    os.chown(run / "slurm-1.out", 0, 0)     # root's file in the user's directory: not the owner's
    with pytest.raises(userfiles.UnsafeFile, match="not the run directory's owner"):
        userfiles.read_for_command(str(run), ("events.jsonl", "slurm-*.out"))
    (run / "slurm-1.out").unlink()
    got = userfiles.read_for_command(str(run), ("events.jsonl",))   # root, through the dropped child
    assert got == {"events.jsonl": (run / "events.jsonl").read_bytes()} and got["events.jsonl"].endswith(b'{"event": "step"}\n\n')


def test_status_of_a_run_dir_with_a_fifo_for_events_is_one_line_at_once(tmp_path):
    run = run_dir(tmp_path / "run")
    (run / "JOB_ID").unlink()
    (run / "events.jsonl").unlink()
    os.mkfifo(run / "events.jsonl")
    proc = pswift("status", str(run), timeout=60)
    assert proc.returncode != 0 and "events.jsonl is not a regular file" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_first_creation_races_and_permissions(tmp_path):
    db = tmp_path / "new" / "h.db"
    code = f"from pipeswift_slurm.history.store import History; History({str(db)!r}).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(6)]
    errs = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _ in errs), errs
    assert oct(db.stat().st_mode & 0o777) == "0o640"
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] > 0


def test_a_db_corrupt_in_the_middle_is_one_line(tmp_path):
    db = tmp_path / "h.db"
    h = History(db)
    h.add_slurm_records([{"JOBID": str(i), "START": 100 + i, "JOBNAME": "x" * 500} for i in range(2000)], "t")
    h.close()
    data = bytearray(db.read_bytes())
    for at in range(len(data) // 4, 3 * len(data) // 4, 4096 * 7):   # pages in the middle
        data[at:at + 4096] = bytes(range(256)) * 16
    db.write_bytes(bytes(data))
    for args in (["history", "jobs"], ["history", "report"], ["history", "export"], ["history", "show", "5"]):
        proc = pswift(*args, "--db", str(db))
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == 0 or proc.stderr.count("\n") == 1, proc.stderr


def test_user_strings_in_tables_and_csv_stay_inert(tmp_path):
    h = History(tmp_path / "h.db")
    h.add_slurm_records([{"JOBID": "1", "START": 100, "END": 200, "JOBNAME": "[/oops]", "USERNAME": "=HYPERLINK(\"x\")",
                          "PARTITION": "low", "JOBSTATE": "COMPLETED"}], "t")
    h.close()
    proc = pswift("history", "jobs", "--db", str(tmp_path / "h.db"))
    assert proc.returncode == 0 and "[/oops]" in proc.stdout, proc.stderr
    csv = pswift("history", "export", "--db", str(tmp_path / "h.db")).stdout
    assert "'=HYPERLINK" in csv and ",=HYPERLINK" not in csv
    h = History(tmp_path / "h.db")     # a tab first is a formula to a spreadsheet too (OWASP)
    h.add_slurm_records([{"JOBID": "2", "START": 300, "END": 400, "JOBNAME": "\t=cmd|' /C calc'!A0",
                          "USERNAME": "u", "PARTITION": "low", "JOBSTATE": "COMPLETED"}], "t")
    h.close()
    for args in (("history", "export"), ("history", "jobs", "--csv")):
        out = pswift(*args, "--db", str(tmp_path / "h.db")).stdout
        assert "\t=cmd" not in out and "?=cmd" in out, (args, out)


@pytest.mark.slurm
@pytest.mark.every_version
def test_the_real_plugin_reads_a_users_run_dir_as_that_user_only(cluster, public_tmp, other_user):
    """Through slurmctld: a job of the unprivileged user whose run directory holds a symlink
    to /etc/shadow and a plan.json claiming to be alice's; the plugin (root) merges Slurm's
    record, attributes the run to the job's real user, and never reads the shadow file."""
    run = run_dir(public_tmp / "run", owner=other_user)
    bad = run_dir(public_tmp / "bad", owner=other_user)
    (bad / "events.jsonl").unlink()
    os.symlink("/etc/shadow", bad / "events.jsonl")
    os.lchown(bad / "events.jsonl", other_user.pw_uid, other_user.pw_gid)
    ids = []
    for d in (run, bad):
        proc = subprocess.run(["runuser", "-u", USER, "--", "sbatch", "--parsable", "-o", "/dev/null",
                               f"--chdir={d}", "--wrap", "true"], capture_output=True, text=True,
                              env={**os.environ, "HOME": other_user.pw_dir})
        assert proc.returncode == 0, proc.stderr
        ids.append(proc.stdout.strip())
    for j in ids:
        wait_state(j, {"COMPLETED"}, timeout=60)
    # the plugin commits Slurm's record first and reads the run dir after; it deletes its spool
    # file only when both are done (a CI run once looked in between and saw no run row)
    deadline = time.time() + 60
    got: list = []
    while time.time() < deadline:
        if CLUSTER_DB.exists():   # (on a fresh cluster the plugin creates it with the first record)
            db = sqlite3.connect(CLUSTER_DB)
            # one row per attempt: a loaded host may see Slurm requeue a launch (a node that answered
            # late); this test's own jobs only: the cluster's DB outlives a controller's job ids
            got = db.execute("SELECT DISTINCT job_id, user FROM slurm_jobs WHERE job_id IN (?, ?) AND "
                             "work_dir IN (?, ?)", [*ids, str(run), str(bad)]).fetchall()
        pending = [f for j in ids for f in CLUSTER_SPOOL.glob(f"{j}.*.json")]
        if len(got) == 2 and not pending:
            break
        time.sleep(0.5)
    assert not pending, f"the plugin left spool files (merge failed or timed out): {pending}"
    assert sorted(got) == sorted((j, USER) for j in ids)
    rows = db.execute("SELECT job_id, user, run_dir FROM jobs WHERE job_id IN (?, ?) AND run_dir IN (?, ?)",
                      [*ids, str(run), str(bad)]).fetchall()
    assert rows == [(ids[0], USER, str(run))]     # the bad one was refused, the good one is the user's
    shadow = Path("/etc/shadow").read_bytes().split(b"\n")[0]     # root's line, e.g. root:*:19000:0:...
    assert len(shadow) > 8 and shadow not in CLUSTER_DB.read_bytes()   # (an index may hold "root:" itself)
