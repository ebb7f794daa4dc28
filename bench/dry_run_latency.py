"""`pswift sbatch --dry-run` latency with a 1M-job history DB vs bare `sbatch --test-only`.

Both against the running dev cluster (`scripts/slurm-dev-cluster start`), same run, median of
--repeats. The dry run plans with live cluster state and the history (profiles, measured step
times, partition waits and preemption rate), renders the script, submits nothing.

    python bench/dry_run_latency.py [--jobs 1000000] [--out bench/results/dry_run_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from history_scale import records  # noqa: E402

from pipeswift_slurm.history import History  # noqa: E402


def timed(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dry_run_latency.json"))
    ap.add_argument("--quick", action="store_true", help="10k jobs, 2 repeats (CI: the bench still runs)")
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.repeats = 10_000, 2
    with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
        db = Path(tmp) / "h.db"
        h = History(db)
        recs = records(args.jobs)
        for r in recs:
            r["PARTITION"] = "low"
        for i in range(0, len(recs), 200_000):
            h.add_slurm_records(recs[i:i + 200_000], "bench")
        h.close()
        env = {**os.environ, "PSWIFT_DB": str(db), "PSWIFT_HOME": str(Path(tmp) / "home")}
        toml = str(ROOT / "examples" / "tiny-gpt" / "train.toml")
        dry = [timed([sys.executable, "-m", "pipeswift_slurm.cli", "sbatch", "--dry-run", toml], env)
               for _ in range(args.repeats)]
        script = Path(tmp) / "t.sh"
        script.write_text("#!/bin/bash\ntrue\n")
        test_only = [timed(["sbatch", "--test-only", "-p", "low", "-N2", str(script)], env)
                     for _ in range(args.repeats)]
    res = {"benchmark": "dry_run_latency", "history_jobs": args.jobs,
           "dry_run_median_s": statistics.median(dry), "sbatch_test_only_median_s": statistics.median(test_only),
           "ratio": statistics.median(dry) / statistics.median(test_only), "dry_run_s": dry,
           "sbatch_test_only_s": test_only}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    for k in ("history_jobs", "dry_run_median_s", "sbatch_test_only_median_s", "ratio"):
        print(f"{k}: {res[k]}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
