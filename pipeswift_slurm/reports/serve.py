"""`pswift history serve`: Datasette over the history database, read-only, with the metadata
admins need (titles, descriptions, units), the report views (:mod:`pipeswift_slurm.history.views`), canned
queries and a dashboard (datasette-dashboards: JCT phases, preemption waste, waits, usage,
utilisation, failures), bound to 127.0.0.1 unless told otherwise."""

from __future__ import annotations

# Imports inside functions: Datasette's process and its tools, only when serving

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from pipeswift_slurm.errors import PswiftError

DASHBOARD = "pswift"
_HOUR, _SECOND, _MB = "hour", "s", "MB"


class ServeError(PswiftError):
    exit_code = 1


class ServeRefused(ServeError):
    exit_code = 2


def _tables() -> dict[str, Any]:
    seconds = {c: _SECOND for c in ("queue_s", "setup_s", "training_s", "checkpoint_s", "jct_s", "elapsed_s",
                                    "limit_s", "cpu_time_s", "step_mean_s", "predicted_jct_s", "last_elapsed_s",
                                    "run_s", "node_s", "cpu_s", "gpu_s", "wasted_s")}
    hours = {c: _HOUR for c in ("node_hours", "cpu_hours", "gpu_hours", "wasted_hours")}
    memory = {c: _MB for c in ("max_rss_mb", "req_mem_mb", "mem_mb")}
    units = {**seconds, **hours, **memory}
    ratios = "time_eff: elapsed / time limit; cpu_eff: CPU time / (elapsed x allocated CPUs); mem_eff: MaxRSS / requested memory"
    tables = {
        "slurm_jobs": ("Slurm job attempts", "One row per attempt (a requeue starts a new one), from the jobcomp "
                       "plugin, jobcomp/filetxt and sacct. Times are epoch seconds."),
        "job_rollup": ("Jobs (all attempts rolled up)", "One row per Slurm job, kept current by every ingest."),
        "jobs": ("pswift runs", "Jobs pswift submitted, with the plan's predictions."),
        "attempts": ("pswift attempts", "Each attempt of a pswift job: layout, steps, setup/training/checkpoint times."),
        "job_listing": ("Job listing", f"What `pswift history jobs` lists, plain jobs' figures. {ratios}."),
        "usage_daily": ("Usage per day", "Node-, CPU- and GPU-hours per day (local time; an attempt counts on the "
                        "day it started) and user, account, partition, QOS."),
        "job_efficiency": ("Job efficiency", f"seff's figures per job. {ratios}; empty where Slurm recorded nothing "
                           "(MaxRSS needs a jobacct_gather plugin)."),
        "job_waits": ("Queue waits", "Each job's wait in the queue (before its first start and between attempts), "
                      "with its QOS, partition and size bin."),
        "failures": ("Failures", "Jobs by final state and exit code."),
        "preemption_waste": ("Preemption waste", "Preempted jobs: a plain job loses each preempted attempt whole "
                             "(elapsed x CPUs); empty where the records cannot say. pswift jobs lose only the steps "
                             "since their last checkpoint: see `pswift history show`."),
        "jct_phases": ("JCT phases of pswift jobs", "Queue (first start - submit), setup, training and "
                       "checkpoint/cleanup, summed over a pswift job's attempts."),
    }
    return {name: {"title": title, "description": text, "units": units} for name, (title, text) in tables.items()}


