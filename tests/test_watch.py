"""Watching a job without Slurm: which job an argument names, the `--wait` loop's backoff and
what it says, step N/M and ETA, the cancel note, and the history's last word on a forgotten job.
Through real Slurm: test_preemption (--wait across a requeue, status once Slurm forgot the job)
and test_slurm_e2e (cancel)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeswift_slurm.history import rundir
from pipeswift_slurm.reports import watch
from pipeswift_slurm.history.store import History


def summary(attempts: list[dict], step: int | None = None, total: int | None = 100) -> dict:
    return {"run_dir": "/r", "step": step, "steps_total": total, "first_loss": None, "last_loss": None,
            "cancelled": None, "growths": [], "attempts": attempts}


def attempt(n: int, ended: str = "running", crashes: int = 0, step_s: float = 0.5, start: int = 0) -> dict:
    return {"attempt": n, "nodes": 4 - 2 * n, "stages": 4 - 2 * n, "start_step": start, "end_step": 40,
            "ended": ended, "median_step_s": step_s, "relayouts": [],
            "crashes": [{"step": 5 + i, "why": f"rank 1 on node2 was killed by signal 9 ({i})"} for i in range(crashes)]}


class FakeJob:
    """A scripted job: at each clock second, what squeue says and what the events say."""

    def __init__(self, script: list[tuple[float, str, int, dict]]) -> None:
        self.script, self.t, self.queries = script, 0.0, []

    def now(self) -> tuple[str, int, dict]:
        return [s for s in self.script if s[0] <= self.t][-1][1:]

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s

    def query(self, job_id: str):
        self.queries.append(self.t)
        state, restarts, _ = self.now()
        if state == "GONE":
            return None
        return SimpleNamespace(state=state, reason="", restarts=restarts,
                               terminal=state in ("COMPLETED", "FAILED", "CANCELLED"))

    def summarize(self, run: Path) -> dict:
        return self.now()[2]


def test_wait_backs_off_says_each_change_and_is_quick_again_when_the_job_moves():
    a0, a1 = attempt(0), attempt(1, start=40)
    job = FakeJob([
        (0, "PENDING", 0, summary([])),
        (60, "RUNNING", 0, summary([a0], step=10)),
        (100, "RUNNING", 0, summary([{**a0, "crashes": attempt(0, crashes=1)["crashes"]}], step=30)),
        (200, "RUNNING", 0, summary([{**a0, "ended": "preempted"}], step=40)),
        (203, "PENDING", 1, summary([{**a0, "ended": "preempted"}], step=40)),
        (260, "RUNNING", 1, summary([{**a0, "ended": "preempted"}, a1], step=50)),
        (400, "COMPLETED", 1, summary([{**a0, "ended": "preempted"}, {**a1, "ended": "completed"}], step=100)),
    ])
    said: list[str] = []
    got = watch.wait("42", Path("/r"), said.append, clock=job.clock, sleep=job.sleep, query=job.query,
                     summarize=job.summarize)
    assert got == watch.Watched("COMPLETED", False)
    text = "\n".join(said)
    for line in ("job 42: PENDING", "job 42: RUNNING", "job 42: attempt 0 on 4 node(s), 4 stage(s)",
                 "job 42: crashed after step 5: rank 1 on node2 was killed by signal 9 (0)",
                 "job 42: attempt 0 ended (preempted) at step 40", "job 42: requeued (restart 1)",
                 "job 42: attempt 1 on 2 node(s), 2 stage(s), from step 40", "job 42: COMPLETED",
                 "job 42: step 10/100, ETA 45 s"):
        assert line in said, (line, text)
    assert said.index("job 42: attempt 0 ended (preempted) at step 40") < said.index("job 42: requeued (restart 1)")
    gaps = [b - a for a, b in zip(job.queries, job.queries[1:])]
    assert max(gaps) <= watch.POLL_MAX_S + watch.EVENTS_EVERY_S
    assert gaps[:5] == pytest.approx([1, 2, 4, 8, 16], abs=0.1)    # backoff while nothing moves...
    assert len(job.queries) < 40                                    # 400 s: not once a second
    # ... and Slurm is asked within ~1 s of the events showing the end of an attempt
    after_end = [q for q in job.queries if q >= 200][0]
    assert after_end - 200 <= watch.EVENTS_EVERY_S + watch.POLL_FIRST_S + 0.1
    progress = [s for s in said if "step " in s and "/100" in s]
    assert 2 <= len(progress) <= 400 / watch.PROGRESS_EVERY_S + 1


def test_wait_stops_at_the_timeout_and_says_gone_when_slurm_forgot_the_job():
    job = FakeJob([(0, "PENDING", 0, summary([]))])
    got = watch.wait("7", Path("/r"), lambda s: None, timeout=60, clock=job.clock, sleep=job.sleep,
                     query=job.query, summarize=job.summarize)
    assert got == watch.Watched("PENDING", True) and 60 <= job.t <= 63
    gone = FakeJob([(0, "GONE", 0, summary([]))])
    said: list[str] = []
    assert watch.wait("7", Path("/r"), said.append, clock=gone.clock, sleep=gone.sleep, query=gone.query,
                      summarize=gone.summarize) == watch.Watched("GONE", False)
    assert said == ["job 7: GONE"]


def test_progress_and_eta():
    s = summary([attempt(0, step_s=0.25)], step=60, total=100)
    assert watch.progress(s, running=True) == watch.Progress(60, 100, 10.0)
    assert watch.progress(s, running=True).line() == "step 60/100, ETA 10 s"
    assert watch.progress(s, running=False).line() == "step 60/100"
    assert watch.progress(summary([], step=None), running=True) is None
    assert watch.progress(summary([attempt(0)], step=3, total=None), running=True).line() == "step 3"


def test_a_job_argument_is_an_id_a_local_key_or_a_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PSWIFT_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text("{}")
    rundir.register_job("local-run", run)
    assert watch.resolve("local-run") == watch.JobRef(None, run, "local-run")
    assert watch.resolve(str(run)) == watch.JobRef(None, run, "local-run")
    assert watch.resolve("12") == watch.JobRef("12", None, "12")
    (run / "JOB_ID").write_text("12\n")
    rundir.register_job("12", run)
    assert watch.resolve(str(run)) == watch.resolve("12") == watch.JobRef("12", run, "12")
    with pytest.raises(watch.NotAJob, match="neither a job id, a local run's key"):
        watch.resolve(str(tmp_path))
    with pytest.raises(watch.UnknownJob, match="local-nope is not in pswift's registry"):
        watch.resolve("local-nope")
    with pytest.raises(watch.NotAJob, match="is a local run: stop it with Ctrl-C"):
        watch.cancel(watch.JobRef(None, run, "local-run"))


def test_the_cancel_note_is_kept_and_a_hostile_one_is_ignored(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rundir.record_cancel(run, "12", "alice", 1.8e9)
    assert json.loads((run / "cancel.json").read_text())["user"] == "alice"
    assert rundir.summarize(run)["cancelled"] == {"user": "alice", "time": 1.8e9}
    for bad in ('{"user": 3, "time": 1}', '{"user": "a", "time": 1e300}', "[]", "not json"):
        (run / "cancel.json").write_text(bad)
        assert rundir.summarize(run)["cancelled"] is None


def test_a_local_runs_state_comes_from_its_events():
    ref = watch.JobRef(None, Path("/r"), "local-r")
    assert watch.state(ref, summary([attempt(0, ended="completed")])) == watch.Seen("COMPLETED", "events")
    assert watch.state(ref, summary([attempt(0)])) == watch.Seen("RUNNING", "events")
    assert watch.state(ref, summary([attempt(0, ended="crash")])) == watch.Seen("FAILED", "events", "crash")
    assert watch.state(ref, summary([])) == watch.Seen("UNKNOWN", "none")


def test_the_history_knows_a_forgotten_jobs_last_state(tmp_path):
    h = History(tmp_path / "h.db")
    base = {"JOBID": "12", "JOBNAME": "x", "USERNAME": "u", "PARTITION": "low", "NODECNT": 1,
            "SUBMIT": 100.0, "WORK_DIR": "/r"}
    recs = [{**base, "JOBSTATE": "PREEMPTED", "START": 110.0, "END": 150.0},
            {**base, "JOBSTATE": "COMPLETED", "START": 200.0, "END": 260.0}]
    h.add_slurm_records(recs, source="test")
    assert h.last_known("12", "/r") == {"state": "COMPLETED", "restarts": 1}
    assert h.last_known("13", None) is None
    h.close()


def test_a_slow_events_file_is_read_less_often():
    """Folding a long job's events.jsonl takes a while: --wait spends at most 1/EVENTS_SHARE of
    its time on it (here 0.15 s a read: one every 3 s, not every 2)."""
    import time as real
    job = FakeJob([(0, "RUNNING", 0, summary([attempt(0)], step=1))])
    reads: list[float] = []

    def slow(run: Path) -> dict:
        reads.append(job.t)
        real.sleep(0.15)
        return job.summarize(run)

    watch.wait("7", Path("/r"), lambda s: None, timeout=30, clock=job.clock, sleep=job.sleep, query=job.query,
               summarize=slow)
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert gaps and min(gaps) >= watch.EVENTS_SHARE * 0.15 - 1e-9, gaps


def test_a_run_dirs_job_id_is_read_as_a_user_file(tmp_path):
    """JOB_ID a FIFO (a hostile run directory, an admin asking): one clear error at once, no
    hang; a JOB_ID that is not a number is no job id."""
    import os
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text("{}")
    os.mkfifo(run / "JOB_ID")
    with pytest.raises(watch.NotAJob, match="JOB_ID is not a regular file"):
        watch.resolve(str(run))
    (run / "JOB_ID").unlink()
    (run / "JOB_ID").write_text("12; rm -rf /\n")
    assert watch.resolve(str(run)) == watch.JobRef(None, run, "local-run")


def test_the_registry_lives_where_platformdirs_puts_user_state_and_pswift_home_wins(tmp_path, monkeypatch):
    """Issue 42 item 8: the state folder is platformdirs' user_state_dir (the library is the
    reference here; pswift does not import it on the submit path)."""
    import platformdirs
    monkeypatch.delenv("PSWIFT_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg in (str(tmp_path / "xdg"), None, "relative/ignored"):
        if xdg is None:
            monkeypatch.delenv("XDG_STATE_HOME", raising=False)
        else:
            monkeypatch.setenv("XDG_STATE_HOME", xdg)
        assert rundir.state_dir() == Path(platformdirs.user_state_dir("pswift")), xdg
    monkeypatch.setenv("PSWIFT_HOME", str(tmp_path / "mine"))
    assert rundir.state_dir() == tmp_path / "mine"


def test_an_attempt_the_events_show_running_gets_an_eta_before_squeue_says_running():
    """A requeued job's new attempt starts while the last squeue still said PENDING (Slurm is
    asked less often while nothing moves): its first progress line already carries the ETA."""
    a0, a1 = attempt(0, ended="preempted"), attempt(1, start=40, step_s=1.0)
    job = FakeJob([
        (0, "PENDING", 1, summary([a0], step=40)),
        (3, "PENDING", 1, summary([a0, a1], step=41)),    # squeue is not asked again until t=7
        (60, "COMPLETED", 1, summary([a0, {**a1, "ended": "completed"}], step=100)),
    ])
    said: list[str] = []
    watch.wait("9", Path("/r"), said.append, clock=job.clock, sleep=job.sleep, query=job.query,
               summarize=job.summarize)
    assert "job 9: step 40/100" in said                  # before the new attempt: no ETA
    first = next(s for s in said if "step 41/" in s)
    assert first == "job 9: step 41/100, ETA 59 s", said
    assert said.index(first) < said.index("job 9: COMPLETED")


def test_others_listing_folds_no_events_of_a_directory_that_is_no_pswift_run(tmp_path, monkeypatch):
    """Issue 57: every listed job's events (up to 256 MiB, about 1 s; as root a fork and up to
    30 s) were folded before job_name was checked. plan.json is read first, alone; a working
    directory without a pswift plan is skipped unfolded, a run directory is listed."""
    from pipeswift_slurm.history import rundir
    from pipeswift_slurm.reports import watch
    from pipeswift_slurm.slurm import client as slurm
    from pipeswift_slurm.slurm.records import HeldJob
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "events.jsonl").write_bytes(b'{"event": "step"}\n' * 10000)
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text('{"job_name": "train", "training": {"steps": 3}}')
    monkeypatch.setattr(slurm, "held_jobs", lambda users: [HeldJob("8", "bob", "RUNNING", str(plain)),
                                                           HeldJob("9", "bob", "RUNNING", str(run))])
    folded = []
    real = rundir.summarize
    monkeypatch.setattr(rundir, "summarize", lambda d: folded.append(str(d)) or real(d))
    rows = watch.others_listing([])
    assert [r["job_id"] for r in rows] == ["9"] and folded == [str(run)]


def _task(job_id: str, state: str, nodes: str = ""):
    from pipeswift_slurm.slurm.records import JobInfo
    return JobInfo(job_id, "train", state, "", "low", nodes, (nodes,) if nodes else (), 1 if nodes else 0, 0,
                   None, None, None, None, 0, "normal")


def test_a_run_of_members_reads_as_one_job_from_its_tasks():
    """reports.watch.members_state: RUNNING while a member runs; once the run trained every step
    and none runs, COMPLETED though the members it cancelled (queued when it finished) read
    CANCELLED, and whichever task holds the array's id; PENDING while one waits; else the array's
    own record (a run cancelled or failed is not made COMPLETED)."""
    own = _task("20", "CANCELLED")
    running = [_task("21", "RUNNING", "node2"), own]
    assert watch.members_state(running, True, own).state == "RUNNING"
    assert watch.members_state(running, True, own).nodes == "node2"
    ended = [_task("21", "COMPLETED"), own]
    assert watch.members_state(ended, True, own).state == "COMPLETED"
    assert watch.members_state(ended, False, own).state == "CANCELLED"       # the run did not finish
    ending = [_task("21", "COMPLETING", "node2"), own]
    assert watch.members_state(ending, True, own).state == "COMPLETED"       # the run trained every step
    assert watch.members_state(ending, False, own).state == "COMPLETING"
    waiting = [_task("21", "PENDING"), _task("20", "COMPLETED")]
    assert watch.members_state(waiting, False, waiting[1]).state == "PENDING"
    assert watch.members_state([_task("20", "FAILED")], False, _task("20", "FAILED")).state == "FAILED"
