"""History at scale: 1M Slurm job attempts in the SQLite store.

- ingest rate of `History.add_slurm_records` (what `pswift history ingest` and the jobcomp plugin
  use) vs a bare `executemany` INSERT into the same table shape, same run;
- every admin read command (`history jobs`, `export`, `report`, `show`, `doctor` and the
  sreport-like reports), end to end in a fresh interpreter with its output piped, against the
  `sqlite3` command running the equivalent query on the same database, output piped the same
  way, in the same run (medians of 3, rotated); and `pswift --version`, the interpreter's floor;
- 64 concurrent writer processes (plugin-like: small transactions) -> rows lost, "database is
  locked" errors.

    python bench/history_scale.py [--jobs 1000000] [--out bench/results/history_scale.json]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeswift_slurm.history.store import History  # noqa: E402


def records(n: int, seed: int = 1, prefix: str = "") -> list[dict]:
    rnd = random.Random(seed)
    out = []
    t0 = 1_700_000_000
    i = 0
    while len(out) < n:
        submit = t0 + i * 30 + rnd.random()
        wait = rnd.expovariate(1 / 600)
        run = rnd.expovariate(1 / 3600)
        part = f"p{rnd.randrange(8)}"
        user = f"u{rnd.randrange(200)}"
        attempts = 2 if rnd.random() < 0.1 else 1
        start = submit + wait
        nodes = 1 + rnd.randrange(8)
        final, code = rnd.choices([("COMPLETED", "0:0"), ("FAILED", "1:0"), ("TIMEOUT", "0:15")], (90, 7, 3))[0]
        for a in range(attempts):
            end = start + run
            out.append({"JOBID": f"{prefix}{i}", "JOBNAME": "job", "USERNAME": user, "PARTITION": part,
                        "ACCOUNT": f"a{int(user[1:]) % 20}", "QOS": ("normal", "long", "debug")[i % 3],
                        "JOBSTATE": "PREEMPTED" if a < attempts - 1 else final,
                        "NODECNT": str(nodes), "PROCS": str(16 * nodes), "NODES": "n1", "SUBMIT": submit,
                        "START": start, "END": end, "EXITCODE": code, "LIMIT": 240, "CLUSTER": "c"})
            start = end + rnd.expovariate(1 / 120)
        i += 1
    return out[:n]


def _percentiles(key: str) -> str:
    """p50 and p95 of queue wait and JCT per ``key`` in plain SQL (window functions)."""
    return (f"WITH w AS (SELECT {key} AS k, queue_s, jct_s, attempts, preempted, "
            f"ROW_NUMBER() OVER (PARTITION BY {key} ORDER BY queue_s) AS rq, "
            f"ROW_NUMBER() OVER (PARTITION BY {key} ORDER BY jct_s) AS rj, "
            f"COUNT(*) OVER (PARTITION BY {key}) AS n FROM job_rollup) "
            f"SELECT k, COUNT(*), SUM(attempts), SUM(preempted) * 1.0 / SUM(attempts), "
            f"MAX(CASE WHEN rq = CAST(0.5 * n AS INT) THEN queue_s END), "
            f"MAX(CASE WHEN rq = CAST(0.95 * n AS INT) THEN queue_s END), "
            f"MAX(CASE WHEN rj = CAST(0.5 * n AS INT) THEN jct_s END), "
            f"MAX(CASE WHEN rj = CAST(0.95 * n AS INT) THEN jct_s END) FROM w GROUP BY k ORDER BY k")


def command_pairs(jid: str) -> dict[str, tuple[list[str], str, list[str]]]:
    """Each admin command and the sqlite3 query that reads the same rows and computes the same
    figures (with sqlite3's options for the same output form)."""
    one_job = (f"SELECT * FROM slurm_jobs WHERE job_id = '{jid}' ORDER BY start; "
               f"SELECT * FROM job_rollup WHERE job_id = '{jid}'")
    from pipeswift_slurm.history.queries import LISTING_SQL
    from pipeswift_slurm.reports.jct import LISTING
    listing = (f"SELECT {', '.join(LISTING_SQL[c.key] for c in LISTING)} FROM job_rollup r "
               f"ORDER BY r.job_num, r.job_id")
    tsv = ["-header", "-separator", "\t"]
    return {
        "jobs": (["history", "jobs"], listing, tsv),
        "jobs_first_1000": (["history", "jobs", "--limit", "1000"], listing + " LIMIT 1000", tsv),
        "export": (["history", "export"], listing, ["-header", "-csv"]),
        "report": (["history", "report", "--by", "partition"], _percentiles("partition"), tsv),
        "show": (["history", "show", jid], one_job, tsv),
        "doctor": (["doctor", jid], one_job, tsv),
        "usage": (["history", "usage", "--by", "account", "--per", "month"],
                  "SELECT strftime('%Y-%m', start, 'unixepoch', 'localtime') AS b, account, "
                  "COUNT(*), SUM((end - start) * node_count) / 3600.0, "
                  "SUM((end - start) * procs) / 3600.0, SUM((end - start) * COALESCE(gpus, 0)) / 3600.0 "
                  "FROM slurm_jobs WHERE end IS NOT NULL GROUP BY b, account ORDER BY b", tsv),
        "efficiency": (["history", "efficiency", "--by", "account"],
                       "SELECT account, COUNT(*), AVG(last_elapsed_s / limit_s), SUM(cpu_time_s) / SUM(cpu_s), "
                       "AVG(max_rss_mb / req_mem_mb) FROM job_rollup GROUP BY account ORDER BY account", tsv),
        "waits": (["history", "waits", "--by", "qos"], _percentiles("qos"), tsv),
        "failures": (["history", "failures"],
                     "SELECT last_state, exit_code, COUNT(*), COUNT(DISTINCT user) FROM job_rollup "
                     "GROUP BY 1, 2 ORDER BY 3 DESC", tsv),
        # the baseline counts each attempt on the day it started; pswift splits it across the days it ran
        "utilisation": (["history", "utilisation", "-r", "p0", "--nodes", "64"],
                        "SELECT strftime('%Y-%m-%d', start, 'unixepoch', 'localtime') AS d, "
                        "SUM((end - start) * node_count) / 3600.0 FROM slurm_jobs WHERE partition = 'p0' "
                        "GROUP BY d ORDER BY d", tsv),
    }


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]}... failed: {proc.stderr.strip()}")
    return took


