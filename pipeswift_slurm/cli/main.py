"""`pswift`: a thin click CLI over the library. Library errors become one line and an exit code.

Each command imports the library modules it uses when it runs: `pswift sbatch` is a user's
submit command, and its start-up counts (bench/submit_latency.py).
"""

from __future__ import annotations

import json
import os
import time
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import click

from pipeswift_slurm import __version__, runfiles
from pipeswift_slurm.cli.common import CLIError, _db_option, _errors, _output, _print, _warn
from pipeswift_slurm.errors import PswiftError
from pipeswift_slurm.starter import EXAMPLES


class _LazyGroup(click.Group):
    """Commands defined in other modules are imported when asked for (click's lazy loading):
    `pswift sbatch` does not pay for the admin commands."""

    LAZY = {"history": "admin:history", "doctor": "admin:doctor", "admin": "admin:admin"}

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: Any, name: str) -> Any:
        if name in self.LAZY:
            import importlib
            module, attr = self.LAZY[name].split(":")
            return getattr(importlib.import_module(f"{__package__}.{module}"), attr)
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pswift")
def cli() -> None:
    """pipeswift-slurm: DeepSpeed pipeline training on Slurm, planned for job completion time.

    \b
    Environment:
      PSWIFT_HOME             pswift's state: the job registry, the history (~/.local/state/pswift)
      PSWIFT_DB               the history database (default $PSWIFT_HOME/history.db; --db wins)
      PSWIFT_SLURM_OUTAGE_S   how long a Slurm query outlasts a controller outage (10 s)
      PSWIFT_SLURM_BACKEND    cli or pyslurm (default: pyslurm where it matches the Slurm here)

    Example:

        pswift sbatch examples/tiny-gpt/train.toml
    """


@cli.command()
@click.argument("directory", default=".", type=click.Path(path_type=Path))
@click.option("--example", type=click.Choice(list(EXAMPLES)), default="tiny-gpt", show_default=True,
              help="The example to start from (both ship with pswift).")
@click.option("-p", "--partition", help="[job] partition to write (default: the site's default partition, "
                                        "asked from Slurm).")
@_errors
def init(directory: Path, example: str, partition: str | None) -> None:
    """Start a project in DIRECTORY (default: here): a commented train.toml and the example's
    model file, planned on the site's default partition. Never replaces a file.

    Examples:

        pswift init my-run && pswift sbatch --wait my-run/train.toml

        pswift init --example gpt2 gpt2-run
    """
    from pipeswift_slurm import starter

    if partition is None:
        from pipeswift_slurm.slurm import client as slurm
        partition = slurm.default_partition()
        if partition is None:
            _warn("warning: Slurm named no default partition (or did not answer): set [job] partition "
                  "in train.toml")
    started = starter.init(directory, example, partition)
    for path in started.files:
        click.echo(f"wrote {path}")
    click.echo("next: " + "\n      ".join(started.next_steps))


def _override_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """-p/-t/--time-policy/-N/-A/-q/-J: sbatch's spellings for train.toml keys, on `sbatch`
    and `plan` alike (config.command_line_overrides makes them keys)."""
    for option in reversed([
        click.option("-p", "--partition", help="[job] partition for this submission (a name, or a,b)."),
        click.option("-t", "--time", "time_limit", help="[job] time for this submission (M, H:MM:SS or "
                     "D-HH:MM:SS): the limit asked of Slurm, as sbatch takes it, unless --time-policy predicted."),
        click.option("--time-policy", type=click.Choice(["predicted", "as_written"]),
                     help="[job] time_policy for this submission: 'predicted' asks the planner's limit within "
                     "[job] time; 'as_written' asks [job] time itself (the default with -t)."),
        click.option("-N", "--nodes", help="[resources] nodes for this submission: N or MIN-MAX."),
        click.option("-A", "--account", help="[job] account for this submission."),
        click.option("-q", "--qos", help="[job] qos for this submission."),
        click.option("-J", "--job-name", help="[job] name for this submission.")]):
        fn = option(fn)
    return fn


