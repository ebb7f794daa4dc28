"""Admin commands: `pswift history ...` (ingest, jobs, show, report, export) and `pswift doctor`."""

from __future__ import annotations

# Imports inside functions: each command imports the library it runs when it runs, so `pswift
# --help` and `pswift sbatch` load none of the others

import json
from pathlib import Path
from typing import Any, Callable

import click

from pipeswift_slurm.cli.common import (CLIError, _clusters_option, _db_option, _errors, _nothing_selected, _open, _output, _print,
                         _quiet_on_closed_pipe, _renderer, _select, _warn, history)


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
@click.option("--follow", is_flag=True,
              help="Keep merging --spool and --sacct every --interval seconds until stopped (a service: "
                   "fills the history from sacct where the jobcomp plugin is not installed).")
@click.option("--interval", type=click.FloatRange(min=1.0), default=60.0, show_default=True,
              help="Seconds between two merges with --follow.")
@click.option("-M", "--clusters", help="With --sacct: these clusters' accounting (comma list; one slurmdbd "
                                        "may serve several), each from its own read mark; default: this one.")
@_db_option
@_errors
def history_ingest(run_dirs: tuple[Path, ...], spool: Path | None, jobcomp_file: Path | None,
                   use_sacct: bool, no_registered: bool, follow: bool, interval: float, clusters: str | None,
                   db: Path | None) -> None:
    """Merge run directories, plugin records and Slurm accounting into the history.

    Without RUN_DIRS: every job pswift submitted. Idempotent: one row per attempt, replaced,
    never duplicated; a run directory is skipped while unchanged. With --follow, the spool and
    sacct are merged again every --interval seconds (sacct from where it stopped) until TERM or
    Ctrl-C.

    Examples:

        pswift history ingest

        pswift history ingest --spool /var/spool/pswift --jobcomp-file /var/log/slurm/jobcomp.txt

        pswift history ingest --sacct --follow --interval 300 --db /var/lib/pswift/history.db
    """
    from pipeswift_slurm.progress import progress
    from pipeswift_slurm.history import ingest as ingesting
    from pipeswift_slurm.history.selection import comma_list
    from pipeswift_slurm.history.store import History
    named = comma_list(clusters)
    if named and not use_sacct:
        raise CLIError("-M/--clusters names whose accounting --sacct reads: add --sacct", 2)

    if follow:
        if run_dirs or jobcomp_file is not None or not (spool or use_sacct):
            raise CLIError("--follow merges --spool and --sacct again and again: name one of them, and no "
                           "run directory or --jobcomp-file", 2)
        ingesting.follow(lambda: History(db), interval, lambda line: click.echo(line, err=line.startswith("warning")),
                         spool, use_sacct, clusters=named)
        return
    h = History(db)
    try:
        got = ingesting.ingest(h, run_dirs, spool, jobcomp_file, use_sacct, not no_registered, progress, named)
    finally:
        h.close()
    for w in got.warnings:
        _warn(w)
    click.echo(got.summary(h.path))


@history.command("jobs")
@_select
@_output
@click.option("--limit", type=click.IntRange(min=1), help="Stop after N jobs (the first N in job-id order).")
@_errors
def history_jobs(db: Path | None, sel: Any, out: Any, limit: int | None) -> None:
    """Jobs, one line each, in job-id order: account, QOS, state, exit code, TRES, efficiency,
    and the JCT breakdown (queue, setup, training, checkpoint/cleanup). Streams any number.

    A terminal gets fixed-width columns; a pipe the same cells tab-separated, as sacct
    (--json and --csv: raw seconds, hours, ratios); -o picks columns (-o help lists them).

    Examples:

        pswift history jobs -r low -S now-7days -s CD,F

        pswift history jobs -u alice -o job_id,state,elapsed_s,cpu_eff,mem_eff -P
    """
    from pipeswift_slurm.reports.jct import LISTING, LISTING_DEFAULT, write_listing
    r = _renderer(LISTING, out, LISTING_DEFAULT)
    if r is None:
        return
    h = _open(db)
    try:
        with _quiet_on_closed_pipe():
            write_listing(h, sel, r, limit)
    finally:
        h.close()


