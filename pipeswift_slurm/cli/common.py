"""What the CLI modules share: one-line errors with the library's exit codes, warnings, the
`history` group, and the admin commands' options (--db, sacct's selection and output forms) and
printing. Commands are a few lines over library calls; this module holds no command."""

from __future__ import annotations

# Imports inside functions: each command imports the library it runs when it runs, so `pswift
# --help` and `pswift sbatch` load none of the others (the history store, selections and tables
# load with the command that reads them)

import contextlib
import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from pipeswift_slurm.errors import PswiftError


class CLIError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares a class default only


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map library exceptions to one-line click errors with the library's exit code."""
    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except PswiftError as e:
            raise CLIError(str(e), e.exit_code) from None
        except Exception as e:  # a query outside History's guarded methods (reports)
            if type(e).__module__ != "sqlite3":
                raise
            raise CLIError(f"history database: {e}; if it is corrupt, move it aside and run "
                           f"`pswift history ingest` to rebuild it", 1) from None
    return wrapper


def _warn(msg: str) -> None:
    click.echo(msg, err=True)


@click.group()
def history() -> None:
    """The job history database (SQLite): ingest run directories, query jobs.

    Example:

        pswift history ingest
    """


_db_option = click.option("--db", type=click.Path(dir_okay=False, path_type=Path), envvar="PSWIFT_DB",
                          help="History database (default $PSWIFT_HOME/history.db).")


#: sacct's -M: one history may hold several clusters' jobs (one slurmdbd serves several)
_clusters_option = click.option("-M", "--clusters", help="Only these clusters' jobs (comma list; sacct's -M).")


def _select(f: Callable[..., Any]) -> Callable[..., Any]:
    """sacct's selection options (comma lists everywhere), and --db; the command gets ``sel``."""
    opts = [
        click.option("-u", "--user", help="Only these users' jobs (comma list)."),
        click.option("-A", "--account", help="Only these accounts (comma list)."),
        click.option("-r", "--partition", help="Only these partitions (comma list)."),
        click.option("-q", "--qos", help="Only these QOS (comma list)."),
        click.option("-s", "--state", help="Only jobs with an attempt in one of these states (as sacct "
                                           "--duplicates shows attempts: -s PR finds a job preempted once, "
                                           "then completed): full names or sacct's codes (CD,F,PR,TO,CA,OOM,...)."),
        click.option("-S", "--starttime", "--since", "start",
                     help="Submitted at or after: sacct's forms (2026-11-01, 2026-11-01T08:00, 11/01, "
                          "today, now-7days) or an age (7d, 12h)."),
        click.option("-E", "--endtime", "--until", "end", help="Submitted before (forms as -S)."),
        click.option("-j", "--jobs", help="Only these job ids (comma list)."),
        _clusters_option,
        click.option("--pswift-only", is_flag=True, help="Only jobs pswift submitted."),
        _db_option,
    ]

    @functools.wraps(f)
    def wrapper(user: str | None, account: str | None, partition: str | None, qos: str | None,
                state: str | None, start: str | None, end: str | None, jobs: str | None,
                clusters: str | None, pswift_only: bool, **kw: Any) -> Any:
        from pipeswift_slurm.history.selection import SelectionError, build
        try:
            sel = build(user, account, partition, qos, state, jobs, start, end, pswift_only, clusters)
        except SelectionError as e:
            raise CLIError(str(e), e.exit_code) from None
        return f(sel=sel, **kw)
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


def _output(f: Callable[..., Any]) -> Callable[..., Any]:
    """sacct's output options; the command gets ``out`` (a :class:`tabular.Output`)."""
    opts = [
        click.option("--json", "as_json", is_flag=True, help="A JSON list (raw numbers, null for unknown)."),
        click.option("--csv", "as_csv", is_flag=True, help="CSV with a header (raw numbers)."),
        click.option("-P", "--parsable", is_flag=True, help="'|'-separated, each cell as on a terminal "
                                                            "(piped output is tab-separated without it)."),
        click.option("-n", "--noheader", is_flag=True, help="No header line."),
        click.option("-o", "--format", "fields", help="Columns to print, by header, key or sacct's field "
                                                      "name (JobID, State, Elapsed, NNodes, ...), comma-"
                                                      "separated (--format=help lists every spelling)."),
    ]

    @functools.wraps(f)
    def wrapper(as_json: bool, as_csv: bool, parsable: bool, noheader: bool, fields: str | None,
                **kw: Any) -> Any:
        from pipeswift_slurm.reports.tabular import Output
        if sum((as_json, as_csv, parsable)) > 1:
            raise CLIError("choose one of --json, --csv, -P/--parsable", 2)
        form = "json" if as_json else "csv" if as_csv else "parsable" if parsable else "auto"
        return f(out=Output(form, not noheader, fields), **kw)
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


def _renderer(columns: list[Any], out: Any, default_fields: str | None = None) -> Any:
    """A Renderer for ``out`` (without -o, the text forms get ``default_fields`` on a terminal
    and in a pipe alike, as sacct; --json and --csv every column), or None after printing the
    column spellings for ``-o help``."""
    from pipeswift_slurm.reports.tabular import Renderer, field_help
    if out.fields and out.fields.strip().lower() == "help":
        click.echo(field_help(columns))
        return None
    if out.fields is None and default_fields and out.resolved(sys.stdout) in ("table", "tsv", "parsable"):
        out = out._replace(fields=default_fields)
    return Renderer(columns, out)


def _print(rows: Any, columns: list[Any], out: Any, default_fields: str | None = None) -> None:
    """Print Python rows (tuples, or dicts by column key) as ``out`` says."""
    from pipeswift_slurm.reports.tabular import from_dicts
    if rows and isinstance(rows, list) and isinstance(rows[0], dict):
        rows = from_dicts(rows, columns)
    r = _renderer(columns, out, default_fields)
    if r is not None:
        with _quiet_on_closed_pipe():
            r.start()
            for values in rows:
                r.row(values)
            r.finish()


@contextlib.contextmanager
def _quiet_on_closed_pipe() -> Any:
    """`pswift history jobs | head`: a reader that stops early ends the command quietly."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        raise SystemExit(0) from None


def _open(db: Path | None) -> Any:
    """The history for a read command: opened read-only (an older schema is read from a migrated
    copy, said in one line), never changed."""
    from pipeswift_slurm.history.store import History
    h = History(db, create=False, read_only=True)
    if h.notice:
        _warn(h.notice)
    return h


def _nothing_selected(rows: list[Any]) -> None:
    if not rows:
        raise CLIError("no job in the history matches this selection; widen it (-S, -s, -u, -r) "
                       "or run `pswift history ingest`", 1)


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
