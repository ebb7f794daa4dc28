"""Admin commands: `pswift history ...` (ingest, jobs, show, report, export) and `pswift doctor`."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import click

from . import rundir, slurm
from .cli_common import CLIError, _errors, _warn
from .errors import PswiftError
from .fmt import duration


@click.group()
def history() -> None:
    """The job history database (SQLite): ingest run directories, query jobs.

    Example:

        pswift history ingest
    """


_db_option = click.option("--db", type=click.Path(dir_okay=False, path_type=Path), envvar="PSWIFT_DB",
                          help="History database (default $PSWIFT_HOME/history.db).")


@history.command("ingest")
@click.argument("run_dirs", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@click.option("--spool", type=click.Path(file_okay=False, path_type=Path), envvar="PSWIFT_SPOOL",
              help="The jobcomp plugin's spool folder to merge.")
@click.option("--jobcomp-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A jobcomp/filetxt file (what `sacct -c` reads) to merge.")
@click.option("--sacct", "use_sacct", is_flag=True,
              help="Also merge slurmdbd's accounting (`sacct --json`), from where the last "
                   "`--sacct` ingest of this cluster stopped.")
@click.option("--no-registered", is_flag=True,
              help="Without RUN_DIRS, skip the jobs pswift submitted (merge only the sources named).")
@_db_option
@_errors
def history_ingest(run_dirs: tuple[Path, ...], spool: Path | None, jobcomp_file: Path | None,
                   use_sacct: bool, no_registered: bool, db: Path | None) -> None:
    """Merge run directories, plugin records and Slurm accounting into the history.

    Without RUN_DIRS: every job pswift submitted. Idempotent: one row per attempt, replaced,
    never duplicated; a run directory is skipped while unchanged.

    Examples:

        pswift history ingest

        pswift history ingest --spool /var/spool/pswift --jobcomp-file /var/log/slurm/jobcomp.txt
    """
    from .history import History, IngestRefused, parse_jobcomp_filetxt

    h = History(db)
    try:
        if run_dirs:
            for d in run_dirs:
                if not (d / "plan.json").is_file():
                    raise CLIError(f"{d} is not a run directory (no plan.json)", 2)
            n = 0
            for d in run_dirs:
                try:
                    n += h.ingest_run_dir(d)
                except IngestRefused as e:
                    _warn(f"warning: {d}: {e}")
        else:
            n = 0 if no_registered else h.ingest_registered()
        msgs = [f"{n} changed run director{'y' if n == 1 else 'ies'}"]
        if h.skipped_events:
            msgs[0] += f" ({h.skipped_events} bad event line(s) skipped)"
        if spool is not None:
            merged, problems = h.ingest_spool(spool)
            msgs.append(f"{merged} spooled record(s)")
            for p in problems:
                _warn(f"warning: spool file {p}")
        if jobcomp_file is not None:
            if not jobcomp_file.is_file():
                raise CLIError(f"{jobcomp_file}: no such file", 2)
            recs = parse_jobcomp_filetxt(jobcomp_file.read_text(encoding="utf-8", errors="replace"))
            msgs.append(f"{len(recs)} jobcomp line(s) ({h.add_slurm_records(recs, 'filetxt')} new)")
        if use_sacct:
            cluster = slurm.cluster_name()
            recs = slurm.sacct_jobs(since=h.sacct_since(cluster))
            if recs is None:
                _warn("warning: `sacct --json` gave nothing (no slurmdbd here?); use --jobcomp-file")
            else:
                new = h.add_sacct(cluster, recs)
                msgs.append(f"{len(recs)} sacct record(s) of cluster {cluster} ({new} new)")
        total = h.db["slurm_jobs"].count, h.db["jobs"].count
    finally:
        h.close()
    click.echo(f"ingested {', '.join(msgs)}; {total[0]} Slurm attempt(s), {total[1]} pswift job(s) "
               f"in {h.path}")


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    t = text.strip()
    units = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
    if t[:-1].isdigit() and t[-1:] in units:
        return time.time() - int(t[:-1]) * units[t[-1]]
    try:
        import datetime as _dt
        return _dt.datetime.fromisoformat(t).timestamp()
    except ValueError:
        raise CLIError(f"time {text!r}: use an ISO date (2026-11-01) or an age like 7d, 12h", 2) from None


def _filters(f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed([
        click.option("--user", help="Only this user's jobs."),
        click.option("--partition", help="Only this partition."),
        click.option("--since", help="Submitted at or after: ISO date or age (7d, 12h)."),
        click.option("--until", help="Submitted before: ISO date or age."),
        click.option("--state", help="Only jobs whose final state is this (COMPLETED, completed...)."),
        click.option("--pswift-only", is_flag=True, help="Only pswift jobs."),
        _db_option,
    ]):
        f = opt(f)
    return f


def _reports(db: Path | None, user: str | None, partition: str | None, since: str | None,
             until: str | None, state: str | None, pswift_only: bool, job_id: str | None = None) -> list:
    from .history import History
    from .report import job_reports

    h = History(db, create=False)
    try:
        return job_reports(h, user, partition, _since(since), _since(until), state, pswift_only, job_id)
    finally:
        h.close()


def _dur(s: float | None) -> str:
    return duration(s, compact=True)


def _emit(rows: list[dict[str, Any]], fmt: str, columns: list[tuple[str, str]]) -> None:
    from .report import to_csv, to_json
    if fmt == "csv":
        click.echo(to_csv(rows), nl=False)
        return
    if fmt == "json":
        click.echo(to_json(rows))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
    table = Table(*[c[1] for c in columns])
    for r in rows:   # Text: a job named "[/oops]" is shown as it is, never read as markup
        table.add_row(*[Text(_dur(r[k]) if k.endswith("_s") else
                             (f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k] if r[k] is not None else "-")))
                        for k, _ in columns])
    Console(highlight=False, markup=False, width=max(150, shutil.get_terminal_size().columns)).print(table)


_format_option = click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]),
                              default="table", show_default=True)


@history.command("jobs")
@_filters
@_format_option
@_errors
def history_jobs(db: Path | None, user: str | None, partition: str | None, since: str | None,
                 until: str | None, state: str | None, pswift_only: bool, fmt: str) -> None:
    """Jobs with their JCT breakdown: queue, setup, training, checkpoint/cleanup, attempts.

    Examples:

        pswift history jobs --partition low --since 7d

        pswift history jobs --pswift-only --format csv
    """
    from .report import rows_for_output
    rows = rows_for_output(_reports(db, user, partition, since, until, state, pswift_only))
    _emit(rows, fmt, [("job_id", "job"), ("name", "name"), ("user", "user"), ("partition", "partition"),
                      ("state", "state"), ("attempts", "attempts"), ("queue_s", "queue"),
                      ("setup_s", "setup"), ("training_s", "training"), ("checkpoint_s", "ckpt/cleanup"),
                      ("jct_s", "JCT"), ("steps_lost", "steps lost"),
                      ("device_hours_wasted", "device-h wasted")])


@history.command("show")
@click.argument("job_id")
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def history_show(job_id: str, db: Path | None, as_json: bool) -> None:
    """One job: its JCT breakdown and every attempt (layout, steps, how it ended).

    Example:

        pswift history show 42
    """
    from dataclasses import asdict
    reps = _reports(db, None, None, None, None, None, False, job_id)
    if not reps:
        raise CLIError(f"job {job_id} is not in the history; run `pswift history ingest` first", 1)
    r = reps[-1]
    if as_json:
        click.echo(json.dumps(asdict(r), indent=2))
        return
    click.echo(f"job {r.job_id} {r.name!r} ({'pswift' if r.pswift else 'plain'}), user {r.user}, "
               f"partition {r.partition}: {r.state}")
    click.echo(f"JCT {_dur(r.jct_s)} = queue {_dur(r.queue_s)} + setup {_dur(r.setup_s)} + "
               f"training {_dur(r.training_s)} + checkpoint/cleanup {_dur(r.checkpoint_s)}")
    if r.predicted_jct_s:
        click.echo(f"predicted JCT {_dur(r.predicted_jct_s)}")
    wasted = "unknown" if r.device_hours_wasted is None else f"{r.device_hours_wasted:.3g}"
    lost = f"{r.steps_lost} step(s) lost" if r.pswift else "no checkpoints: whole attempts lost"
    click.echo(f"{r.attempts} attempt(s), {r.preemptions} preemption(s), {lost}, {wasted} device-hours wasted")
    for a in r.attempt_rows:
        click.echo(f"  attempt {a['attempt']}: {a['nodes']} node(s), {a['stages']} stage(s) x "
                   f"{a['data_parallel']} dp, steps {a['start_step']} -> {a['end_step']}, {a['ended']}, "
                   f"setup {_dur(a['setup_s'])}, step p50 {_dur(a['step_p50'])}")


@history.command("report")
@_filters
@click.option("--by", type=click.Choice(["partition", "user", "config", "nodes"]), default="partition",
              show_default=True, help="Group jobs by.")
@_format_option
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG: stacked JCT breakdown per group and the wait-time CDF.")
@_errors
def history_report(db: Path | None, user: str | None, partition: str | None, since: str | None,
                   until: str | None, state: str | None, pswift_only: bool, by: str, fmt: str,
                   plot: Path | None) -> None:
    """Aggregates per group: p50/p95 wait and JCT, preemption rate, waste, step-time variance.

    Examples:

        pswift history report --by partition --since 30d

        pswift history report --by user --plot jct.png
    """
    from .history import History
    from .report import aggregate, aggregate_sql, job_reports, wait_quantiles
    from .report import plot as draw

    h = History(db, create=False)
    try:
        if by == "config":  # pswift configs: the (small) pswift tables
            reps = job_reports(h, user, partition, _since(since), _since(until), state, True)
            groups = aggregate(reps, by)
            waits = [r.queue_s for r in reps]
        else:  # any number of Slurm jobs: aggregated inside SQLite
            groups = aggregate_sql(h, by, user, partition, _since(since), _since(until), state, pswift_only)
            waits = wait_quantiles(h) if plot is not None else []
    finally:
        h.close()
    _emit(groups, fmt, [(by, by), ("jobs", "jobs"), ("attempts", "attempts"), ("wait_p50_s", "wait p50"),
                        ("wait_p95_s", "wait p95"), ("jct_p50_s", "JCT p50"), ("jct_p95_s", "JCT p95"),
                        ("preemption_rate", "preempt rate"), ("steps_lost", "steps lost"),
                        ("device_hours_wasted", "device-h wasted"), ("step_time_var", "step var"),
                        ("predicted_vs_actual_jct", "pred/actual JCT")])
    if plot is not None:
        draw([], groups, by, plot, waits)
        _warn(f"plot written to {plot}")


@history.command("export")
@_filters
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@_errors
def history_export(db: Path | None, user: str | None, partition: str | None, since: str | None,
                   until: str | None, state: str | None, pswift_only: bool, fmt: str) -> None:
    """Every job row with its breakdown, as CSV or JSON (for spreadsheets, pandas, Datasette).

    Example:

        pswift history export --since 30d --format json > jobs.json
    """
    from .report import rows_for_output
    _emit(rows_for_output(_reports(db, user, partition, since, until, state, pswift_only)), fmt, [])


@click.command()
@click.argument("job_id", required=False)
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), envvar="PSWIFT_DB",
              help="History database (default $PSWIFT_HOME/history.db).")
@_errors
def doctor(job_id: str | None, db: Path | None) -> None:
    """Explain where JOB_ID's completion time went and what to try, citing the numbers.

    Applies the symptom table: queue or preemption dominating JCT, slow steps despite a small
    bubble, a large bubble, step-time variance, slow restores, a job that could not continue on
    fewer nodes, out-of-memory. Without JOB_ID: check this machine's set-up (SLURM_CONF, Slurm
    version, query backend, accounting, history DB), each problem with its fix; exit 1 if any.

    Examples:

        pswift doctor

        pswift doctor 42
    """
    if job_id is None:
        _environment_checkup(db)
        return
    from .history import History
    from .report import diagnose, job_reports

    h = History(db)
    try:
        h.ingest_registered()
        reps = job_reports(h, job_id=job_id)
        relayouts = h.job_relayouts(reps[-1].run_dir) if reps and reps[-1].run_dir else []
    finally:
        h.close()
    if not reps:
        raise CLIError(f"job {job_id} is not in the history; run `pswift history ingest` first", 1)
    rep = reps[-1]
    run = Path(rep.run_dir) if rep.run_dir else rundir.lookup_job(job_id)
    plan = log = None
    if run is not None and (run / "plan.json").is_file():
        from .plan import read_plan
        try:
            plan = read_plan(run / "plan.json")
        except PswiftError:
            plan = None   # another version's or a damaged plan: the findings that need it are skipped
        log = "".join(p.read_text(errors="replace") for p in run.glob("slurm-*.out"))
    click.echo(f"job {job_id} ({rep.name}): {rep.state}, {rep.attempts} attempt(s)")
    for finding in diagnose(rep, plan, log or ""):
        click.echo(f"- {finding}")
    from .fmt import growth_line, relayout_line
    for r in relayouts:
        click.echo(f"- {growth_line(r)}" if r["kind"] == "grow" else f"- attempt {r['attempt']} {relayout_line(r)}")


def _environment_checkup(db: Path | None) -> None:
    from .checkup import environment

    findings = environment(db)
    for f in findings:
        click.echo(f"{'ok ' if f.ok else 'BAD'} {f.what}: {f.value}" + ("" if f.ok else f"\n    fix: {f.fix}"))
    bad = [f for f in findings if not f.ok]
    if bad:
        raise CLIError(f"{len(bad)} problem(s): {'; '.join(f'{f.what}: {f.fix}' for f in bad)}", 1)