@history.command("show")
@click.argument("job_id")
@_db_option
@_clusters_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def history_show(job_id: str, db: Path | None, as_json: bool, clusters: str | None) -> None:
    """One job: its JCT breakdown, accounting (account, QOS, TRES, efficiency, exit codes) and
    every attempt (layout, steps, how it ended); for a job array (a pswift run of members, its
    id), each task's Slurm job. Where several clusters share the history and each has a job
    JOB_ID, say which with -M.

    Example:

        pswift history show 42 -M c2
    """
    from pipeswift_slurm.reports.jct import LISTING, job_reports, job_rows
    from pipeswift_slurm.history.selection import Selection, comma_list
    sel = Selection(job_ids=(job_id,), clusters=comma_list(clusters))
    h = _open(db)
    try:
        found = h.clusters_of(job_id, sel.clusters)
        if len(found) > 1:
            raise CLIError(f"job {job_id} is in the history of {len(found)} clusters ({', '.join(found)}): "
                           f"say which with -M CLUSTER", 2)
        sel = sel._replace(clusters=tuple(found) or sel.clusters)
        reps = job_reports(h, sel)
        values = next(job_rows(h, sel), None)
        members = h.array_members(sel.clusters[0] if sel.clusters else "", job_id)
    finally:
        h.close()
    if not reps or values is None:
        raise CLIError(f"job {job_id} is not in the history" + (f" of cluster {clusters}" if clusters else "")
                       + "; run `pswift history ingest` first", 1)
    row = dict(zip((c.key for c in LISTING), values))
    row["pswift"] = bool(row["pswift"])
    r = reps[-1]
    if as_json:
        click.echo(json.dumps(_iso_times(row, r.attempt_rows, {c.key for c in LISTING if c.kind == "time"}, members),
                              indent=2))
        return
    _show_text(r, row, members)


def _iso_times(row: dict[str, Any], attempts: list[dict[str, Any]], time_keys: set[str],
               members: list[dict[str, Any]]) -> dict[str, Any]:
    """`history show --json`: the job's row, its attempts and its array's member jobs, every
    time as sacct prints one."""
    return {**_iso(row, time_keys.__contains__),
            "attempt_rows": [_iso(a, lambda k: k.endswith("_time")) for a in attempts],
            "members": [_iso(m, {"submit", "last_end"}.__contains__) for m in members]}


def _iso(d: dict[str, Any], is_time: Callable[[str], bool]) -> dict[str, Any]:
    from pipeswift_slurm.reports.tabular import iso_time
    return {k: iso_time(v) if is_time(k) and isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for k, v in d.items()}


def _show_text(r: Any, row: dict[str, Any], members: list[dict[str, Any]]) -> None:
    from pipeswift_slurm.terminal import inert

    def pct(v: float | None) -> str:
        return "unknown" if v is None else f"{100 * v:.1f}%"
    click.echo(inert(f"job {r.job_id} {r.name!r} ({'pswift' if r.pswift else 'plain'}), user {r.user}, "
                     f"account {row['account'] or '-'}, partition {r.partition}, QOS {row['qos'] or '-'}: "
                     f"{r.state}, exit code {row['exit_code'] or '-'} (derived {row['derived_exit_code'] or '-'})"))
    click.echo(f"JCT {_dur(r.jct_s)} = queue {_dur(r.queue_s)} + setup {_dur(r.setup_s)} + "
               f"training {_dur(r.training_s)} + checkpoint/cleanup {_dur(r.checkpoint_s)}")
    click.echo(f"allocated {row['nodes'] or '-'} node(s), {row['cpus'] or '-'} CPU(s), {row['gpus'] or 0} GPU(s); "
               f"elapsed {_dur(row['elapsed_s'] or 0)} of limit "
               f"{_dur(row['limit_s']) if row['limit_s'] else 'unknown'} (time efficiency {pct(row['time_eff'])}); "
               f"CPU efficiency {pct(row['cpu_eff'])}; memory efficiency {pct(row['mem_eff'])}"
               + (f" (MaxRSS {row['max_rss_mb']:.0f} MB)" if row["max_rss_mb"] is not None else ""))
    if r.predicted_jct_s:
        click.echo(f"predicted JCT {_dur(r.predicted_jct_s)}")
    wasted = "unknown" if r.cpu_hours_wasted is None else f"{r.cpu_hours_wasted:.3g}"
    lost = f"{r.steps_lost} step(s) lost" if r.pswift else "no checkpoints: whole attempts lost"
    click.echo(f"{r.attempts} attempt(s), {r.preemptions} preemption(s), {lost}, {wasted} CPU-hours wasted")
    for a in r.attempt_rows:
        click.echo(f"  attempt {a['attempt']}: {a['nodes']} node(s), {a['stages']} stage(s) x "
                   f"{a['data_parallel']} dp, steps {a['start_step']} -> {a['end_step']}, {a['ended']}, "
                   f"setup {_dur(a['setup_s'])}, step p50 {_step(a['step_p50'])}")
    if members:   # a job array's tasks (a pswift run of members), each the Slurm job Slurm made of it
        click.echo(f"{len(members)} member job(s) of array {r.job_id}:")
    for m in members:
        click.echo(inert(f"  task {m['task']}: job {m['job_id']}, {m['attempts']} attempt(s), "
                         f"{m['requeued']} requeued, {m['state']}, {m['node_s'] / 3600:.3g} node-hours, "
                         f"last on {m['nodes'] or '-'}"))


