"""Watching a job: which job an argument names, what state it is in once Slurm has forgotten it,
how far it got, and the `--wait` loop (Slurm polled with backoff, the job's own events read for
progress in between).

Used by `pswift status`, `logs`, `cancel` and `sbatch --wait`; nothing here prints: each
function returns what it found, the CLI words it.
"""

from __future__ import annotations

# Imports inside functions: the history store, logs and the Slurm client, each only for the view
# that needs it

import getpass
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

from pipeswift_slurm import memberfiles, runfiles
from pipeswift_slurm.history import rundir
from pipeswift_slurm.eventlines import crash_line
from pipeswift_slurm.durations import duration
from pipeswift_slurm.errors import PswiftError, SlurmError

if TYPE_CHECKING:
    from pipeswift_slurm.slurm.records import JobInfo

#: `--wait`'s exit code when --timeout passes first (as timeout(1)): the job goes on
TIMEOUT_EXIT = 124
#: `status`'s exit code while slurmctld does not answer (sysexits' EX_UNAVAILABLE): an outage,
#: not the job's failure
UNREACHABLE_EXIT = 69
#: Slurm is asked about the job after 1 s, then each time twice as late, at most every 30 s;
#: the job's events (a local file) are read every few seconds in between, and never for more
#: than 1/EVENTS_SHARE of the time (a long job's file takes a while to fold)
POLL_FIRST_S, POLL_MAX_S, EVENTS_EVERY_S, EVENTS_SHARE = 1.0, 30.0, 2.0, 20.0
#: a progress line at most this often
PROGRESS_EVERY_S = 10.0


class UnknownJob(PswiftError):
    exit_code = 1


class NotAJob(PswiftError):
    exit_code = 2


@dataclass(frozen=True)
class JobRef:
    """What a `JOB` argument names: Slurm's job id (None for a local run) and the run directory
    (None for a job pswift did not submit from this account)."""
    job_id: str | None
    run: Path | None
    key: str
    #: the UID owning the run directory its JOB_ID was read from (that read's own, not a later
    #: lookup's); None where no JOB_ID was read (a job id, a local run's key)
    owner: int | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return f"job {self.job_id}" if self.job_id else f"local run {self.key}"


def resolve(arg: str) -> JobRef:
    """A job id, a local run's key (``local-NAME``, as `pswift run` registers it) or a run
    directory."""
    if arg.isdigit():
        return JobRef(arg, rundir.lookup_job(arg), arg)
    if arg.startswith("local-") and os.sep not in arg:
        run = rundir.lookup_job(arg)
        if run is None:
            raise UnknownJob(f"{arg} is not in pswift's registry ({rundir.state_dir() / 'jobs'}); "
                             f"pass its run directory instead")
        return JobRef(None, run, arg)
    run = Path(arg)
    if not (run / runfiles.PLAN).is_file():
        raise NotAJob(f"{arg} is neither a job id, a local run's key (local-NAME) nor a run directory "
                      f"(no plan.json there)")
    job_id, owner = _job_id_of(run)
    return JobRef(job_id, run, job_id or f"local-{run.name}", owner)


def _job_id_of(run: Path) -> tuple[str | None, int]:
    """The Slurm job id a run directory was submitted as (its JOB_ID file; None for a local
    run), read as any user file is (no link followed, no FIFO waited on, bounded), and the UID
    owning the directory it was read from."""
    from pipeswift_slurm import userfiles
    try:
        owner, files = userfiles.read_owned(str(run), (runfiles.JOB_ID,))
    except userfiles.UnsafeFile as e:
        raise NotAJob(f"run directory not read: {e}") from None
    text = files.get(runfiles.JOB_ID, b"").decode("ascii", "replace").strip()
    return (text if text.isdigit() else None), owner


