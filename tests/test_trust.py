"""Whom pswift believes, and what reaches a terminal (issue 37's LOW findings, each reproduced
on the code before the fix): a run directory's JOB_ID is its owner's word, never enough to act
on another user's job; root writes and reads a user's files only as that user; a user's text
(a job name, a crash's message, a log line) never drives the terminal."""

from __future__ import annotations

import json
import os
import pty
import resource
import select
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import ROOT, pswift, wait_state
from pipeswift_slurm.history import rundir
from pipeswift_slurm.history.store import History

from helpers import run_dir

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"
PSWIFT = [sys.executable, "-m", "pipeswift_slurm.cli.main"]


def _chown_tree(path: Path, user) -> None:
    for p in (path, *path.rglob("*")):
        os.chown(p, user.pw_uid, user.pw_gid, follow_symlinks=False)


def in_a_terminal(*args: str, timeout: float = 60) -> str:
    """The CLI's output as a terminal receives it (stdout a pty)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [*PSWIFT, *args])
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif os.waitpid(pid, os.WNOHANG)[0]:
            break
    os.close(fd)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return out.decode("utf-8", "replace")


# ----------------------------------------------------------------------------- cancel's record
def test_roots_cancel_record_never_follows_a_link_the_user_planted(public_tmp, other_user):
    victim = public_tmp / "victim"
    victim.write_text("root's file\n")
    run = run_dir(public_tmp / "run")
    (run / "cancel.json").symlink_to(victim)
    _chown_tree(run, other_user)
    rundir.record_cancel(run, "42", "root", 1.0)
    assert victim.read_text() == "root's file\n"
    st = os.lstat(run / "cancel.json")
    assert st.st_uid == other_user.pw_uid and not (run / "cancel.json").is_symlink()
    assert json.loads((run / "cancel.json").read_text())["job_id"] == "42"


def test_roots_cancel_record_is_not_written_through_a_linked_run_directory(public_tmp, other_user):
    target = public_tmp / "etc"
    target.mkdir()
    link = public_tmp / "run"
    link.symlink_to(target)
    rundir.record_cancel(link, "42", "root", 1.0)
    assert list(target.iterdir()) == []


@pytest.mark.slurm
def test_cancel_of_a_run_dir_whose_job_id_names_another_users_job_is_refused(cluster, public_tmp, other_user):
    job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 120"],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        run = run_dir(public_tmp / "alice-run")
        (run / "JOB_ID").write_text(job + "\n")          # alice's word: root's job
        _chown_tree(run, other_user)
        proc = pswift("cancel", str(run))
        assert proc.returncode == 2 and f"job {job} belongs to uid 0" in proc.stderr, proc.stderr
        assert "not cancelled" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert wait_state(job, {"RUNNING", "PENDING"}, timeout=30) in ("RUNNING", "PENDING")
        assert not (run / "cancel.json").exists()
    finally:
        subprocess.run(["scancel", job])


# ----------------------------------------------------------------------------- what a terminal gets
def _hostile_run(public_tmp: Path, user) -> Path:
    crash = {"event": "crash", "attempt": 0, "time": 12.5, "how": "signal 9" + ESCAPES, "action": "restart",
             "rank": 1, "node": "node2" + ESCAPES, "why": "killed" + ESCAPES}
    run = run_dir(public_tmp / "run", [json.dumps(crash).encode()])
    (run / "JOB_ID").unlink()                      # a local run: status reads its events
    (run / "slurm-77.out").write_text(f"step 1 loss 2.0\n{ESCAPES}evil line\nstep 2\n")
    _chown_tree(run, user)
    return run


def test_status_makes_a_users_escapes_inert(public_tmp, other_user):
    run = _hostile_run(public_tmp, other_user)
    out = in_a_terminal("status", str(run))
    assert "crashed: killed" in out, out
    assert "\x1b" not in out and "\x07" not in out and "?]0;pwned?" in out


def test_logs_make_escapes_inert_to_a_terminal_and_a_pipe_and_raw_gives_the_bytes(public_tmp, other_user):
    run = _hostile_run(public_tmp, other_user)
    (run / "JOB_ID").write_text("77\n")
    os.chown(run / "JOB_ID", other_user.pw_uid, other_user.pw_gid)
    out = in_a_terminal("logs", str(run))
    assert "evil line" in out and "\x1b" not in out and "\x07" not in out, repr(out)
    assert "step 1 loss 2.0" in out and "step 2" in out
    piped = pswift("logs", str(run), check=True).stdout
    assert "\x1b" not in piped and "?]0;pwned?" in piped     # a pipe may end at a terminal (issue 57)
    assert ESCAPES in pswift("logs", "--raw", str(run), check=True).stdout   # asked for by name


def test_roots_logs_read_a_users_log_as_that_user(public_tmp, other_user):
    """A log file in alice's run directory that is not alice's (root's, here) is refused: root
    reads her run directory as her, and only her files."""
    run = _hostile_run(public_tmp, other_user)
    (run / "JOB_ID").write_text("77\n")
    os.chown(run / "JOB_ID", other_user.pw_uid, other_user.pw_gid)
    os.chown(run / "slurm-77.out", 0, 0)
    os.chmod(run / "slurm-77.out", 0o644)
    proc = pswift("logs", str(run))
    assert proc.returncode != 0 and "not a regular file of the run directory's owner" in proc.stderr, proc.stderr
    assert "evil line" not in proc.stdout


# ----------------------------------------------------------------------------- doctor
def test_doctor_shows_slurms_job_not_a_run_dir_that_claims_its_id(tmp_path, public_tmp, other_user):
    """Alice's run directory says JOB_ID 9001; Slurm recorded job 9001 as bob's, elsewhere. An
    admin's hand ingest keeps her claim, but `doctor 9001` is bob's job, not her run."""
    db = tmp_path / "h.db"
    h = History(db)
    h.add_slurm_records([{"JOBID": "9001", "USERNAME": "bob", "JOBNAME": "bobs-job", "PARTITION": "low",
                          "JOBSTATE": "COMPLETED", "START": 100, "END": 200, "SUBMIT": 50, "CLUSTER": "c",
                          "WORK_DIR": "/home/bob/x", "NODECNT": "1", "PROCS": "1"}], "jobcomp")
    h.close()
    run = run_dir(public_tmp / "alice-run")
    (run / "JOB_ID").write_text("9001\n")
    _chown_tree(run, other_user)
    pswift("history", "ingest", str(run), "--db", str(db), check=True)
    out = pswift("doctor", "9001", "--db", str(db), check=True).stdout
    assert out.startswith("job 9001 (bobs-job): COMPLETED"), out
    assert "victim" not in out


def test_doctor_folds_a_big_log_rather_than_parse_it_whole(tmp_path):
    """doctor read the whole events.jsonl and parsed every line into a dict (~2 GB at the
    256 MiB cap); it now folds it as it reads (64 MiB here: well under 256 MB)."""
    run = run_dir(tmp_path / "run")
    line = (json.dumps({"event": "step", "time": 1.0, "attempt": 0, "job_id": "4242", "step": 1, "loss": 1.0,
                        "loss_hex": (1.0).hex(), "step_time": 0.5}) + "\n").encode()
    with open(run / "events.jsonl", "ab") as fh:
        for _ in range(64):
            fh.write(line * ((1 << 20) // len(line)))
    db = tmp_path / "h.db"
    pswift("history", "ingest", str(run), "--db", str(db), check=True)
    # VmHWM, not ru_maxrss: Linux carries a forked child's high-water mark (the pytest worker's,
    # torch and all) across exec into ru_maxrss; VmHWM is this process's own
    code = ("import runpy, sys; sys.argv = ['pswift', 'doctor', '4242', '--db', sys.argv[1]]\n"
            "try:\n    runpy.run_module('pipeswift_slurm.cli.main', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
            "print('peak', int(hwm.split()[1]) // 1024, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=300)
    assert "job 4242" in proc.stdout, proc.stdout + proc.stderr
    peak = int(proc.stderr.rsplit("peak", 1)[1])
    assert peak < 256, peak


def test_cancel_checks_the_owner_of_the_folder_job_id_was_read_from_not_a_second_lookup(public_tmp, other_user,
                                                                                       monkeypatch):
    """Issue 57: resolve read JOB_ID by path, cancel checked the owner with a second lstat by
    path; a linked parent swapped between the two passed the check against a victim. The owner
    is the one of the folder JOB_ID was read from, carried with it."""
    from pipeswift_slurm.reports import watch
    from pipeswift_slurm.slurm import client as slurm
    mine = run_dir(public_tmp / "mallory" / "run")
    (mine / "JOB_ID").write_text("4242\n")                 # root's job, in mallory's run directory
    _chown_tree(public_tmp / "mallory", other_user)
    victim = run_dir(public_tmp / "root" / "run")          # root's own run of job 4242
    link = public_tmp / "via"
    link.symlink_to(public_tmp / "mallory")
    ref = watch.resolve(str(link / "run"))
    assert ref.job_id == "4242" and ref.owner == other_user.pw_uid
    link.unlink()
    link.symlink_to(public_tmp / "root")                   # swapped before the check
    assert victim.stat().st_uid == 0
    job = SimpleNamespace(job_id="4242", user_id=0)
    monkeypatch.setattr(slurm, "job_info", lambda job_id: job)
    cancelled = []
    monkeypatch.setattr(slurm, "cancel", lambda job_id, signal=None: cancelled.append(job_id))
    with pytest.raises(watch.NotAJob, match=f"belongs to uid 0, but run directory .* belongs to uid {other_user.pw_uid}"):
        watch.cancel(ref)
    assert cancelled == []