#: canned queries: the CLI's reports, as SQL over the views
QUERIES = {
    "usage_by_account_per_month": {
        "title": "Node-hours by account per month",
        "sql": "SELECT substr(day, 1, 7) AS month, account, SUM(attempts) AS attempts, SUM(node_hours) AS node_hours, "
               "SUM(cpu_hours) AS cpu_hours, SUM(gpu_hours) AS gpu_hours FROM usage_daily GROUP BY 1, 2 ORDER BY 1, 4 DESC"},
    "top_users": {
        "title": "Top users by node-hours",
        "sql": "SELECT user, SUM(node_hours) AS node_hours, SUM(cpu_hours) AS cpu_hours, SUM(gpu_hours) AS gpu_hours "
               "FROM usage_daily GROUP BY user ORDER BY node_hours DESC LIMIT 20"},
    "utilisation_per_day": {
        "title": "A partition's utilisation per day",
        "description": "Busy node-hours per day over what :nodes nodes give in a day (attempts counted on the day "
                       "they started; `pswift history utilisation` splits them exactly).",
        "sql": "SELECT day, SUM(node_hours) AS busy_node_hours, SUM(node_hours) / (CAST(:nodes AS REAL) * 24) "
               "AS utilisation FROM usage_daily WHERE partition = :partition GROUP BY day ORDER BY day"},
    "waits_by_qos": {
        "title": "Queue wait by QOS",
        "sql": "SELECT qos, COUNT(*) AS jobs, AVG(queue_s) AS mean_wait_s, MAX(queue_s) AS max_wait_s "
               "FROM job_waits GROUP BY qos ORDER BY qos"},
    "waits_by_size": {
        "title": "Queue wait by job size (nodes)",
        "sql": "SELECT size, COUNT(*) AS jobs, AVG(queue_s) AS mean_wait_s, MAX(queue_s) AS max_wait_s "
               "FROM job_waits GROUP BY size ORDER BY MIN(nodes)"},
    "efficiency_by_user": {
        "title": "Efficiency by user",
        "sql": "SELECT user, COUNT(*) AS jobs, AVG(time_eff) AS time_eff, SUM(cpu_time_s) / "
               "SUM(CASE WHEN cpu_time_s IS NOT NULL THEN elapsed_s * 1.0 END) AS cpu_time_per_elapsed_s, "
               "AVG(cpu_eff) AS cpu_eff, AVG(mem_eff) AS mem_eff FROM job_efficiency GROUP BY user ORDER BY user"},
    "failures_by_exit_code": {
        "title": "Failures by state and exit code",
        "sql": "SELECT state, exit_code, jobs, users FROM failures WHERE state <> 'COMPLETED' ORDER BY jobs DESC"},
}


def _bar(x: str, x_title: str, y: str, y_title: str, color: str | None = None, **extra: Any) -> dict[str, Any]:
    enc: dict[str, Any] = {"x": {"field": x, "type": "nominal", "title": x_title, "sort": None},
                           "y": {"field": y, "type": "quantitative", "title": y_title}}
    if color:
        enc["color"] = {"field": color, "type": "nominal", "title": color}
    return {"mark": {"type": "bar", "tooltip": True}, "encoding": {**enc, **extra}}


def _selected(day: str = "day", prefix: str = "") -> str:
    """The dashboard's filters as optional clauses (datasette-dashboards keeps a ``[[ ]]`` block
    only when its filter is set): the day (local, YYYY-MM-DD) a job was submitted, its
    partition, user and account."""
    return (f"[[ AND {day} >= :date_start ]] [[ AND {day} <= :date_end ]] "
            f"[[ AND {prefix}partition = :partition ]] [[ AND {prefix}user = :user ]] "
            f"[[ AND {prefix}account = :account ]]")


def filters(db_name: str) -> dict[str, Any]:
    """Every chart's filters: a submit-date range, partition, user, account (the choices are
    what the history holds)."""
    def choices(col: str) -> str:
        return f"SELECT DISTINCT {col} FROM job_rollup WHERE {col} IS NOT NULL ORDER BY 1 LIMIT 1000"
    return {"date_start": {"name": "Submitted from", "type": "date"},
            "date_end": {"name": "Submitted up to", "type": "date"},
            **{col: {"name": col.capitalize(), "type": "select", "db": db_name, "query": choices(col)}
               for col in ("partition", "user", "account")}}