class Seen(NamedTuple):
    """A job's state and where it was read: ``slurm`` (squeue), ``sacct`` (slurmdbd), ``history``
    (pswift's database: the jobcomp plugin's or sacct's record, else pswift's own), ``events``
    (a local run's own record) or ``none``."""
    state: str
    source: str
    reason: str = ""
    restarts: int | None = None
    nodes: str = ""
    #: slurmctld did not answer (its outage, said; the state is then the best the rest knew)
    unreachable: str = ""
    #: Slurm could not be asked here at all (no configuration, no commands): no outage; the
    #: state is the best the rest knew
    not_asked: str = ""

    @property
    def terminal(self) -> bool:
        from pipeswift_slurm.slurm.records import TERMINAL_STATES
        return self.state in TERMINAL_STATES


def _from_history(ref: JobRef, db: Path | None) -> Seen | None:
    from pipeswift_slurm.history.store import safe_open
    h = safe_open(db, create=False)
    if h is None:
        return None
    try:
        row = h.last_known(ref.job_id or "", str(ref.run) if ref.run else None)
    finally:
        h.close()
    return Seen(row["state"], "history", restarts=row["restarts"]) if row and row["state"] else None


def _from_events(summary: dict[str, Any]) -> Seen | None:
    attempts = summary["attempts"]
    if not attempts:
        return None
    ended = attempts[-1]["ended"]
    state = {"running": "RUNNING", "completed": "COMPLETED"}.get(ended, "FAILED")
    return Seen(state, "events", reason="" if ended in ("running", "completed") else ended)


def state(ref: JobRef, summary: dict[str, Any] | None, db: Path | None = None) -> Seen:
    """The job's state from the first that knows it: Slurm's queue, slurmdbd, the history, the
    run's own events (a local run has only those); ``Seen("UNKNOWN", "none")`` when none does.
    While slurmctld does not answer, the others are asked and ``unreachable`` says why."""
    from pipeswift_slurm.errors import SlurmAbsent, SlurmUnreachable
    from pipeswift_slurm.slurm import client as slurm
    down = absent = ""
    if ref.job_id:
        try:
            info = job_now(ref.job_id, ref.run)
        except SlurmUnreachable as e:
            info, down = None, str(e)
        except SlurmAbsent as e:   # no Slurm to ask on this machine: the rest still know
            info, absent = None, slurm.brief(e)
        if info is not None:
            return Seen(info.state, "slurm", info.reason if info.reason not in ("None",) else "",
                        info.restarts, info.nodes)
        try:
            acct = slurm.sacct_state(ref.job_id) if not absent else None
        except SlurmUnreachable:
            acct = None
        if acct is not None and not (down and acct[0] == "PENDING"):
            return Seen(acct[0], "sacct", restarts=acct[1], unreachable=down)
        seen = _from_history(ref, db)
        if seen is not None and not down:
            return seen
    seen = _from_events(summary) if summary is not None else None
    if seen is None and ref.job_id:
        seen = _from_history(ref, db)
    seen = seen if seen is not None else Seen("UNKNOWN", "none")
    return seen._replace(unreachable=down, not_asked=absent)


def job_now(job_id: str, run: Path | None) -> JobInfo | None:
    """The job as squeue sees it now; a run of members (``run``'s) as one job, from its array's
    tasks (:func:`members_state`; ``info`` alone where they cannot be listed). None once Slurm
    has forgotten it."""
    from pipeswift_slurm.slurm import client as slurm
    info = slurm.job_info(job_id)
    if info is not None and run is not None and memberfiles.newest_sealed(run) is not None:
        try:
            tasks = slurm.array_tasks(job_id)
        except SlurmError:
            tasks = []
        info = members_state(tasks or [info], memberfiles.finished(run), info)
    return info


def members_state(tasks: list[JobInfo], finished: bool, own: JobInfo) -> JobInfo:
    """The run's state from its members' (array tasks): RUNNING while one runs (as that task);
    once the run trained every step (``finished``) and none runs, COMPLETED: the members still
    queued then were cancelled by the run (pipeswift_launch.train), their CANCELLED is not the
    run's end; PENDING while one waits; else ``own``, the array's record of how it ended."""
    # a task COMPLETING once the run trained every step is ending, not training (CI read it so
    # after squeue listed no task of the array)
    running = [t for t in tasks if not t.terminal and t.state != "PENDING" and not (finished and t.state == "COMPLETING")]
    if running:
        return running[0]
    if finished:
        return own._replace(state="COMPLETED", reason="")
    pending = [t for t in tasks if t.state == "PENDING"]
    return pending[0] if pending else own


