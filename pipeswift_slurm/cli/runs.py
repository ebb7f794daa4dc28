"""`pswift logs`, `status`, `plot`, `jobs` and `cancel`: a user's submitted runs, watched and
stopped (loaded when one of them is asked for: `pswift sbatch` does not pay for them)."""

from __future__ import annotations

# Imports inside functions: each command imports the library it runs when it runs, so `pswift
# --help` and `pswift sbatch` load none of the others

import json
import sys
from pathlib import Path
from typing import Any

import click

from pipeswift_slurm.cli.common import CLIError, _db_option, _errors, _output, _print, _warn


@click.command()
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Go on printing what is appended, across requeues, until the job ends.")
@click.option("--lines", type=click.IntRange(0, None), help="Only the last N lines (default: the whole log, its last 4 MiB).")
@click.option("--raw", is_flag=True, help="The log's bytes as written, escapes and colours included (for `less -R`); "
              "otherwise each control character but newline and tab is shown as '?'.")
@_errors
def logs(job: str, follow: bool, lines: int | None, raw: bool) -> None:
    """The log of JOB (an id or a run dir): RUN_DIR/slurm-JOBID.out, which every attempt of a
    requeued job appends to. Control characters are shown as '?', to a terminal and a pipe
    alike, unless --raw.

    Examples:

        pswift logs 42 -f

        pswift logs 42 --lines 20

        pswift logs 42 --raw | less -R
    """
    from pipeswift_slurm.terminal import raw_stdout
    from pipeswift_slurm.reports.logs import log_path, show
    from pipeswift_slurm.reports.watch import has_ended, resolve
    from pipeswift_slurm.userfiles import UnsafeFile, become_owner
    ref = resolve(job)
    if ref.run is None:
        raise CLIError(f"job {job} is not in pswift's registry; pass its run directory instead", 1)
    if ref.job_id is None:
        raise CLIError(f"{job} is a local run: its output went to the terminal that ran it, its "
                       f"events are in {ref.run / 'events.jsonl'}", 2)
    run, job_id = ref.run, ref.job_id

    said: list[str] = []

    def once(line: str) -> None:   # where Slurm cannot be asked, said once, not every poll
        if not said:
            said.append(line)
            _warn(line)

    def ended() -> bool:
        return has_ended(job_id, run, once)

    path = log_path(run, job_id)
    # the job's user's file: read as its owner when root asks; escapes never reach a terminal
    try:
        owner = become_owner(str(run))
    except UnsafeFile as e:
        raise CLIError(f"run directory not read: {e}", 1) from None
    # through the filter main() put on stdout (control characters inert), or as written with --raw
    out = raw_stdout() if raw else sys.stdout

    def write(text: str) -> None:
        out.write(text)
        out.flush()
    if not show(path, write, lines, follow, ended, owner):
        raise CLIError(f"no log yet at {path}" + ("" if follow else "; -f waits for it"), 1)


@click.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_db_option
@_errors
def status(job: str, as_json: bool, db: Path | None) -> None:
    """State, step N of M and ETA, last loss, attempts, log and run directory of JOB: a job id,
    a run directory or a local run's key (local-NAME). Once Slurm has forgotten the job, its
    state comes from sacct, else from the history.

    Examples:

        pswift status 42

        pswift status 42 --json
    """
    from pipeswift_slurm.eventlines import crash_line, growth_line, relayout_line
    from pipeswift_slurm.terminal import inert
    from pipeswift_slurm.reports.watch import UNREACHABLE_EXIT, resolve, status_of
    ref = resolve(job)
    out = status_of(ref, db)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        if out["slurm_unreachable"]:
            raise SystemExit(UNREACHABLE_EXIT)
        return

    def say(line: str) -> None:   # a job's name, a crash's message: the user's text, made inert
        click.echo(inert(line))

    source = {"slurm": "", "sacct": " (from sacct: Slurm has forgotten the job)",
              "history": " (from the history: Slurm has forgotten the job)",
              "events": " (from its events)", "none": " (no record of its state)"}[out["source"]]
    reason = f" ({out['reason']})" if out["reason"] else ""
    who = f"job {ref.job_id}" if ref.job_id else f"local run {ref.key}"
    say(f"{who}: {out['state']}{reason}{source}")
    say(f"run directory: {out['run_dir'] or 'none known (not submitted by pswift from this account)'}")
    if out["progress"]:
        say(f"{out['progress']}, last loss {out['last_loss']:.6f}")
    if out["log"]:
        say(f"log: {out['log']}")
    if out["cancelled"]:
        c = out["cancelled"]
        say(f"cancelled by {c['user']} with `pswift cancel` at {_iso(c['time'])}")
    for a in out["attempts"]:
        say(f"  attempt {a['attempt']}: {a['nodes']} node(s), {a['stages']} stage(s) "
            f"{a['boundaries']}, steps {a['start_step']} -> {a['end_step']}, {a['ended']}"
            + (f", resumed from {Path(a['resumed_from']).name}" if a["resumed_from"] else ""))
        for r in a["relayouts"]:
            say(f"    {relayout_line(r)}")
        for c in a["crashes"]:
            say(f"    {crash_line(c)}")
    for g in out.get("growths") or []:
        say(f"  {growth_line(g)}")
    if out["members"]:   # a run of members: its newest epoch's, and who waits to join the next
        m = out["members"]
        say(f"members: epoch {m['epoch']} on {m['nodes']} node(s)" + (" (done)" if m["done"] else ""))
        for who, rows in (("in it", m["members"]), ("waiting", m["waiting"])):
            for r in rows:
                say(f"  member {r['task']} ({who}): job {r['job_id']} on {','.join(r['nodes'])}")
    if out["slurm_not_asked"]:     # no Slurm here (not an outage): what the rest knew, exit 0
        whose = {"events": "from its events", "history": "from the history", "sacct": "from sacct"}
        _warn(f"note: Slurm not asked ({out['slurm_not_asked']}); the state above is "
              f"{whose.get(out['source'], 'unknown')}")
    if out["slurm_unreachable"]:   # an outage, not the job's failure: a code of its own
        raise CLIError(f"Slurm unreachable ({out['slurm_unreachable']}): the state above is "
                       f"{'the last one ' + out['source'] + ' knew' if out['source'] != 'none' else 'unknown'}",
                       UNREACHABLE_EXIT)