@cli.command()
@click.argument("toml", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@_override_options
@click.option("--mail-type", help="sbatch's --mail-type (e.g. END,FAIL).")
@click.option("--mail-user", help="sbatch's --mail-user.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Run directory to create (default: ./pswift-runs/NAME-DATE-XXXX).")
@click.option("--dry-run", is_flag=True, help="Print the plan and the batch script; submit nothing.")
@click.option("--parsable", is_flag=True, help="Print only the job id.")
@click.option("--wait", is_flag=True, help="Follow the job until it ends (state changes, requeues, restarts, step N/M "
              "and ETA), then print its loss and log; exit 0 if it completed, 1 if it ended otherwise.")
@click.option("--timeout", type=click.FloatRange(0, None), help="Stop --wait after this many seconds (the job "
              "goes on) with exit code 124; default: no limit, as `sbatch --wait`.")
@_db_option
@_errors
def sbatch(toml: Path, sbatch_args: tuple[str, ...], partition: str | None, time_limit: str | None,
           time_policy: str | None, nodes: str | None, account: str | None, qos: str | None, job_name: str | None,
           mail_type: str | None, mail_user: str | None, run_dir: Path | None, dry_run: bool,
           parsable: bool, wait: bool, timeout: float | None, db: Path | None) -> None:
    """Plan TOML and submit it with sbatch; prints the job id.

    -p, -t, -N, -A, -q and -J set their train.toml key for this submission (checked as the
    TOML's own; the plan says so). Options after `--` go to sbatch unchanged. The run directory
    keeps a copy of the TOML, plan.json, the batch script, the job log and its events.

    Examples:

        pswift sbatch examples/tiny-gpt/train.toml

        pswift sbatch --dry-run examples/tiny-gpt/train.toml > job.sh

        pswift sbatch -p high -t 5 -N 1-2 train.toml

        pswift sbatch train.toml -- --mail-type=END --comment=sweep
    """
    if timeout is not None and not wait:
        raise CLIError("--timeout bounds --wait: add --wait (or leave --timeout out)", 2)
    from pipeswift_slurm.config import command_line_overrides
    from pipeswift_slurm.slurm import client as slurm
    slurm.prefetch()   # asks Slurm while the planner's modules load
    from pipeswift_slurm import submit as sub
    overrides = command_line_overrides(partition=partition, time=time_limit, time_policy=time_policy, nodes=nodes,
                                       account=account, qos=qos, job_name=job_name)
    mail = tuple(f"--mail-{k}={v}" for k, v in (("type", mail_type), ("user", mail_user)) if v)
    p = sub.prepare(toml, run_dir, db, warn=_warn, sbatch_args=mail + sbatch_args, learn=not dry_run,
                    overrides=overrides)
    if dry_run:
        _print_dry_run(p)
        return
    job = sub.submit(p, warn=_warn)
    if parsable:
        click.echo(job.job_id)
    else:
        click.echo(f"Submitted pswift job {job.job_id} ({p.layout_line()})")
        click.echo(f"run directory: {job.run_dir}")
    if wait:
        sys.exit(_wait(job.job_id, job.run_dir, timeout, quiet=parsable, db=db))


def _print_dry_run(p: Any) -> None:
    """The batch script on stdout (`> job.sh; sbatch job.sh` submits it), the plan on stderr."""
    def note(line: str) -> None:
        click.echo(line, err=True)
    plan = p.plan
    note(f"# plan: {p.layout_line()}")
    if p.overrides:
        from pipeswift_slurm.config import describe_overrides
        note(f"# from the command line: {describe_overrides(p.overrides)}")
    if plan["prediction"]:
        pr = plan["prediction"]
        note(f"# chosen: {pr['nodes']} node(s), predicted {pr['step_s']:.4g} s/step, JCT "
             f"{pr['jct_s']:.0f} s (queue {pr['queue_s']:.0f} s); request --nodes={plan['nodes_request']}")
    for n, why in plan["infeasible"].items():
        note(f"# {n} node(s) infeasible: {why}")
    from pipeswift_slurm.planning.build import limits_of
    from pipeswift_slurm.planning.limits import describe
    note(f"# {describe(limits_of(plan))}")
    if p.sbatch_args:
        note(f"# sbatch arguments: {' '.join(p.sbatch_args)} (#SBATCH lines of the script)")
    from pipeswift_slurm.submit import dry_run_script
    note(f"# run directory {p.run_dir}: the script makes it when the job first starts (`sbatch job.sh`)")
    click.echo(dry_run_script(p), nl=False)


def _learn(run: Path, db: Path | None) -> None:
    """A finished run into the history, so that the next `pswift plan` learns from it (plan
    itself writes nothing)."""
    from pipeswift_slurm.history.store import IngestRefused, safe_open
    h = safe_open(db, _warn)
    if h is None:
        return
    try:
        h.ingest_run_dir(run)
    except (IngestRefused, PswiftError, OSError) as e:
        _warn(f"warning: {run} not added to the history ({e})")
    finally:
        h.close()


def _wait(job_id: str, run: Path, timeout: float | None, quiet: bool = False, db: Path | None = None) -> int:
    from pipeswift_slurm.terminal import inert
    from pipeswift_slurm.history import rundir
    from pipeswift_slurm.reports.watch import TIMEOUT_EXIT, JobRef, state, wait
    def say(line: str) -> None:   # each line with the local time it was seen, as `HH:MM:SS job N: ...`
        click.echo(f"{time.strftime('%H:%M:%S')} {inert(line)}")
    watched = wait(job_id, run, (lambda line: None) if quiet else say, timeout)
    if watched.timed_out:
        _warn(f"job {job_id} still {watched.state} after {timeout:.0f} s; it goes on: "
              f"`pswift status {job_id}`, `pswift logs {job_id} -f`")
        return TIMEOUT_EXIT
    final = watched.state
    if final == "GONE":   # purged before a poll saw its end: ask slurmdbd and the history
        final = state(JobRef(job_id, run, job_id), None, db).state
    _learn(run, db)
    s = rundir.summarize(run)
    if not quiet:
        if final != watched.state:
            click.echo(f"job {job_id}: {final}")
        if s["first_loss"] is not None:
            click.echo(f"loss {s['first_loss']:.4f} -> {s['last_loss']:.4f} after step {s['step']}")
        click.echo(f"log: {run / runfiles.slurm_log(job_id)}")
    return 0 if final == "COMPLETED" else 1


@cli.command("run")
@click.argument("toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Run directory to create (default: ./pswift-runs/NAME-DATE-XXXX).")
@click.option("--nodes", type=int, help="Node count to emulate (default: the TOML's minimum).")
@_db_option
@_errors
def run_cmd(toml: Path, run_dir: Path | None, nodes: int | None, db: Path | None) -> None:
    """Run TOML's job here, one local process per slot, without Slurm.

    Same plan, launcher and events as `pswift sbatch`; TERM/INT/USR2 make every rank checkpoint
    and stop at the same step. A crashed or killed rank restarts the ranks from the newest
    checkpoint within [job] max_restarts, and a re-layout launches them again, as in a Slurm job.

    Example:

        pswift run examples/tiny-gpt/train.toml --run-dir /tmp/tiny
    """
    from pipeswift_slurm.history import rundir
    from pipeswift_slurm import submit as sub
    from pipeswift_slurm.local import run_local

    p = sub.prepare(toml, run_dir, db, live=False, warn=_warn)
    n = nodes or p.config.resources.nodes_min
    if str(n) not in p.plan["layouts"]:
        why = p.plan["infeasible"].get(str(n), f"outside [resources] nodes {p.config.resources.nodes_spec}")
        raise CLIError(f"--nodes {n}: {why}", 2)
    target = sub.write_run_dir(p)
    rundir.register_job(f"local-{target.name}", target)  # so the history ingests local runs too
    click.echo(f"running locally: {p.layout_line(n)}")
    click.echo(f"run directory: {target}")
    rc = run_local(p.plan, str(target / runfiles.PLAN), n)
    _learn(target, db)
    s = rundir.summarize(target)
    if s["first_loss"] is not None:
        click.echo(f"loss {s['first_loss']:.4f} -> {s['last_loss']:.4f} after step {s['step']}")
    sys.exit(rc)


@cli.command()
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


@cli.command()
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


@cli.command()
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


@cli.command()
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


@cli.command()
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


@cli.command("plan")
@click.argument("toml", type=click.Path(dir_okay=False, path_type=Path))
@_override_options
@click.option("--json", "as_json", is_flag=True, help="{chosen, candidates} as JSON.")
@_db_option
@click.option("--no-live", is_flag=True, help="Do not ask Slurm for the live cluster state.")
@click.option("--test-only", is_flag=True,
              help="Ask `sbatch --test-only` for each node count's start (uses a job id each).")
@_errors
def plan_cmd(toml: Path, partition: str | None, time_limit: str | None, time_policy: str | None,
             nodes: str | None, account: str | None, qos: str | None, job_name: str | None, as_json: bool,
             db: Path | None, no_live: bool, test_only: bool) -> None:
    """Rank every candidate layout of TOML by estimated job completion time, and say why.

    JCT = queue wait (live sinfo/squeue) + setup + steps x step time (cost model on per-layer
    costs from the history or [model] layer_costs, calibrated by measured runs) + checkpoints +
    expected preemption loss. p10-p90: the JCT's band from the step model's measured error,
    step-time variance, past queue waits and the partition's preemption rate; [job] objective
    ranks by the mean (default), p50 or p90. Rejected candidates say why.

    Examples:

        pswift plan examples/tiny-gpt/train.toml

        pswift plan train.toml --json

        pswift plan -p high -t 30 -N 1-2 train.toml
    """
    from rich.console import Console
    from rich.table import Table

    from pipeswift_slurm.planning.limits import describe
    from pipeswift_slurm.planning.planner import explain
    from pipeswift_slurm.submit import plan_report

    from pipeswift_slurm.config import command_line_overrides
    overrides = command_line_overrides(partition=partition, time=time_limit, time_policy=time_policy, nodes=nodes,
                                       account=account, qos=qos, job_name=job_name)
    report = plan_report(toml, db, not no_live, _warn, test_only, overrides)
    if report.result is None:
        _print_unplanned(report, as_json)
        return
    res = report.result
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        if res.fits_nowhere():
            raise CLIError("no layout can run (see the candidates' reasons); change the TOML as they say", 2)
        return
    con = Console(highlight=False, markup=False, soft_wrap=True, color_system=None,
                  width=max(140, shutil.get_terminal_size().columns))
    con.print(f"profile: {res.profile_source}" + "".join(f"; {n}" for n in res.notes), markup=False)
    con.print(_candidates_table(Table, res))
    con.print(explain(res), markup=False)
    if report.limits is not None:
        con.print(describe(report.limits), markup=False)
    if res.fits_nowhere():
        raise CLIError("no layout can run (reasons above); change the TOML as they say", 2)
    for line in report.model_error_lines():
        con.print(line)


def _print_unplanned(report: Any, as_json: bool) -> None:
    """`pswift plan` of a TOML with no costs to rank by: the layouts `pswift sbatch` would run."""
    from pipeswift_slurm.planning.limits import describe
    from pipeswift_slurm.submit import layout_line
    plan = report.unplanned
    why = ("no per-layer costs yet ([model] layer_costs, or a profile in the history): `pswift sbatch` "
           "runs one stage per task slot, cut by parameters in the job, and profiles the model; the next "
           "plan ranks layouts by the measured times")
    if as_json:
        click.echo(json.dumps({"chosen": None, "candidates": [], "why": why, "nodes_request": plan["nodes_request"],
                               "layouts": plan["layouts"]}, indent=2))
        return
    click.echo(f"{why}\nlayouts: {layout_line(plan)}\nrequest: --nodes={plan['nodes_request']}\n"
               f"{describe(report.limits)}")


def _candidates_table(table_cls: Any, res: Any) -> Any:
    """The planner's candidates as a rich table, in its order: estimate columns, or the reason
    a candidate was rejected."""
    table = table_cls("nodes", "PxDP", "mbs", "m", "boundaries", "queue", "setup", "step", "train", "ckpt",
                      "interrupt", "JCT", "p10-p90", "node-h", "")

    from pipeswift_slurm.durations import duration as f     # the summary's units, each cell with its own
    for i, c in enumerate(res.candidates):
        e = c.estimate
        if e is None:
            table.add_row(str(c.nodes), f"{c.stages}x{c.data_parallel}", str(c.micro_batch_size),
                          str(c.micro_batches), "", "", "", "", "", "", "", "", "", "", f"rejected: {c.rejected}")
            continue
        table.add_row(str(c.nodes), f"{c.stages}x{c.data_parallel}", str(c.micro_batch_size),
                      str(c.micro_batches), str(c.boundaries), f(e.queue_s), f(e.setup_s), f(e.step_s), f(e.train_s),
                      f(e.checkpoint_s), f(e.interruption_s), f(e.jct_s),
                      f"{f(e.jct_p10_s)}-{f(e.jct_p90_s)}" if e.jct_p10_s is not None and e.jct_p90_s is not None else "",
                      f"{e.node_hours:.3g}", "chosen" if c is res.chosen else f"#{i + 1}")
    return table


def _floats(opt: str, text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CLIError(f"{opt} {text!r}: give comma-separated seconds, e.g. {opt} 1,1.5,1", 2) from None


def _stage_times_from_toml(toml: Path, nodes: int | None, db: Path | None
                           ) -> tuple[list[float], list[float], list[float], int, str, dict[str, Any]]:
    """The stages' forward, whole backward and weight-gradient seconds of the layout for
    ``nodes`` as the step model simulates them (the history's profile of the model, else
    [model] layer_costs), its micro-batches, a title, and the layout."""
    import tempfile

    from pipeswift_slurm.autoplan import read_profile
    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.planning.build import build_plan
    from pipeswift_slurm.planning.costmodel import model_passes
    from pipeswift_slurm.planning.partition import balanced_boundaries

    cfg = load_config(toml)
    profile = read_profile(cfg, db, _warn)
    if profile is None:
        raise CLIError(f"{toml}: no per-layer costs to simulate: add [model] layer_costs (forward+backward "
                       f"seconds per micro-batch per layer), run the job once (the history keeps what it "
                       f"measured) or pass --fwd/--bwd", 2)
    plan = build_plan(cfg, Path(tempfile.gettempdir()) / "pswift-simulate")
    n = str(nodes or cfg.resources.nodes_min)
    if n not in plan["layouts"]:
        raise CLIError(f"--nodes {n}: {plan['infeasible'].get(n, 'outside [resources] nodes')}", 2)
    lay = plan["layouts"][n]
    bounds = lay["boundaries"] or balanced_boundaries(profile.costs, lay["stages"])
    fwd, bwd, wgrad = model_passes(profile, bounds, lay["micro_batch_size"])
    source = "the history's profile (measured)" if profile.source == "history" else "[model] layer_costs"
    title = f"{cfg.job.name}: {lay['stages']} stages {bounds}; stage times from {source}"
    return fwd, bwd, wgrad, lay["micro_batches"], title, {**lay, "boundaries": bounds}


def _planned_step(toml: Path, db: Path | None, lay: dict[str, Any]) -> str:
    """What `pswift plan` counts as this layout's step: measured (the history) and the step
    model's prediction (which adds the transfers, the step's fixed work and the calibration to
    the simulated passes), or "" where the planner does not weigh it."""
    from pipeswift_slurm.errors import PswiftError
    from pipeswift_slurm.planning.planner import step_line
    from pipeswift_slurm.submit import plan_report

    try:
        report = plan_report(toml, db, live=False)
    except PswiftError:
        return ""
    key = ("nodes", "stages", "data_parallel", "micro_batches", "micro_batch_size", "boundaries")
    same = [c for c in report.result.candidates if c.estimate is not None
            and all(getattr(c, k) == lay[k] for k in key)]
    if not same:
        return ""
    c = same[0]
    return f"pswift plan's step of this layout under {c.schedule}: {step_line(c.est)}"


@cli.command()
@click.argument("toml", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--fwd", help="Forward seconds per micro-batch, one per stage: 1,1.5,1")
@click.option("--bwd", help="Backward seconds per micro-batch, one per stage: 2,3,2")
@click.option("--wgrad", help="Weight-gradient seconds per micro-batch, one per stage; then --bwd is the "
              "input gradient alone (other schedules run both as one backward). Default: zb-h1 "
              "and zb-h2 take half of --bwd (with TOML: the model's weight-gradient shares).")
@click.option("-m", "--micro-batches", type=int, help="Micro-batches per step (default: the plan's).")
@click.option("--schedule", default="1f1b", show_default=True,
              help="Comma list of gpipe, 1f1b, interleaved, zb-h1, zb-h2 (zb-h2: 2p-1 micro-batches "
              "in flight and steps back to back, the paper's optimizer post-validation).")
@click.option("--chunks", type=int, default=2, show_default=True, help="Model chunks per device (interleaved).")
@click.option("--p2p", type=float, default=0.0, show_default=True, help="Point-to-point transfer seconds.")
@click.option("--nodes", type=int, help="With TOML: the node count whose layout to simulate.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write a timeline PNG.")
@click.option("--width", type=click.IntRange(20, 1000), default=96, show_default=True,
              help="Terminal timeline width (20-1000 characters).")
@_db_option
@_errors
def simulate(toml: Path | None, fwd: str | None, bwd: str | None, wgrad: str | None,
             micro_batches: int | None, schedule: str, chunks: int, p2p: float, nodes: int | None,
             as_json: bool, plot: Path | None, width: int, db: Path | None) -> None:
    """Simulate pipeline schedules on stage times; print step time, bubble and a timeline.

    Stage times come from --fwd/--bwd, or from TOML: the plan's layout, each stage's passes as
    pswift's step model simulates them (the layers' and the engine's times and the weight-gradient
    shares a run of the model measured, kept by the history; else [model] layer_costs). One look
    at the timeline shows the bottleneck stage. With TOML, the step `pswift plan` counts for that
    layout is printed too: the one measured beside the model's, which adds the transfers and the
    optimizer.

    Examples:

        pswift simulate --fwd 1,1.5,1 --bwd 2,3,2 -m 8 --schedule gpipe,1f1b,zb-h1

        pswift simulate --fwd 1,1,1,1 --bwd 1,1,1,1 --wgrad 1,1,1,1 -m 8 --schedule 1f1b,zb-h1,zb-h2

        pswift simulate examples/tiny-gpt/train.toml --schedule gpipe,1f1b,interleaved --plot t.png
    """
    from pipeswift_slurm.planning import timeline
    from pipeswift_slurm.planning.simulate import ZERO_BUBBLE, SimulationError
    from pipeswift_slurm.planning.simulate import simulate as run_sim

    w: list[float] | None
    if toml is not None:
        if fwd or bwd or wgrad:
            raise CLIError("give either a TOML or --fwd/--bwd/--wgrad, not both", 2)
        f, b, w, m_plan, title, lay = _stage_times_from_toml(toml, nodes, db)
        if not as_json:
            title = "\n".join(x for x in (title, _planned_step(toml, db, lay)) if x)
        micro_batches = micro_batches or m_plan
    else:
        f, b, w = _given_stage_times(fwd, bwd, wgrad)
        title = ""
        if micro_batches is None:
            raise CLIError("--micro-batches is required with --fwd/--bwd", 2)
    names = [x.strip() for x in schedule.split(",") if x.strip()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CLIError(f"--schedule names {', '.join(twice)} more than once: give each schedule once", 2)
    try:
        results = [run_sim(f, b, micro_batches, n, p2p=p2p, chunks=chunks, wgrad=w if n in ZERO_BUBBLE else None)
                   for n in names]
    except SimulationError as e:
        raise CLIError(str(e), 2) from None
    if plot is not None:
        timeline.plot(results, plot, title)
    if as_json:
        out = [r.to_dict() for r in results]
        click.echo(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return
    _print_simulations(results, title, width, plot)


def _given_stage_times(fwd: str | None, bwd: str | None, wgrad: str | None
                       ) -> tuple[list[float], list[float], list[float] | None]:
    """--fwd, --bwd (with --wgrad: the input gradient alone, made the whole backward here, which
    zero-bubble splits again) and --wgrad."""
    f, b, w = _floats("--fwd", fwd), _floats("--bwd", bwd), _floats("--wgrad", wgrad)
    if f is None or b is None:
        raise CLIError("give a train.toml, or --fwd and --bwd (one value per stage)", 2)
    if w is not None:
        if len(w) != len(b):
            raise CLIError(f"--wgrad has {len(w)} value(s) for {len(b)} stage(s): give one per stage", 2)
        b = [x + y for x, y in zip(b, w)]
    return f, b, w


def _print_simulations(results: list[Any], title: str, width: int, plot: Path | None) -> None:
    """`pswift simulate`'s table of schedules, then each one's timeline."""
    from rich.console import Console
    from rich.table import Table

    from pipeswift_slurm.planning import timeline

    con = Console(highlight=False, markup=False, soft_wrap=True, color_system=None)
    if title:
        con.print(title)
    table = Table("schedule", "step time", "bubble", "peak in-flight", "slowest stage (busy)")
    for r in results:
        slow = max(range(r.devices), key=lambda d: r.busy[d])
        table.add_row(r.schedule + (f" v={r.chunks}" if r.chunks > 1 else ""), f"{r.step_time:.4g}",
                      f"{r.bubble_ratio:.1%}", str(max(r.peak_in_flight)),
                      f"stage {slow} ({r.busy[slow]:.4g})")
    con.print(table)
    for r in results:
        con.print(f"\n{r.schedule}" + (f" (v={r.chunks})" if r.chunks > 1 else ""))
        for line in timeline.text_timeline(r, width):
            con.print(line, markup=False)
    if plot is not None:
        con.print(f"\ntimeline written to {plot}")


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True,
              help="The safetensors file to write (a link there is replaced, never written through).")
@click.option("--step", type=click.IntRange(0, None), help="The committed checkpoint of this step (default: the newest).")
@click.option("--hf", is_flag=True, help="A Hugging Face folder instead (-o DIR; GPT2LMHeadModel.from_pretrained "
              "loads it): a run of the gpt2 example (pipeswift_launch.gpt2's layers).")
@_errors
def export(run_dir: Path, out: Path, step: int | None, hf: bool) -> None:
    """The trained model of RUN_DIR as one state dict (safetensors), in the order of the model's
    build_layers and loadable without pipelining: torch.nn.Sequential of those layers, or
    pipeswift_slurm.api.load_model(RUN_DIR). Runs with the job's Python (torch, deepspeed).

    Example:

        pswift export pswift-runs/tiny-gpt-20261205-1200-ab12 -o model.safetensors

        pswift export pswift-runs/gpt2-20261205-1300-cd34 --hf -o gpt2-trained
    """
    import subprocess
    from pipeswift_slurm.errors import PswiftError
    try:
        python = json.loads((run_dir / runfiles.PLAN).read_text())["python"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CLIError(f"{run_dir} is not a run directory (no readable plan.json); give the folder "
                       f"`pswift sbatch` printed", 2) from None
    cmd = [python if Path(python).exists() else sys.executable, "-m", "pipeswift_launch.export",
           os.path.abspath(run_dir), "-o", os.path.abspath(out)] + (["--step", str(step)] if step is not None else []) \
        + (["--hf"] if hf else [])
    # abspath, not resolve: a link at -o is replaced by the export, never followed
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PswiftError(f"export did not run ({e})") from None
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.splitlines() if x.startswith("Error: ")] or proc.stderr.strip().splitlines()[-1:]
        raise CLIError((lines[-1] if lines else "export failed").removeprefix("Error: "), 1)
    click.echo(proc.stdout.strip().splitlines()[-1])   # its line, not the libraries' start-up notes


@cli.command()
@click.option("--costs", required=True, help="Seconds per layer (forward+backward): 1,2,2,2,1")
@click.option("--stages", type=click.IntRange(1, None), help="Number of pipeline stages (required).")
@click.option("--memory", help="Bytes per layer, for --memory-cap: 4e8,1e8,...")
@click.option("--memory-cap", type=float, help="Most memory one stage may hold (bytes).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def partition(costs: str, stages: int | None, memory: str | None,
              memory_cap: float | None, as_json: bool) -> None:
    """Cut layers into contiguous stages that minimise the slowest stage (exact).

    For people who cut by hand: the result goes into [pipeline] partition = [0, ...].

    Examples:

        pswift partition --costs 5,1,1,1,1,1,1,1,1,6 --stages 4

        pswift partition --costs 1,1,1,1 --memory 3,1,1,3 --memory-cap 4 --stages 2 --json
    """
    from pipeswift_slurm.planning.partition import PartitionError, balanced_boundaries, stage_sums

    if stages is None:
        raise CLIError("give --stages N: the number of pipeline stages", 2)
    c = _floats("--costs", costs) or []
    mem = _floats("--memory", memory)
    if memory_cap is not None and mem is None:
        raise CLIError("--memory-cap needs --memory (bytes per layer)", 2)
    try:
        b = balanced_boundaries(c, stages, mem, memory_cap)
    except PartitionError as e:
        raise CLIError(str(e), 2) from None
    sums = stage_sums(c, b)
    out: dict[str, Any] = {"boundaries": b, "stage_costs": sums, "bottleneck": max(sums),
           "balance": (sum(sums) / len(sums)) / max(sums) if max(sums) > 0 else 1.0}
    if mem is not None:
        out["stage_memory"] = stage_sums(mem, b)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"boundaries {b}  (TOML: partition = {b})")
    for s_, (a, z) in enumerate(zip(b, b[1:])):
        extra = f", memory {out['stage_memory'][s_]:g}" if mem is not None else ""
        click.echo(f"  stage {s_}: layers {a}-{z - 1}, cost {sums[s_]:g}{extra}")
    click.echo(f"bottleneck {max(sums):g}; balance {out['balance']:.1%} (mean stage / slowest)")


def _usage_error_in_one_line(self: click.UsageError, file: Any = None) -> None:
    """click's usage error as one line: what is wrong and where the options are listed (click
    prints the usage, a hint and the error on three)."""
    where = f" (see `{self.ctx.command_path} --help`)" if self.ctx is not None else ""
    click.echo(f"Error: {self.format_message().rstrip('.')}{where}", err=True, file=file)


def main() -> None:
    from pipeswift_slurm.terminal import guard
    guard()         # nothing reaches stdout or stderr with a control character in it
    click.UsageError.show = _usage_error_in_one_line   # type: ignore[method-assign]  # every error: one line
    cli(prog_name="pswift")


if __name__ == "__main__":
    main()