def _dur(s: float | None) -> str:
    """A job's phase as sacct shows an elapsed time, as every duration in `history show`."""
    from pipeswift_slurm.durations import hms
    return "-" if s is None else hms(s)


def _step(s: float | None) -> str:
    """A step time: seconds (``[D-]HH:MM:SS`` would show a 0.35 s step as 00:00:00)."""
    return "-" if s is None else f"{s:.3g} s"


#: `history report`'s columns
_REPORT_COLS = [("jobs", "Jobs", "int", 6), ("attempts", "Attempts", "int", 8), ("wait_p50_s", "WaitP50", "s", 10),
                ("wait_p95_s", "WaitP95", "s", 10), ("jct_p50_s", "JCTP50", "s", 10), ("jct_p95_s", "JCTP95", "s", 10),
                ("preemption_rate", "PreemptRate", "ratio", 11), ("steps_lost", "StepsLost", "int", 9),
                ("wasted_hours", "Wasted", "h", 8), ("step_time_var", "StepVar", "float", 8),
                ("queue_s", "Queue", "s", 13), ("setup_s", "Setup", "s", 13), ("training_s", "Training", "s", 13),
                ("checkpoint_s", "Ckpt/cleanup", "s", 13), ("predicted_vs_actual_jct", "PredVsActual", "float", 12)]


@history.command("report")
@_select
@click.option("--by", type=click.Choice(["partition", "user", "account", "qos", "config", "nodes"]),
              default="partition", show_default=True, help="Group jobs by.")
@_output
@click.option("--plot", type=click.Path(path_type=Path),
              help="Write a PNG: stacked JCT breakdown per group and the wait-time CDF.")
@_errors
def history_report(db: Path | None, sel: Any, by: str, out: Any, plot: Path | None) -> None:
    """JCT per group: p50/p95 wait and JCT, preemption rate and waste, the JCT phases
    (queue, setup, training, checkpoint/cleanup), step-time variance, predicted vs actual.

    Examples:

        pswift history report --by partition -S now-30days

        pswift history report --by user --plot jct.png
    """
    from pipeswift_slurm.reports.jct import aggregate, aggregate_sql, job_reports, wait_quantiles
    from pipeswift_slurm.reports.jct import plot as draw
    from pipeswift_slurm.reports.tabular import Col

    h = _open(db)
    try:
        if by == "config" or sel.pswift_only:  # pswift jobs: the (small) pswift tables
            reps = [r for r in job_reports(h, sel) if r.pswift]
            groups = aggregate(reps, by)
            waits = [r.queue_s for r in reps]
        else:  # any number of Slurm jobs: aggregated inside SQLite
            groups = aggregate_sql(h, by, sel)
            waits = wait_quantiles(h, sel) if plot is not None else []
    finally:
        h.close()
    _nothing_selected(groups)
    _print(groups, [Col(by, by.capitalize(), "text", 10)] + [Col(*c) for c in _REPORT_COLS], out)
    if plot is not None:
        draw([], groups, by, plot, waits, sel.describe())
        _warn(f"plot written to {plot}")


_EXPORT_FORMS = ("csv", "json", "tsv")


@history.command("migrate")
@_db_option
@_errors
def history_migrate(db: Path | None) -> None:
    """Upgrade the history database to this pswift's schema, in place, keeping a backup beside
    it first (NAME.schemaN-DATE). Read commands never change the file: on an older schema they
    read a migrated copy and say so; ingest (a writer) migrates as it opens.

    Example:

        pswift history migrate --db /var/lib/pswift/history.db
    """
    from pipeswift_slurm.history.store import History
    h = History(db, create=False, read_only=True)
    try:
        backup = h.migrate_in_place()
    finally:
        h.close()
    click.echo(f"{h.path}: already at this pswift's schema" if backup is None
               else f"{h.path}: migrated; the file before is kept as {backup}")


@history.command("export")
@_select
@click.option("-o", "--format", "fields", help="Columns, as in `history jobs -o` (default: every column; "
                                               "--format=help lists every spelling).")