def has_ended(job_id: str, run: Path, note: Callable[[str], None]) -> bool:
    """Whether the job has ended, for `logs -f`: Slurm's word; while slurmctld does not answer,
    not yet; where Slurm cannot be asked at all, the run's events' word (said once)."""
    from pipeswift_slurm.errors import SlurmAbsent, SlurmUnreachable
    from pipeswift_slurm.slurm import client as slurm
    try:
        info = job_now(job_id, run)
    except SlurmUnreachable:
        return False
    except SlurmAbsent as e:
        note(f"note: Slurm not asked ({slurm.brief(e)}); the job's end is its events'")
        seen = _from_events(rundir.summarize(run))
        return seen is not None and seen.state != "RUNNING"
    return info is None or info.terminal


class Progress(NamedTuple):
    step: int
    total: int | None
    eta_s: float | None   # the steps left at the running attempt's median step time

    def line(self) -> str:
        of = f"/{self.total}" if self.total else ""
        eta = f", ETA {duration(self.eta_s)}" if self.eta_s is not None else ""
        return f"step {self.step}{of}{eta}"


def progress(summary: dict[str, Any], running: bool) -> Progress | None:
    """Step N of M; while ``running``, the ETA at the newest attempt's median step time."""
    if summary["step"] is None:
        return None
    total = summary["steps_total"]
    step_s = summary["attempts"][-1]["median_step_s"] if summary["attempts"] else None
    eta = max(0, total - summary["step"]) * step_s if running and total and step_s else None
    return Progress(summary["step"], total, eta)


def status_of(ref: JobRef, db: Path | None = None) -> dict[str, Any]:
    """Everything `pswift status` says of a job: its state and where that was read, step N of
    M and the ETA, the log, who cancelled it, and the run's attempts (rundir.summarize)."""
    from pipeswift_slurm.reports.logs import log_path
    summary = rundir.summarize(ref.run) if ref.run is not None else None
    seen = state(ref, summary, db)
    if seen.source == "none" and summary is None:
        raise UnknownJob(f"job {ref.key} is unknown to Slurm, to sacct, to the history and to pswift's "
                         f"registry ({rundir.state_dir() / 'jobs'}); pass its run directory instead")
    p = progress(summary, running=seen.state == "RUNNING") if summary is not None else None
    log = log_path(ref.run, ref.job_id) if ref.run is not None and ref.job_id else None
    return {
        "members": memberfiles.summary(ref.run) if ref.run is not None else None,
        "job_id": ref.job_id, "key": ref.key, "state": seen.state, "source": seen.source,
        "slurm_unreachable": seen.unreachable or None, "slurm_not_asked": seen.not_asked or None,
        "reason": seen.reason or None, "restarts": seen.restarts, "nodes": seen.nodes or None,
        "eta_s": p.eta_s if p else None, "progress": p.line() if p else None,
        "log": str(log) if log is not None and os.path.lexists(log) else None,
        **(summary or {"run_dir": None, "step": None, "steps_total": None, "first_loss": None,
                       "last_loss": None, "cancelled": None, "growths": [], "attempts": []}),
    }


