"""History at scale: 1M Slurm job attempts in the SQLite store.

- ingest rate of `History.add_slurm_records` (what `pswift history ingest` and the jobcomp plugin
  use) vs a bare `executemany` INSERT into the same table shape, same run;
- `pswift history report` over all of it (library call, and the CLI end to end);
- 64 concurrent writer processes (plugin-like: small transactions) -> rows lost, "database is
  locked" errors.

    python bench/history_scale.py [--jobs 1000000] [--out bench/results/history_scale.json]
"""

from __future__ import annotations

import argparse
import json
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

from pipeswift_slurm.history import History  # noqa: E402


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
        for a in range(attempts):
            end = start + run
            out.append({"JOBID": f"{prefix}{i}", "JOBNAME": "job", "USERNAME": user, "PARTITION": part,
                        "JOBSTATE": "PREEMPTED" if a < attempts - 1 else "COMPLETED",
                        "NODECNT": str(1 + rnd.randrange(8)), "NODES": "n1", "SUBMIT": submit,
                        "START": start, "END": end, "EXITCODE": "0", "CLUSTER": "c"})
            start = end + rnd.expovariate(1 / 120)
        i += 1
    return out[:n]


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
        from pipeswift_slurm.history import normalise_record
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
        res["ingest_vs_baseline"] = res["ingest_rows_per_s"] / res["baseline_rows_per_s"]
        from pipeswift_slurm.report import aggregate_sql
        t = time.perf_counter()
        groups = aggregate_sql(h, "partition")
        res["report_library_s"] = time.perf_counter() - t
        h.close()
        assert sum(g["jobs"] for g in groups) > 0
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", "history", "report", "--db", str(db),
                               "--format", "json"], capture_output=True, text=True)
        res["report_cli_s"] = time.perf_counter() - t
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        res["report_groups"] = len(json.loads(proc.stdout))
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
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    benchlib.save(args.out, res, quick=args.quick,
                  what=f"{args.jobs:,} Slurm job attempts: ingest rate vs a bare `executemany` into the "
                       f"same table; `history report` over all; {args.writers} concurrent writer processes",
                  figures=f"ingest {res['ingest_rows_per_s'] / 1000:.0f}k rows/s ({res['ingest_vs_baseline']:.2f}× "
                          f"the bare insert, which keeps no per-job roll-up); report {res['report_library_s']:.1f} s "
                          f"(library), {res['report_cli_s']:.1f} s (CLI, with interpreter start); "
                          f"{args.writers} writers × {args.per_writer} rows: {res['rows_lost']} lost, "
                          f"{res['locked_errors']} \"database is locked\"")


if __name__ == "__main__":
    main()