def dashboard(db_name: str) -> dict[str, Any]:
    """The datasette-dashboards definition: one dashboard of the admin figures, each chart
    narrowed by the filters."""
    rollup = _selected("date(r.submit, 'unixepoch', 'localtime')", "r.")
    phases = " UNION ALL ".join(
        f"SELECT job_id, '{label}' AS phase, {col} / 60.0 AS minutes FROM last" for col, label in
        (("queue_s", "1 queue"), ("setup_s", "2 setup"), ("training_s", "3 training"),
         ("checkpoint_s", "4 checkpoint/cleanup")))
    # an empty selection draws one bar that says why, not a blank chart
    none = ("SELECT 'none' AS job_id, 'no pswift job in this selection (pswift jobs come from "
            "`pswift history ingest`)' AS phase, 0 AS minutes WHERE NOT EXISTS (SELECT 1 FROM last)")
    charts = {
        "jobs": {"title": "Jobs in the history", "db": db_name, "library": "metric",
                 "query": f"SELECT COUNT(*) AS jobs FROM job_rollup r WHERE 1 = 1 {rollup}",
                 "display": {"field": "jobs"}},
        "wasted": {"title": "CPU-hours lost to preemption (plain jobs)", "db": db_name, "library": "metric",
                   "query": "SELECT ROUND(COALESCE(SUM(wasted_hours), 0), 1) AS hours FROM preemption_waste "
                            f"WHERE NOT pswift {_selected()}",
                   "display": {"field": "hours", "suffix": " h"}},
        "jct-phases": {"title": "JCT phases of the last 30 pswift jobs", "db": db_name, "library": "vega-lite",
                       "query": f"WITH last AS (SELECT * FROM jct_phases WHERE 1 = 1 {_selected()} ORDER BY "
                                f"CAST(job_id AS INTEGER) DESC LIMIT 30) SELECT * FROM ({phases} UNION ALL "
                                f"{none}) ORDER BY CAST(job_id AS INTEGER), phase",
                       "display": _bar("job_id", "job", "minutes", "time (minutes)", "phase")},
        "waste": {"title": "Preemption waste by partition (plain jobs)", "db": db_name, "library": "vega-lite",
                  "query": "SELECT COALESCE(partition, 'unknown') AS partition, SUM(COALESCE(wasted_hours, 0)) AS "
                           "wasted_hours, SUM(preemptions) AS preemptions FROM preemption_waste WHERE NOT pswift "
                           f"{_selected()} GROUP BY 1 ORDER BY 1",
                  "display": _bar("partition", "partition", "wasted_hours", "wasted CPU-hours")},
        "waits": {"title": "Mean queue wait by QOS", "db": db_name, "library": "vega-lite",
                  "query": "SELECT COALESCE(qos, 'none') AS qos, AVG(queue_s) / 60.0 AS minutes, COUNT(*) AS jobs "
                           f"FROM job_waits WHERE 1 = 1 {_selected()} GROUP BY 1 ORDER BY 1",
                  "display": _bar("qos", "QOS", "minutes", "mean wait (minutes)")},
        "usage": {"title": "Node-hours per day by partition (last 60 days on record)", "db": db_name,
                  "library": "vega-lite",
                  "query": "SELECT day, COALESCE(partition, 'unknown') AS partition, SUM(node_hours) AS node_hours "
                           "FROM usage_daily WHERE day >= (SELECT date(MAX(day), '-60 days') FROM usage_daily) "
                           f"{_selected()} GROUP BY 1, 2 ORDER BY 1",
                  "display": {"mark": {"type": "line", "point": True, "tooltip": True},
                              "encoding": {"x": {"field": "day", "type": "temporal", "timeUnit": "yearmonthdate",
                                                 "title": "day"},
                                           "y": {"field": "node_hours", "type": "quantitative",
                                                 "title": "busy node-hours"},
                                           "color": {"field": "partition", "type": "nominal"}}}},
        "failures": {"title": "Jobs by final state", "db": db_name, "library": "vega-lite",
                     "query": "SELECT COALESCE(r.last_state, 'unknown') AS state, COUNT(*) AS jobs FROM job_rollup r "
                              f"WHERE 1 = 1 {rollup} GROUP BY 1 ORDER BY jobs DESC",
                     "display": _bar("state", "final state", "jobs", "jobs")},
    }
    return {DASHBOARD: {"title": "pswift: where cluster time goes",
                        "description": "Job completion time phases, preemption waste, queue waits, usage and "
                                       "failures, from the pswift history.",
                        "layout": [["jobs", "wasted"], ["jct-phases", "jct-phases"], ["waste", "waits"],
                                   ["usage", "usage"], ["failures", "failures"]],
                        "filters": filters(db_name), "charts": charts}}


#: the longest a query may run (Datasette's sql_time_limit_ms): the views and canned queries
#: answer within it on a million-job history (bench/history_scale.py)
SQL_TIME_LIMIT_MS = 2000


def metadata(db_path: Path, everyone: bool = False) -> dict[str, Any]:
    """Datasette's metadata: titles, units, canned queries, the dashboard, and who may look: the
    holder of the start-up token (Datasette's root actor), or anyone with ``everyone``. Whoever
    may look may also run read-only SQL (the dashboard draws its charts with it), each query
    stopped after SQL_TIME_LIMIT_MS; nobody else gets anything (403)."""
    name = db_path.stem
    who: Any = True if everyone else {"id": "root"}
    return {"title": "pswift job history",
            "description": "Every Slurm job attempt and every pswift run; read-only.",
            "allow": who, "allow_sql": who,
            "databases": {name: {"tables": _tables(), "queries": QUERIES}},
            "plugins": {"datasette-dashboards": dashboard(name)}}


