"""The jobcomp plugin on a run directory at the readers' cap: a 256 MiB events.jsonl of the
launcher's own lines (about 1.5 million steps). slurmctld runs the plugin once per job attempt
with an 8 s budget; before the streamed fold it took 12.9 s and 2.0 GB here.

Measured, in the same run and alternated rounds: the plugin's wall time and the largest resident
set of it and its reader child (as root, the files are read as the job's user, as slurmctld's
plugin does), against the floor of any Python reader of that file: `json.loads` of every line,
in a fresh interpreter.

    python bench/ingest_cap.py [--quick] [--out bench/results/ingest_cap.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 8.0
PEAK = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")
FLOOR = "import json, sys\nfor line in open(sys.argv[1], 'rb'):\n    json.loads(line)\n"


def step_line(step: int, t: float) -> bytes:
    return (json.dumps({"event": "step", "time": round(t, 3), "attempt": 0, "job_id": "77", "step": step,
                        "loss": 4.736441612243652, "loss_hex": (4.736441612243652).hex(),
                        "step_time": 0.116868}) + "\n").encode()


def make_run(run: Path, size: int) -> int:
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({
        "version": 1, "job_name": "cap", "partition": "low", "training": {"steps": 10**7},
        "model": {"entry": "m:f"}, "prediction": {"nodes": 2, "step_s": 0.1, "jct_s": 10.0}}))
    n = (size - 400) // len(step_line(10**6, 1796092180.0 + 10**6))
    t0 = 1796092180.0
    with open(run / "events.jsonl", "wb") as fh:
        fh.write((json.dumps({"event": "start", "time": t0, "attempt": 0, "job_id": "77", "nodes": 2,
                              "world_size": 4, "stages": 4, "data_parallel": 1, "micro_batches": 8,
                              "micro_batch_size": 2, "step": 0, "boundaries": [0, 2, 4, 6, 8],
                              "setup_s": 3.0, "load_s": 0.1}) + "\n").encode())
        for lo in range(1, n + 1, 100_000):
            fh.write(b"".join(step_line(s, t0 + 0.5 * s) for s in range(lo, min(n + 1, lo + 100_000))))
    return n


def run_plugin(run: Path, tmp: Path, user: pwd.struct_passwd, i: int) -> tuple[float, float, bool]:
    env = {**os.environ, "JOBID": "77", "UID": str(user.pw_uid), "GID": str(user.pw_gid),
           "USERNAME": user.pw_name, "WORK_DIR": str(run), "JOBSTATE": "COMPLETED", "START": "1796092180",
           "END": "1796892180", "SUBMIT": "1796092100", "PARTITION": "low", "CLUSTER": "c", "NODECNT": "2"}
    spool = tmp / f"spool{i}"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PEAK, sys.executable, str(ROOT / "plugins" / "jobcomp_pswift.py"),
                          "--spool", str(spool), "--db", str(tmp / f"h{i}.db")],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    wall = time.perf_counter() - t
    merged = not list(spool.glob("*.json"))
    return wall, int(out.stdout.split()[-1]) / 1024, merged


def run_floor(run: Path) -> tuple[float, float]:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-c", FLOOR, str(run / "events.jsonl")],
                         capture_output=True, text=True, timeout=300, check=True)
    return time.perf_counter() - t, int(out.stdout.split()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ingest_cap.json"))
    ap.add_argument("--quick", action="store_true", help="a 16 MiB log, 1 round (CI: the bench still runs)")
    args = ap.parse_args()
    size, rounds = (16 << 20, 1) if args.quick else (256 << 20, 3)
    user = pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.getuid())
    tmp = Path(tempfile.mkdtemp(prefix="pswift-ingest-cap-"))
    try:
        os.chmod(tmp, 0o755)
        run = tmp / "run"
        steps = make_run(run, size)
        if os.geteuid() == 0:
            for p in (run, run / "plan.json", run / "events.jsonl"):
                os.chown(p, user.pw_uid, user.pw_gid)
        plugin, floor = [], []
        for i in range(rounds):   # alternated rounds
            plugin.append(run_plugin(run, tmp, user, i))
            floor.append(run_floor(run))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = statistics.median(p[0] for p in plugin)
    peak = max(p[1] for p in plugin)
    fwall = statistics.median(f[0] for f in floor)
    fpeak = max(f[1] for f in floor)
    merged = all(p[2] for p in plugin)
    mib = size / 2**20
    figures = (f"{mib:.0f} MiB, {steps:,} steps, median of {rounds}: plugin {wall:.2f} s "
               f"({'within' if wall <= BUDGET_S else 'OVER'} its {BUDGET_S:.0f} s budget; "
               f"{wall / fwall:.2f}x json.loads of every line, {fwall:.2f} s), peak {peak:.0f} MB with its reader "
               f"(floor {fpeak:.0f} MB); {'merged' if merged else 'NOT merged'}")
    benchlib.save(args.out, {"bytes": size, "steps": steps, "rounds": rounds, "plugin_s": wall, "plugin_peak_mb": peak,
                             "floor_s": fwall, "floor_peak_mb": fpeak, "ratio": wall / fwall, "merged": merged,
                             "as_user": user.pw_name, "budget_s": BUDGET_S},
                  quick=args.quick,
                  what="the jobcomp plugin (as root, reading as the job's user) on a run directory whose "
                       "events.jsonl is at the readers' 256 MiB cap, vs `json.loads` of every line, same run",
                  figures=figures)


if __name__ == "__main__":
    main()