def _iso(t: float) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def _job_columns(with_user: bool = False) -> list[Any]:
    from pipeswift_slurm.reports.tabular import Col
    return [Col("job_id", "JobID", "text", 8), *([Col("user", "User", "text", 9)] if with_user else []),
            Col("name", "Name", "text", 12), Col("state", "State", "text", 10),
            Col("step", "Step", "int", 7), Col("steps", "Steps", "int", 7), Col("eta_s", "ETA", "s", 9),
            Col("attempts", "Attempts", "int", 8), Col("nodes", "Nodes", "int", 5), Col("stages", "Stages", "int", 6),
            Col("run_dir", "RunDir", "text", 40)]


@click.command()
@click.argument("job")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=Path("run.png"),
              show_default=True, help="The PNG to write.")
@_errors
def plot(job: str, out: Path) -> None:
    """Draw JOB (a job id, local-NAME or a run directory): loss and step time against the step
    over every attempt, each attempt's start and end (and why it ended) marked.

    Examples:

        pswift plot 1234 -o run.png

        pswift plot pswift-runs/tiny-gpt-1234
    """
    from pipeswift_slurm.reports import runplot, watch

    ref = watch.resolve(job)
    if ref.run is None:
        raise CLIError(f"{ref.name} was not submitted by pswift from this account: pass its run directory", 2)
    marked = runplot.draw(runplot.attempts_of(ref.run), f"{ref.name} ({ref.run})", out)
    click.echo(f"wrote {out}: " + "; ".join(marked))


@click.command()
@click.option("-L", "--limit", type=click.IntRange(1, None), default=20, show_default=True,
              help="The newest this many jobs.")
@click.option("-u", "--user", "users", help="These users' pswift jobs that Slurm holds (comma-separated; "
                                            "as squeue -u), with their user: those whose run directories "
                                            "this account can read (an admin: all).")
@click.option("-a", "--allusers", is_flag=True, help="Every user's pswift jobs that Slurm holds (as -u).")
@_output
@_errors
def jobs(out: Any, limit: int, users: str | None, allusers: bool) -> None:
    """List my pswift jobs, newest first (what `squeue --me` is to sbatch): state (Slurm's while
    queued or running, else from the run's events), step N of M, ETA, attempts, nodes x stages
    of the newest attempt, run directory. The history's output forms (-P, --json, --csv, -o).

    Examples:

        pswift jobs

        pswift jobs -o job_id,state,step,eta_s --json

        pswift jobs -u alice,bob
    """
    from pipeswift_slurm.reports import watch
    if users is not None or allusers:
        if users is not None and allusers:
            raise CLIError("-u names users and -a means every user: give one of them", 2)
        names = tuple(u.strip() for u in (users or "").split(",") if u.strip())
        if users is not None and not names:
            raise CLIError("-u needs a user name (-u alice,bob)", 2)
        _print(watch.others_listing(names, limit), _job_columns(with_user=True), out)
        return
    _print(watch.listing(limit, _warn), _job_columns(), out)


@click.command()
@click.argument("jobs", nargs=-1, required=True)
@click.option("--signal", help="Only send this signal to the job's ranks (scancel --signal): USR2 "
              "checkpoints and requeues, TERM checkpoints and stops.")
@_errors
def cancel(jobs: tuple[str, ...], signal: str | None) -> None:
    """Cancel each of JOBS (job ids or run directories) with scancel; its run directory keeps
    who cancelled it and when, and `pswift status` says so. A cancelled job is not requeued.
    One that cannot be cancelled says why on stderr; the others still are (the exit code is the
    last refusal's).

    Examples:

        pswift cancel 42 43

        pswift cancel --signal USR2 42
    """
    from pipeswift_slurm.errors import PswiftError
    from pipeswift_slurm.reports.watch import cancel as cancel_job, resolve
    code = 0
    for job in jobs:
        try:
            ref = resolve(job)
            cancel_job(ref, signal)
        except PswiftError as e:
            code = e.exit_code
            click.echo(f"Error: {e}" if len(jobs) == 1 else f"Error: {job}: {e}", err=True)
            continue
        done = f"sent {signal} to job" if signal else "cancelled job"
        click.echo(f"{done} {ref.job_id}" + (f" (run directory {ref.run})" if ref.run else ""))
    if code:
        sys.exit(code)