def others_listing(users: Sequence[str], limit: int | None = 20) -> list[dict[str, Any]]:
    """``users``' pswift jobs that Slurm holds (everyone's with none), newest first, as
    :func:`listing`'s rows with their user: a job is pswift's when its working directory is a
    run directory (plan.json, read as its owner's hostile file: no link, bounded), so only the
    run directories the asker can read are listed (an admin's: all of them). A job's events are
    folded only once its plan.json (small, bounded) names a pswift job: any other working
    directory costs one bounded read, never a fold of whatever events.jsonl it holds."""
    from pipeswift_slurm.slurm import client as slurm
    rows = []
    for job in sorted(slurm.held_jobs(users), key=lambda j: -int(j.job_id) if j.job_id.isdigit() else 0):
        if not rundir.job_name_of(Path(job.work_dir)):
            continue   # not a run directory, or one this account cannot read
        try:
            summary = rundir.summarize(Path(job.work_dir))
        except PswiftError:
            summary = None
        if summary is None or not summary.get("job_name"):
            continue   # not a run directory, or one this account cannot read
        rows.append({**_job_row(job.job_id, job.state, summary, job.work_dir), "user": job.user})
        if limit is not None and len(rows) >= limit:
            break
    return rows


def listing(limit: int | None = 20, warn: Callable[[str], None] = lambda msg: None) -> list[dict[str, Any]]:
    """This user's pswift jobs, newest first (the registry): id, name, state (Slurm's for the
    queued and running ones, one query for all; else what the run's events say), step N/M, ETA,
    attempts, nodes x stages of the newest attempt, run directory."""
    from pipeswift_slurm.slurm import client as slurm
    try:
        active = {j.job_id: j for j in slurm.active_jobs()}
    except PswiftError as e:   # no Slurm to ask (down, or not this machine's): the events still say
        active = {}
        warn(f"warning: Slurm not asked ({e}); states from the runs' events")
    rows = []
    for job_id, run in rundir.registered_jobs(limit):
        try:
            summary = rundir.summarize(run)
        except PswiftError:
            summary = None
        info = active.get(job_id)
        seen = _from_events(summary) if summary is not None else None
        state_now = info.state if info is not None else \
            "CANCELLED" if summary and summary["cancelled"] else seen.state if seen else "UNKNOWN"
        rows.append(_job_row(job_id, state_now, summary, str(run)))
    return rows


def _job_row(job_id: str, state_now: str, summary: dict[str, Any] | None, run_dir: str) -> dict[str, Any]:
    """One row of a job listing: step N/M, the ETA while running, attempts, nodes x stages of
    the newest attempt (None where the run directory says nothing)."""
    p = progress(summary, state_now == "RUNNING") if summary is not None else None
    last = summary["attempts"][-1] if summary and summary["attempts"] else {}
    return {"job_id": job_id, "name": summary.get("job_name") if summary else None, "state": state_now,
            "step": summary["step"] if summary else None, "steps": summary["steps_total"] if summary else None,
            "eta_s": p.eta_s if p else None, "attempts": len(summary["attempts"]) if summary else 0,
            "nodes": last.get("nodes"), "stages": last.get("stages"), "run_dir": run_dir}


def cancel(ref: JobRef, signal: str | None = None) -> None:
    """scancel the job; its run directory keeps who did it and when (status shows it). With
    ``signal``, only send it (USR2: checkpoint and requeue; TERM: checkpoint and stop)."""
    from pipeswift_slurm.slurm import client as slurm
    if not ref.job_id:
        raise NotAJob(f"{ref.key} is a local run: stop it with Ctrl-C (TERM) where it runs")
    if ref.run is not None:   # the run directory's JOB_ID is its owner's word: Slurm must agree
        from pipeswift_slurm import userfiles
        try:   # the owner of the folder JOB_ID was read from; else the folder opened once
            owner = ref.owner if ref.owner is not None else userfiles.dir_owner(str(ref.run))
        except userfiles.UnsafeFile as e:
            raise NotAJob(f"run directory not read: {e}; not cancelled") from None
        job = slurm.job_info(ref.job_id)
        if job is not None and job.user_id is not None and job.user_id != owner:
            raise NotAJob(f"job {ref.job_id} belongs to uid {job.user_id}, but run directory {ref.run} "
                          f"belongs to uid {owner}: not cancelled (its JOB_ID names another user's job); "
                          f"cancel that job by its id if you mean it")
    slurm.cancel(ref.job_id, signal)
    if ref.run is not None and signal is None:
        rundir.record_cancel(ref.run, ref.job_id, getpass.getuser(), time.time())