def compare_commands(db: Path, jid: str, tmp: Path, rounds: int = 3) -> dict[str, dict[str, float]]:
    """Median wall time of each command and of sqlite3's equivalent, in rotated order; plus
    `pswift --version`, what any Python command pays before it reads the database."""
    import os
    import shutil
    import statistics
    if shutil.which("sqlite3") is None:
        raise SystemExit("the sqlite3 command is needed for the baseline: apt-get install sqlite3")
    env = {**os.environ, "PSWIFT_HOME": str(tmp / "home"), "PSWIFT_DB": str(db)}
    pswift = [sys.executable, "-m", "pipeswift_slurm.cli.main"]
    pairs = command_pairs(jid)
    times: dict[str, dict[str, list[float]]] = {k: {"pswift": [], "sqlite3": []} for k in pairs}
    floor: list[float] = []
    for r in range(rounds + 1):       # round 0 warms the page cache and the byte-code
        for name in list(pairs)[r % len(pairs):] + list(pairs)[:r % len(pairs)]:
            args, sql, opts = pairs[name]
            p = _timed([*pswift, *args], env)
            q = _timed(["sqlite3", "-readonly", *opts, str(db), sql], env)
            if r:
                times[name]["pswift"].append(p)
                times[name]["sqlite3"].append(q)
        f = _timed([*pswift, "--version"], env)
        if r:
            floor.append(f)
    out = {"python_floor": {"pswift_s": statistics.median(floor)}}
    for name, t in times.items():
        p, q = statistics.median(t["pswift"]), statistics.median(t["sqlite3"])
        out[name] = {"pswift_s": p, "sqlite3_s": q, "ratio": p / q}
        print(f"{name:12s} pswift {p:6.2f} s   sqlite3 {q:6.3f} s   ratio {p / q:6.2f}")
    return out


