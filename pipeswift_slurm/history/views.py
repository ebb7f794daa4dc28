"""SQL views over the history: the admin reports as tables any SQLite client (Datasette, sqlite3,
pandas) can read. Views are derived, so they are not numbered migrations: every open of the
database recreates the ones whose definition changed (:func:`ensure`). Their figures use the
same expressions as the CLI's reports (LISTING_SQL, and the usage sums here)."""

from __future__ import annotations

import sqlite3

from pipeswift_slurm.history.queries import LISTING_SQL

#: an attempt's node-, CPU- and GPU-hours over slurm_jobs s (summed per group)
NODE_HOURS = "SUM((s.end - s.start) * s.node_count) / 3600.0"
CPU_HOURS = "SUM((s.end - s.start) * s.procs) / 3600.0"
GPU_HOURS = "SUM((s.end - s.start) * COALESCE(s.gpus, 0)) / 3600.0"
#: a job's size bin over job_rollup r: '1', '2-3', '4-7', ... nodes ('unknown' when not on record)
SIZE_BIN = ("CASE WHEN r.nodes IS NULL OR r.nodes < 1 THEN 'unknown' WHEN r.nodes = 1 THEN '1' "
            + " ".join(f"WHEN r.nodes < {2 * p} THEN '{p}-{2 * p - 1}'" for p in (2 ** i for i in range(1, 17)))
            + " ELSE '131072+' END")

_LISTING = ", ".join(f"{expr} AS {key}" for key, expr in LISTING_SQL.items() if key != "pswift")

VIEWS: dict[str, str] = {
    # every job, one row, the listing's columns (plain jobs' figures; `pswift history jobs`
    # adds pswift jobs' setup/training/checkpoint split)
    "job_listing": f"SELECT {_LISTING}, datetime(r.submit, 'unixepoch', 'localtime') AS submitted, "
                   f"r.work_dir AS work_dir, COALESCE(r.work_dir IN (SELECT run_dir FROM jobs), 0) AS pswift FROM job_rollup r",
    # node-, CPU- and GPU-hours per day and user/account/partition/QOS (an attempt counts on
    # the day it started, local time)
    "usage_daily": f"SELECT date(s.start, 'unixepoch', 'localtime') AS day, s.user AS user, "
                   f"s.account AS account, s.partition AS partition, s.qos AS qos, COUNT(*) AS attempts, "
                   f"{NODE_HOURS} AS node_hours, {CPU_HOURS} AS cpu_hours, {GPU_HOURS} AS gpu_hours "
                   f"FROM slurm_jobs s WHERE s.end IS NOT NULL GROUP BY 1, 2, 3, 4, 5",
    # per job: time used vs the limit, CPU time vs allocated CPU time, MaxRSS vs requested
    "job_efficiency": "SELECT r.job_id AS job_id, r.user AS user, r.account AS account, "
                      "r.partition AS partition, r.qos AS qos, r.last_state AS state, "
                      f"{LISTING_SQL['time_eff']} AS time_eff, {LISTING_SQL['cpu_eff']} AS cpu_eff, "
                      f"{LISTING_SQL['mem_eff']} AS mem_eff, r.last_elapsed_s AS elapsed_s, "
                      "r.limit_s AS limit_s, r.cpu_time_s AS cpu_time_s, r.max_rss_mb AS max_rss_mb, "
                      "r.req_mem_mb AS req_mem_mb FROM job_rollup r",
    # per job: its queue wait with what admins group it by
    "job_waits": f"SELECT r.job_id AS job_id, r.user AS user, r.account AS account, "
                 f"r.partition AS partition, r.qos AS qos, r.nodes AS nodes, {SIZE_BIN} AS size, "
                 f"date(r.submit, 'unixepoch', 'localtime') AS day, r.queue_s AS queue_s "
                 f"FROM job_rollup r WHERE r.queue_s IS NOT NULL",
    # jobs by final state and exit code
    "failures": "SELECT COALESCE(r.last_state, 'unknown') AS state, COALESCE(r.exit_code, '') AS exit_code, "
                "COUNT(*) AS jobs, COUNT(DISTINCT r.user) AS users FROM job_rollup r GROUP BY 1, 2",
    # preempted jobs and what their preemptions cost (a plain job's whole attempts; a pswift
    # job's from its attempts: see `pswift history jobs`)
    "preemption_waste": "SELECT r.job_id AS job_id, r.user AS user, r.account AS account, r.partition AS partition, "
                        "date(r.submit, 'unixepoch', 'localtime') AS day, "
                        "r.preempted AS preemptions, r.wasted_s / 3600.0 AS wasted_hours, "
                        "COALESCE(r.work_dir IN (SELECT run_dir FROM jobs), 0) AS pswift FROM job_rollup r "
                        "WHERE r.preempted > 0",
    # pswift jobs' JCT phases from their attempts (queue: first start - submit)
    "jct_phases": "SELECT COALESCE(j.job_id, 'local:' || j.id) AS job_id, j.name AS name, j.user AS user, j.partition AS partition, "
                  "(SELECT MAX(r.account) FROM job_rollup r WHERE r.job_id = j.job_id) AS account, "
                  "date(j.submit_time, 'unixepoch', 'localtime') AS day, "
                  "MAX(0, MIN(a.start_time) - j.submit_time) AS queue_s, SUM(a.setup_s) AS setup_s, "
                  "SUM(a.train_s) AS training_s, SUM(a.checkpoint_s) AS checkpoint_s, "
                  "COUNT(*) AS attempts, j.actual_jct_s AS jct_s, j.predicted_jct_s AS predicted_jct_s "
                  "FROM jobs j JOIN attempts a ON a.job = j.id GROUP BY j.id",
}


def ensure(conn: sqlite3.Connection, temp: bool = False) -> None:
    """Create or replace every view whose stored definition differs from :data:`VIEWS`;
    ``temp`` (a read-only connection): as TEMP views of this connection alone, the file
    unchanged (a TEMP view is found before the file's view of the same name)."""
    want = {name: f"CREATE VIEW {name} AS {sql}" for name, sql in VIEWS.items()}
    have = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'view'").fetchall())
    stale = [n for n, sql in want.items() if have.get(n) != sql]
    if not stale:
        return
    if temp:
        for name in stale:
            conn.execute(f"CREATE TEMP VIEW IF NOT EXISTS {name} AS {VIEWS[name]}")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for name in stale:
            conn.execute(f"DROP VIEW IF EXISTS {name}")
            conn.execute(want[name])
        conn.execute("COMMIT")
    except sqlite3.OperationalError as e:
        conn.execute("ROLLBACK")
        if "readonly" not in str(e):
            raise                  # a reader without write access keeps the views it has
    except Exception:
        conn.execute("ROLLBACK")
        raise
