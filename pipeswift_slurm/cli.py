"""`pswift`: a thin click CLI over the library. Library errors become one line and an exit code."""

from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__, rundir, slurm
from .config import TrainConfig, load_config
from .errors import PswiftError, RunDirError
from .plan import build_plan, write_plan
from .sbatch import options_for, render


class CLIError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map library exceptions to one-line click errors with the library's exit code."""
    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except PswiftError as e:
            raise CLIError(str(e), e.exit_code) from None
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pswift")
def cli() -> None:
    """pipeswift-slurm: DeepSpeed pipeline training on Slurm, planned for job completion time.

    Example:

        pswift sbatch examples/tiny-gpt/train.toml
    """


def _prepare(cfg: TrainConfig, run_dir: Path) -> tuple[dict[str, Any], str]:
    plan = build_plan(cfg, run_dir)
    script = render(options_for(cfg, str(run_dir), plan["signal_lead_s"]), str(run_dir), plan["python"])
    return plan, script


def _write_run_dir(cfg: TrainConfig, run_dir: Path, plan: dict[str, Any], script: str) -> Path:
    tmp = rundir.stage_run_dir(run_dir)
    try:
        shutil.copyfile(cfg.path, tmp / "train.toml")
        write_plan(plan, tmp / "plan.json")
        (tmp / "job.sbatch").write_text(script, encoding="utf-8")
    except OSError as e:
        rundir.discard(tmp)
        raise RunDirError(f"cannot write run directory {run_dir}: {e.strerror}") from None
    rundir.commit_run_dir(tmp, run_dir)
    return run_dir


def _layout_line(plan: dict[str, Any]) -> str:
    parts = []
    for n, lay in sorted(plan["layouts"].items(), key=lambda kv: int(kv[0])):
        b = lay["boundaries"] if lay["boundaries"] else f"by {lay['partition']} in the job"
        parts.append(f"{n} node(s): {lay['stages']} stage(s) x {lay['data_parallel']} dp, "
                     f"m={lay['micro_batches']}, boundaries {b}")
    return "; ".join(parts)


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("toml", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Run directory to create (default: ./pswift-runs/NAME-DATE-XXXX).")
@click.option("--dry-run", is_flag=True, help="Print the plan and the batch script; submit nothing.")
@click.option("--parsable", is_flag=True, help="Print only the job id.")
@click.option("--wait", is_flag=True, help="Wait for the job to end, then print its loss; exit 1 unless it completed.")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="Seconds to --wait at most.")
@_errors
def sbatch(toml: Path, sbatch_args: tuple[str, ...], run_dir: Path | None, dry_run: bool,
           parsable: bool, wait: bool, timeout: float) -> None:
    """Plan TOML and submit it with sbatch; prints the job id.

    Options after `--` go to sbatch unchanged. The run directory keeps a copy of the TOML,
    plan.json, the batch script, the job log and its events.

    Examples:

        pswift sbatch examples/tiny-gpt/train.toml

        pswift sbatch --dry-run examples/tiny-gpt/train.toml

        pswift sbatch train.toml -- --qos=high --mail-type=END
    """
    for a in sbatch_args:
        if not a.startswith("-"):
            raise CLIError(f"unexpected argument {a!r}: options for sbatch go after `--` "
                           f"(pswift sbatch train.toml -- --qos=high)", 2)
    cfg = load_config(toml)
    target = (run_dir or rundir.default_run_dir(cfg.job.name)).resolve()
    plan, script = _prepare(cfg, target)
    if dry_run:
        click.echo(f"# plan: {_layout_line(plan)}")
        for n, why in plan["infeasible"].items():
            click.echo(f"# {n} node(s) infeasible: {why}")
        if sbatch_args:
            click.echo(f"# sbatch arguments: {' '.join(sbatch_args)}")
        click.echo(script, nl=False)
        return
    _write_run_dir(cfg, target, plan, script)
    try:
        job_id = slurm.submit(str(target / "job.sbatch"), sbatch_args, cwd=str(target))
    except PswiftError:
        rundir.discard(target)  # nothing submitted: leave nothing behind
        raise
    (target / "JOB_ID").write_text(job_id + "\n")
    rundir.register_job(job_id, target)
    if parsable:
        click.echo(job_id)
    else:
        click.echo(f"Submitted pswift job {job_id} ({_layout_line(plan)})")
        click.echo(f"run directory: {target}")
    if wait:
        sys.exit(_wait(job_id, target, timeout, quiet=parsable))