def add_pswift_runs(h: History, recs: list[dict], every: int = 500) -> int:
    """Make every ``every``-th job a pswift job, as ingest leaves one: its Slurm records name its
    run directory, and the pswift tables hold the run and its attempts (setup, training,
    checkpoint, step statistics), so the listings and reports take their pswift paths."""
    by_job: dict[str, list[dict]] = {}
    for r in recs:
        by_job.setdefault(r["JOBID"], []).append(r)
    chosen = [jid for jid in by_job if int(jid) % every == 0]
    with h.conn:
        for jid in chosen:
            rows, run = by_job[jid], f"/runs/{jid}"
            h.conn.execute("UPDATE slurm_jobs SET work_dir = ? WHERE cluster = 'c' AND job_id = ?", (run, jid))
            h.conn.execute("UPDATE job_rollup SET work_dir = ? WHERE cluster = 'c' AND job_id = ?", (run, jid))
            job = h.conn.execute(
                "INSERT INTO jobs (run_dir, job_id, name, partition, user, submit_time, state, predicted_jct_s) "
                "VALUES (?, ?, 'train', ?, ?, ?, 'completed', ?)",
                (run, jid, rows[0]["PARTITION"], rows[0]["USERNAME"], rows[0]["SUBMIT"],
                 rows[-1]["END"] - rows[0]["SUBMIT"])).lastrowid
            for n, r in enumerate(rows):
                span = r["END"] - r["START"]
                h.conn.execute(
                    "INSERT INTO attempts (job, attempt, nodes, stages, data_parallel, micro_batches, start_time, "
                    "end_time, start_step, end_step, ended, setup_s, checkpoint_s, train_s, step_count, step_mean, "
                    "step_var, step_p50, step_p95, config_key) VALUES (?, ?, ?, 2, 1, 8, ?, ?, ?, ?, ?, ?, ?, ?, "
                    "100, 1.0, 0.01, 1.0, 1.2, 'cfg')",
                    (job, n, int(r["NODECNT"]), r["START"], r["END"], 100 * n, 100 * (n + 1),
                     "preempted" if r["JOBSTATE"] == "PREEMPTED" else "completed", 0.05 * span, 0.05 * span,
                     0.9 * span))
    return len(chosen)


