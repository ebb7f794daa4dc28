"""`pswift`: a thin click CLI over the library. Library errors become one line and an exit code.

Each command imports the library modules it uses when it runs: `pswift sbatch` is a user's
submit command, and its start-up counts (bench/submit_latency.py).
"""

from __future__ import annotations

# Imports inside functions: each command imports the library it runs when it runs, so `pswift
# --help` and `pswift sbatch` load none of the others

import importlib
import sys
import time
from pathlib import Path
from typing import Any

import click

from pipeswift_slurm import __version__, runfiles
from pipeswift_slurm.cli.common import CLIError, _db_option, _errors, _override_options, _warn
from pipeswift_slurm.errors import PswiftError
from pipeswift_slurm.starter import EXAMPLES


class _LazyGroup(click.Group):
    """Commands defined in other modules are imported when asked for (click's lazy loading):
    `pswift sbatch` does not pay for the admin commands."""

    LAZY = {"history": "admin:history", "doctor": "admin:doctor", "admin": "admin:admin",
            "logs": "runs:logs", "status": "runs:status", "plot": "runs:plot", "jobs": "runs:jobs",
            "cancel": "runs:cancel", "plan": "model:plan_cmd", "simulate": "model:simulate",
            "export": "model:export", "partition": "model:partition"}

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: Any, name: str) -> Any:
        if name in self.LAZY:
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
    if p.config.resources.members:
        note(f"# members: {plan['members_why']}")
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
    from pipeswift_slurm.history.store import safe_open
    h = safe_open(db, _warn)
    if h is None:
        return
    try:
        h.ingest_run_dir(run)
    except (PswiftError, OSError) as e:   # IngestRefused is one
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
    A run of members ([resources] members) runs each member as its array task would (--nodes:
    the members' nodes to start, default all); a member whose ranks alone are signalled leaves,
    the others train on, and it comes back a few seconds later, as if Slurm requeued it.

    Example:

        pswift run examples/tiny-gpt/train.toml --run-dir /tmp/tiny
    """
    from pipeswift_slurm.history import rundir
    from pipeswift_slurm import submit as sub
    from pipeswift_slurm.local import run_local, run_members

    p = sub.prepare(toml, run_dir, db, live=False, warn=_warn)
    members = p.plan["members"]
    n = nodes or (p.config.resources.nodes_max if members else p.config.resources.nodes_min)
    if members and (n % p.plan["member_nodes"] or n > members * p.plan["member_nodes"]):
        raise CLIError(f"--nodes {n}: a run of {members} members of {p.plan['member_nodes']} node(s) each starts "
                       f"a whole number of them; give a multiple of {p.plan['member_nodes']} up to "
                       f"{members * p.plan['member_nodes']}", 2)
    if str(n) not in p.plan["layouts"]:
        why = p.plan["infeasible"].get(str(n), f"outside [resources] nodes {p.config.resources.nodes_spec}")
        raise CLIError(f"--nodes {n}: {why}", 2)
    if members:   # the members this run starts stand for the array's throttle: its first epoch waits for them all
        p = p._replace(plan={**p.plan, "members_at_once": n // p.plan["member_nodes"]})
    target = sub.write_run_dir(p)
    rundir.register_job(f"local-{target.name}", target)  # so the history ingests local runs too
    click.echo(f"running locally: {p.layout_line(n)}")
    click.echo(f"run directory: {target}")
    plan_path = str(target / runfiles.PLAN)
    rc = run_members(p.plan, plan_path, n // p.plan["member_nodes"]) if members else run_local(p.plan, plan_path, n)
    _learn(target, db)
    s = rundir.summarize(target)
    if s["first_loss"] is not None:
        click.echo(f"loss {s['first_loss']:.4f} -> {s['last_loss']:.4f} after step {s['step']}")
    sys.exit(rc)


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
