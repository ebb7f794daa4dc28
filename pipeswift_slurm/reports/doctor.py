"""`pswift doctor JOB` as a library call: where one job's completion time went and what to try
(reports.jct's symptom table over its history rows, plan.json and log), with every re-layout,
growth and crash of its attempts; the command prints the :class:`Diagnosis`. (Without a job,
`pswift doctor` checks the machine's set-up: reports.checkup.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

from pipeswift_slurm import runfiles, userfiles
from pipeswift_slurm.errors import PswiftError, RunDirError
from pipeswift_slurm.eventlines import crash_line, growth_line, relayout_line
from pipeswift_slurm.history import rundir
from pipeswift_slurm.history.selection import Selection
from pipeswift_slurm.history.store import History
from pipeswift_slurm.plan import parse_plan
from pipeswift_slurm.reports.jct import diagnose, job_reports


class Diagnosis(NamedTuple):
    job_id: str
    name: str | None
    state: str | None
    attempts: int
    findings: list[str]

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


def doctor(job_id: str, db: Path | str | None = None, note: Callable[[str], None] = lambda msg: None) -> Diagnosis:
    """The job's findings, from the history (the registered runs ingested first) and its run
    directory, read as its owner's hostile files (no link, no FIFO, bounded); ``note`` hears
    what could not be read. RunDirError when the history has no such job."""
    h = History(db)
    try:
        h.ingest_registered()
        reps = job_reports(h, Selection(job_ids=(job_id,)))
        relayouts = h.job_relayouts(reps[-1].run_dir) if reps and reps[-1].run_dir else []
    finally:
        h.close()
    if not reps:
        raise RunDirError(f"job {job_id} is not in the history; run `pswift history ingest` first")
    rep = reps[-1]
    run = Path(rep.run_dir) if rep.run_dir else rundir.lookup_job(job_id)
    plan, log, crashes = _run_files(run, note) if run is not None else (None, "", [])
    findings = diagnose(rep, plan, log) + [
        growth_line(r) if r["kind"] == "grow" else f"attempt {r['attempt']} {relayout_line(r)}" for r in relayouts
    ] + [f"attempt {c['attempt']} {crash_line(c)}" for c in crashes]
    return Diagnosis(job_id, rep.name, rep.state, rep.attempts, findings)


def _run_files(run: Path, note: Callable[[str], None]) -> tuple[Any, str, list[dict[str, Any]]]:
    """(plan.json or None, the job's log, every crash with its attempt) of ``run``."""
    try:
        files = userfiles.read_for_command(str(run), (runfiles.PLAN, runfiles.SLURM_LOGS))
        summary = rundir.summarize(run)   # events folded as they are read
    except (userfiles.UnsafeFile, OSError, PswiftError) as e:
        files, summary = {}, {"attempts": []}
        note(f"note: run directory {run} not read: {e}")
    try:
        plan = parse_plan(files[runfiles.PLAN], str(run / runfiles.PLAN)) if runfiles.PLAN in files else None
    except PswiftError:
        plan = None   # another version's or a damaged plan: the findings that need it are skipped
    log = "".join(b.decode("utf-8", "replace") for n, b in files.items() if n != runfiles.PLAN)
    crashes = [{**c, "attempt": a["attempt"]} for a in summary["attempts"] for c in a["crashes"]]
    return plan, log, crashes