@click.option("--json", "as_json", is_flag=True, help="A JSON list.")
@click.option("--tsv", "as_tsv", is_flag=True, help="Tab-separated with a header.")
@_errors
def history_export(db: Path | None, sel: Any, fields: str | None, as_json: bool, as_tsv: bool) -> None:
    """Every selected job with every column (or -o's), streamed as CSV (default), JSON or TSV
    (for spreadsheets, pandas, Datasette).

    Example:

        pswift history export -S now-30days --json > jobs.json
    """
    from pipeswift_slurm.progress import interactive, progress
    from pipeswift_slurm.reports.jct import LISTING, write_listing
    from pipeswift_slurm.reports.tabular import Output
    if fields in _EXPORT_FORMS:     # the old spelling: --format named the output form
        _warn(f"pswift: --format {fields} is now --{fields} (--format names the columns, as in `history "
              f"jobs`); the old spelling goes in the next release")
        as_json, as_tsv, fields = fields == "json" or as_json, fields == "tsv" or as_tsv, None
    if as_json and as_tsv:
        raise CLIError("choose one of --json, --tsv (the default is CSV)", 2)
    render = _renderer(LISTING, Output("json" if as_json else "tsv" if as_tsv else "csv", True, fields))
    if render is None:     # -o help
        return
    h = _open(db)
    try:
        with _quiet_on_closed_pipe(), progress("jobs exported") as advance:
            write_listing(h, sel, render, tick=advance if interactive() else None)
    finally:
        h.close()


@click.command()
@click.argument("job_id", required=False)
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def doctor(job_id: str | None, db: Path | None, as_json: bool) -> None:
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
        _environment_checkup(db, as_json)
        return
    from pipeswift_slurm.terminal import inert
    from pipeswift_slurm.reports.doctor import doctor as diagnosis_of

    found = diagnosis_of(job_id, db, lambda msg: click.echo(inert(msg), err=True))
    if as_json:
        click.echo(json.dumps(found.to_dict(), indent=2))
        return
    click.echo(inert(f"job {job_id} ({found.name}): {found.state}, {found.attempts} attempt(s)"))
    for finding in found.findings:
        click.echo(inert(f"- {finding}"))


def _environment_checkup(db: Path | None, as_json: bool = False) -> None:
    from pipeswift_slurm.reports.checkup import environment

    findings = environment(db)
    if as_json:
        from dataclasses import asdict
        click.echo(json.dumps([asdict(f) for f in findings], indent=2))
    for f in ([] if as_json else findings):
        click.echo(f"{'ok ' if f.ok else 'BAD'} {f.what}: {f.value}" + ("" if f.ok else f"\n    fix: {f.fix}"))
    bad = [f for f in findings if not f.ok]
    if bad:
        raise CLIError(f"{len(bad)} problem(s): {'; '.join(f'{f.what}: {f.fix}' for f in bad)}", 1)


@click.group()
def admin() -> None:
    """Cluster set-up for admins: the Slurm-side plugins.

    Example:

        pswift admin install-plugins
    """


@admin.command("install-plugins")
@click.option("--prefix", type=click.Path(file_okay=False, path_type=Path),
              help="The folder of slurm.conf (default: $SLURM_CONF's folder, else /etc/slurm).")
@click.option("--spool", type=click.Path(file_okay=False, path_type=Path), default=Path("/var/spool/pswift"),
              show_default=True, help="Where the jobcomp plugin spools each record first (created 0750).")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=Path("/var/lib/pswift/history.db"),
              show_default=True, help="The site's history database the plugin merges into.")
@click.option("--force", is_flag=True, help="Replace files there that differ (each kept as NAME.pswift-backup-TIME).")
@_errors
def admin_install_plugins(prefix: Path | None, spool: Path, db: Path, force: bool) -> None:
    """Install pswift's submit rules (pswift_job_submit.lua, and job_submit.lua calling them) and
    the jobcomp plugin's wrapper from this installation into PREFIX, create the spool folder, and
    print the slurm.conf lines to add (slurm.conf itself is not edited).

    A file there that differs (a site's own job_submit.lua) stops the install unless --force; a
    site with its own job_submit.lua calls pswift's rules from it instead (docs/admin.md). The
    wrapper runs this Python on the plugin shipped in the package, as root: both must be root's
    and writable by no one else. Files are written whole and renamed into place.

    Example:

        pswift admin install-plugins --prefix /etc/slurm
    """
    from pipeswift_slurm.slurm.plugins_install import default_prefix, install
    done = install(prefix or default_prefix(), spool, db, force=force)
    for b in done.backups:
        click.echo(f"kept the old one as {b}")
    for f in done.files:
        click.echo(f"installed {f}")
    click.echo("add to slurm.conf, then `scontrol reconfigure`:")
    for line in done.conf_lines:
        click.echo(f"  {line}")


from pipeswift_slurm.cli import reports as cli_reports  # noqa: E402,F401  (registers the sreport-like commands on `history`)