class Watched(NamedTuple):
    state: str               # the last state Slurm gave ("GONE": it no longer knows the job)
    timed_out: bool


def wait(job_id: str, run: Path, say: Callable[[str], None], timeout: float | None = None,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
         query: Callable[[str], Any] | None = None,
         summarize: Callable[[Path], dict[str, Any]] = rundir.summarize) -> Watched:
    """Until the job ends (or ``timeout`` seconds pass): its state changes, requeues, each
    attempt's start and restarts, and every ``PROGRESS_EVERY_S`` its step N/M and ETA, through
    ``say``. Slurm is asked at 1, 2, 4 ... 30 s intervals (back to 1 s when the job's events
    change, so its end is seen at once); the events are read every ``EVENTS_EVERY_S``."""
    from pipeswift_slurm.errors import SlurmUnreachable
    query = query or (lambda j: job_now(j, run))
    start = clock()
    interval, next_query = POLL_FIRST_S, start
    last_state, restarts, seen = "", 0, (0, 0, 0)   # (attempts, crashes, ended attempts) said
    next_progress, last_step = start, None
    next_read, s = start + EVENTS_EVERY_S, summarize(run)
    while True:
        now = clock()
        if now >= next_query:
            try:
                info = query(job_id)
            except SlurmUnreachable as e:   # an outage is not an end: say it once, ask again later
                if last_state != "UNREACHABLE":
                    say(f"job {job_id}: Slurm unreachable ({e}); still following it")
                    last_state = "UNREACHABLE"
                next_query = now + POLL_MAX_S
                continue
            st = info.state if info is not None else "GONE"
            if st != last_state:
                reason = info.reason if info is not None and info.reason not in ("", "None") else ""
                say(f"job {job_id}: {st}" + (f" ({reason})" if reason else ""))
                last_state = st
            if info is not None and info.restarts > restarts:
                say(f"job {job_id}: requeued (restart {info.restarts})")
                restarts = info.restarts
            if info is None or info.terminal:
                return Watched(st, False)
            next_query = now + interval
            interval = min(POLL_MAX_S, interval * 2)
        if now >= next_read:
            t0 = time.perf_counter()
            s = summarize(run)
            next_read = now + max(EVENTS_EVERY_S, EVENTS_SHARE * (time.perf_counter() - t0))
        for a in s["attempts"][seen[0]:]:
            say(f"job {job_id}: attempt {a['attempt']} on {a['nodes']} node(s), {a['stages']} stage(s)"
                + (f", from step {a['start_step']}" if a["start_step"] else ""))
        crashes = [c for a in s["attempts"] for c in a["crashes"]]
        for c in crashes[seen[1]:]:
            say(f"job {job_id}: {crash_line(c)}")
        ended = [a for a in s["attempts"] if a["ended"] not in (None, "running")]
        for a in ended[seen[2]:]:
            say(f"job {job_id}: attempt {a['attempt']} ended ({a['ended']}) at step {a['end_step']}")
        now_seen = (len(s["attempts"]), len(crashes), len(ended))
        if now_seen != seen:   # the job moved: Slurm's view will change soon
            next_query, interval = min(next_query, now + POLL_FIRST_S), 2 * POLL_FIRST_S
        seen = now_seen
        # the events see an attempt start before squeue (polled at up to POLL_MAX_S) says RUNNING
        attempt_running = bool(s["attempts"]) and s["attempts"][-1]["ended"] in (None, "running")
        p = progress(s, running=last_state == "RUNNING" or attempt_running)
        if p is not None and p.step != last_step and now >= next_progress:
            say(f"job {job_id}: {p.line()}")
            last_step, next_progress = p.step, now + PROGRESS_EVERY_S
        if timeout is not None and now - start >= timeout:
            return Watched(last_state, True)
        sleep(max(0.05, min(EVENTS_EVERY_S, next_query - clock())))