#: what a one-user copy of the history keeps of each table: SQL over the source ``src``, with
#: :user the user; tables whose rows hang off a job keep those of the jobs kept
OWN_ROWS = {
    "slurm_jobs": "user = :user", "job_rollup": "user = :user", "jobs": "user = :user",
    "attempts": "job IN (SELECT id FROM main.jobs)", "plan_decisions": "job IN (SELECT id FROM main.jobs)",
    "relayouts": "job IN (SELECT id FROM main.jobs)",
    "layer_profiles": "model_key IN (SELECT model_key FROM main.jobs)",
    "pipe_overheads": "model_key IN (SELECT model_key FROM main.jobs)",
    "ingest_state": "run_dir IN (SELECT run_dir FROM main.jobs)", "sacct_state": "1",
}


def served_user(db_path: Path, euid: int, db_owner: int, asked: str | None, me: str) -> str | None:
    """Whose jobs are served (None: everyone's). The database's owner and root see every job,
    or the one user they ask for; anyone else who can read it sees their own only."""
    admin = euid in (0, db_owner)
    if asked is not None and not admin and asked != me:
        raise ServeRefused(f"--user {asked}: only the owner of {db_path} (or root) may serve another "
                           f"user's jobs; leave --user out to serve your own")
    return asked if asked is not None or admin else me


def own_rows(db_path: Path, user: str, folder: Path) -> Path:
    """A copy of the history at ``folder``/<same name> holding ``user``'s jobs only (their Slurm
    attempts, pswift runs, and what hangs off those), its views made anew: what a user who is
    not the database's admin is served. The source is opened read-only."""
    import sqlite3
    from pipeswift_slurm.history.store import History
    dest = folder / db_path.name
    History(dest).close()                       # the newest schema and its views, empty
    from urllib.parse import quote
    conn = sqlite3.connect(f"file:{quote(str(dest))}", uri=True, isolation_level=None)
    try:
        conn.execute("ATTACH DATABASE ? AS src", [f"file:{quote(str(db_path))}?mode=ro"])
        conn.execute("BEGIN")
        for table, where in OWN_ROWS.items():
            have = {r[1] for r in conn.execute(f"PRAGMA src.table_info({table})")}
            cols = ", ".join(f'"{r[1]}"' for r in conn.execute(f"PRAGMA main.table_info({table})") if r[1] in have)
            if cols:
                conn.execute(f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM src.{table} WHERE {where}",
                             {"user": user} if ":user" in where else {})
        conn.execute("COMMIT")
    finally:
        conn.close()
    return dest


def serve(db_path: Path, host: str, port: int, everyone: bool = False, only_user: str | None = None) -> None:
    """Serve the history; with ``only_user``, a private copy of that user's rows (own_rows),
    removed when the server stops."""
    import importlib.util
    if not all(importlib.util.find_spec(m) for m in ("datasette", "datasette_dashboards")):
        raise ServeError("`pswift history serve` needs Datasette: pip install 'pipeswift-slurm[serve]'")
    if only_user is None:
        _become_datasette(db_path, host, port, everyone)
    import shutil
    folder = Path(tempfile.mkdtemp(prefix="pswift-serve-"))   # 0700: this user's alone
    try:
        _serve_child(own_rows(db_path, only_user, folder), host, port, everyone)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _datasette_args(db_path: Path, meta: str, host: str, port: int, everyone: bool) -> list[str]:
    return [sys.executable, "-m", "datasette", "serve", str(db_path), "--metadata", meta, "--host", host,
            "--port", str(port), "--setting", "sql_time_limit_ms", str(SQL_TIME_LIMIT_MS),
            "--setting", "facet_time_limit_ms", "1000", *([] if everyone else ["--root"])]


def _become_datasette(db_path: Path, host: str, port: int, everyone: bool) -> NoReturn:
    """Become Datasette on the database (read-only) with the metadata: exec, so a signal to this
    process reaches the server itself and nothing is left behind (the metadata is an unlinked
    temporary file, open on an inherited descriptor). Unless ``everyone``, Datasette prints a
    URL with a one-time token (``--root``): only a browser that opened it gets in, as on a
    Jupyter server, so other users of a shared login node cannot read the history."""
    with tempfile.TemporaryFile("w+") as meta:
        meta.write(json.dumps(metadata(db_path, everyone), indent=2))
        meta.flush()
        fd = os.dup(meta.fileno())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, _datasette_args(db_path, f"/dev/fd/{fd}", host, port, everyone))


def _serve_child(db_path: Path, host: str, port: int, everyone: bool) -> None:
    """Datasette as a child over a copy this process removes afterwards: the signals that would
    stop it are passed on, and this process waits for it."""
    import signal
    import subprocess
    meta = db_path.parent / "metadata.json"
    meta.write_text(json.dumps(metadata(db_path, everyone), indent=2))
    child = subprocess.Popen(_datasette_args(db_path, str(meta), host, port, everyone))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    child.wait()