def writer(args: tuple[str, int, int]) -> tuple[int, int]:
    db, k, n = args
    locked = errors = 0
    h = History(db)
    for j in range(0, n, 10):
        try:
            h.add_slurm_records(records(10, seed=k * 100000 + j, prefix=f"w{k}-{j}-"), "bench")
        except Exception as e:  # counted, never hidden
            locked += "locked" in str(e)
            errors += 1
    h.close()
    return locked, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--per-writer", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "history_scale.json"))
    ap.add_argument("--quick", action="store_true", help="10k jobs, 4 writers (CI: the bench still runs)")
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.writers, args.per_writer = 10_000, 4, 20
    res: dict = {"benchmark": "history_scale", "rows": args.jobs}
    with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
        db = Path(tmp) / "h.db"
        recs = records(args.jobs)
        from pipeswift_slurm.slurm.accounting import normalise_record
        rows = [normalise_record(r, "bench") for r in recs]
        # baseline: bare executemany into the same table shape
        base = sqlite3.connect(Path(tmp) / "base.db")
        cols = list(rows[0])
        base.execute(f"CREATE TABLE t ({', '.join(cols)}, PRIMARY KEY (cluster, job_id, start))")
        t = time.perf_counter()
        with base:
            base.executemany(f"INSERT INTO t VALUES ({', '.join('?' * len(cols))})",
                             [tuple(r[c] for c in cols) for r in rows])
        res["baseline_rows_per_s"] = args.jobs / (time.perf_counter() - t)
        base.close()
        h = History(db)
        t = time.perf_counter()
        for i in range(0, len(recs), 100_000):
            h.add_slurm_records(recs[i:i + 100_000], "bench")
        res["ingest_rows_per_s"] = args.jobs / (time.perf_counter() - t)
        res["pswift_jobs"] = add_pswift_runs(h, recs)
        res["ingest_vs_baseline"] = res["ingest_rows_per_s"] / res["baseline_rows_per_s"]
        from pipeswift_slurm.reports.jct import aggregate_sql
        t = time.perf_counter()
        groups = aggregate_sql(h, "partition")
        res["report_library_s"] = time.perf_counter() - t
        jid = h.conn.execute("SELECT job_id FROM job_rollup WHERE work_dir IN (SELECT run_dir FROM jobs) "
                             "ORDER BY attempts DESC, job_num DESC LIMIT 1").fetchone()[0]   # a preempted pswift job
        h.close()
        assert sum(g["jobs"] for g in groups) > 0
        res["commands"] = compare_commands(db, jid, Path(tmp))
        res["report_cli_s"] = res["commands"]["report"]["pswift_s"]
        # concurrency
        cdb = Path(tmp) / "conc.db"
        History(cdb).close()
        t = time.perf_counter()
        with mp.get_context("spawn").Pool(args.writers) as pool:
            outs = pool.map(writer, [(str(cdb), k, args.per_writer) for k in range(args.writers)])
        res["concurrent_s"] = time.perf_counter() - t
        h = History(cdb)
        got = h.db["slurm_jobs"].count
        h.close()
        res.update(writers=args.writers, expected_rows=args.writers * args.per_writer, rows_written=got,
                   rows_lost=args.writers * args.per_writer - got,
                   locked_errors=sum(o[0] for o in outs), other_errors=sum(o[1] for o in outs))
    for k, v in res.items():
        if k != "commands":
            print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    cmds = {k: v for k, v in res["commands"].items() if k != "python_floor"}
    heavy = {k: v for k, v in cmds.items() if v["sqlite3_s"] >= 0.5}
    res["slowest_command_s"] = max(v["pswift_s"] for v in cmds.values())
    res["worst_heavy_ratio"] = max((v["ratio"] for v in heavy.values()), default=None)
    benchlib.save(args.out, res, quick=args.quick,
                  what=f"{args.jobs:,} Slurm job attempts: ingest rate vs a bare `executemany` into the "
                       f"same table; every admin read command over all of them, end to end with its output "
                       f"piped, vs the `sqlite3` command running the equivalent query, same run (show and "
                       f"doctor are one-job lookups: their time is Python's start); {args.writers} "
                       f"concurrent writer processes",
                  figures=f"ingest {res['ingest_rows_per_s'] / 1000:.0f}k rows/s ({res['ingest_vs_baseline']:.2f}× "
                          f"the bare insert, which keeps no per-job roll-up); admin commands end to end (vs "
                          f"`sqlite3` on the equivalent query): "
                          + ", ".join(f"{k} {v['pswift_s']:.2f} s ({v['ratio']:.1f}×)" for k, v in cmds.items())
                          + f"; slowest {res['slowest_command_s']:.2f} s; `pswift --version` alone "
                          f"{res['commands']['python_floor']['pswift_s']:.2f} s; "
                          f"{args.writers} writers × {args.per_writer} rows: {res['rows_lost']} lost, "
                          f"{res['locked_errors']} \"database is locked\"")


if __name__ == "__main__":
    main()