def _wait(job_id: str, run: Path, timeout: float, quiet: bool = False) -> int:
    deadline = time.time() + timeout
    seen_state = None
    while True:
        info = slurm.job_info(job_id)
        state = info.state if info else "GONE"
        if state != seen_state and not quiet:
            click.echo(f"job {job_id}: {state}" + (f" ({info.reason})" if info and info.reason
                                                   not in ("", "None") else ""))
            seen_state = state
        if info is None or info.terminal:
            break
        if time.time() > deadline:
            raise CLIError(f"job {job_id} still {state} after {timeout:.0f} s; "
                           f"`pswift status {job_id}` shows it later")
        time.sleep(1.0)
    s = rundir.summarize(run)
    if not quiet:
        if s["first_loss"] is not None:
            click.echo(f"loss {s['first_loss']:.4f} -> {s['last_loss']:.4f} after step {s['step']}")
        click.echo(f"log: {run / f'slurm-{job_id}.out'}")
    return 0 if state == "COMPLETED" else 1


@cli.command("run")
@click.argument("toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Run directory to create (default: ./pswift-runs/NAME-DATE-XXXX).")
@click.option("--nodes", type=int, help="Node count to emulate (default: the TOML's minimum).")
@_errors
def run_cmd(toml: Path, run_dir: Path | None, nodes: int | None) -> None:
    """Run TOML's job here, one local process per slot, without Slurm.

    Same plan, launcher and events as `pswift sbatch`; TERM/INT/USR2 make every rank checkpoint
    and stop at the same step.

    Example:

        pswift run examples/tiny-gpt/train.toml --run-dir /tmp/tiny
    """
    from .local import run_local

    cfg = load_config(toml)
    target = (run_dir or rundir.default_run_dir(cfg.job.name)).resolve()
    plan, script = _prepare(cfg, target)
    n = nodes or cfg.resources.nodes_min
    if str(n) not in plan["layouts"]:
        why = plan["infeasible"].get(str(n), f"outside [resources] nodes {cfg.resources.nodes_spec}")
        raise CLIError(f"--nodes {n}: {why}", 2)
    _write_run_dir(cfg, target, plan, script)
    click.echo(f"running locally: {_layout_line({'layouts': {str(n): plan['layouts'][str(n)]}})}")
    click.echo(f"run directory: {target}")
    rc = run_local(plan, str(target / "plan.json"), n)
    s = rundir.summarize(target)
    if s["first_loss"] is not None:
        click.echo(f"loss {s['first_loss']:.4f} -> {s['last_loss']:.4f} after step {s['step']}")
    sys.exit(rc)


@cli.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def status(job: str, as_json: bool) -> None:
    """State, step reached, last loss, attempts and run directory of JOB (an id or a run dir).

    Examples:

        pswift status 42

        pswift status 42 --json
    """
    run: Path | None
    job_id: str | None
    if job.isdigit():
        job_id, run = job, rundir.lookup_job(job)
    else:
        run = Path(job)
        if not (run / "plan.json").is_file():
            raise CLIError(f"{job} is neither a job id nor a run directory (no plan.json there)", 2)
        f = run / "JOB_ID"
        job_id = f.read_text().strip() if f.is_file() else None
    info = slurm.job_info(job_id) if job_id else None
    if info is None and run is None:
        raise CLIError(f"job {job} is unknown to Slurm and to pswift's registry "
                       f"({rundir.state_dir() / 'jobs'}); pass its run directory instead", 1)
    summary = rundir.summarize(run) if run else {"run_dir": None, "step": None,
                                                 "last_loss": None, "attempts": []}
    out = {
        "job_id": job_id,
        "state": info.state if info else "UNKNOWN",
        "reason": info.reason if info else None,
        "restarts": info.restarts if info else None,
        "nodes": info.nodes if info else None,
        **summary,
    }
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"job {job_id}: {out['state']}" + (f" ({out['reason']})" if out["reason"] not in
                                                   (None, "", "None") else ""))
    click.echo(f"run directory: {out['run_dir']}")
    if out["step"] is not None:
        click.echo(f"step {out['step']}, last loss {out['last_loss']:.6f}")
    for a in out["attempts"]:
        click.echo(f"  attempt {a['attempt']}: {a['nodes']} node(s), {a['stages']} stage(s) "
                   f"{a['boundaries']}, steps {a['start_step']} -> {a['end_step']}, {a['ended']}"
                   + (f", resumed from {Path(a['resumed_from']).name}" if a["resumed_from"] else ""))


def main() -> None:
    cli(prog_name="pswift")


if __name__ == "__main__":
    main()
