"""`pswift sbatch` (plan + batch script + run directory + a real sbatch) vs submitit submitting a
bare function, on the running dev cluster, same run.

Each submission is a fresh interpreter, as a user's command is: the `pswift` command's `sbatch --parsable
train.toml -- --hold` (the example, planned with live cluster state and the history) with an empty
history and with a history of --jobs Slurm job attempts whose user has --registered finished pswift
jobs in the job registry (each submission checks them), and `python -c` that imports submitit
and submits ``sum([1, 2])`` for the same partition and node count, held too. The three alternate,
in a rotated order each round; every held job is cancelled at the end. The ratio is the median
of each round's own ratio (the three ran seconds apart: a drift of the host's speed falls on
both sides of it), with a bootstrap 90 % interval of that median and the rounds' range; the
ratio of the medians is kept beside it.

    scripts/with-slurm 22.05 python bench/submit_latency.py [--repeats 10] [--jobs 1000000] [--registered 2000] [--quick]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from history_scale import records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "examples" / "tiny-gpt" / "train.toml"

SUBMITIT = """
import sys, submitit
ex = submitit.AutoExecutor(folder=sys.argv[1], cluster="slurm")
ex.update_parameters(slurm_partition="low", nodes=2, tasks_per_node=1, cpus_per_task=1,
                     timeout_min=15, slurm_additional_parameters={"hold": True})
print(ex.submit(sum, [1, 2]).job_id)
"""


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed: {proc.stderr.strip()[-500:]}")
    return took, proc.stdout.strip().splitlines()[-1]


def big_history(db: Path, jobs: int) -> None:
    from pipeswift_slurm.history.store import History
    h = History(db)
    recs = records(jobs)
    for r in recs:
        r["PARTITION"] = "low"
    for i in range(0, len(recs), 200_000):
        h.add_slurm_records(recs[i:i + 200_000], "bench")
    h.close()


#: a finished pswift job's run directory, as the registry of a user who submits often holds many
PAST_PLAN = {"version": 1, "job_name": "past", "partition": "low", "submitted_at": 1.0,
             "model": {"entry": "model:layers", "kwargs": {}, "num_layers": 2}, "training": {"steps": 2}}
PAST_EVENTS = [{"event": "start", "attempt": 0, "time": 10.0, "nodes": 1, "world_size": 1, "stages": 1,
                "data_parallel": 1, "micro_batches": 2, "micro_batch_size": 1, "boundaries": [0, 2],
                "step": 0, "setup_s": 1.0},
               {"event": "step", "attempt": 0, "time": 11.0, "step": 1, "loss": 2.0, "step_time": 0.5},
               {"event": "end", "attempt": 0, "time": 13.0, "reason": "completed", "step": 1}]


def past_runs(home: Path, db: Path, jobs: int) -> None:
    """``jobs`` completed pswift jobs in the job registry under ``home``, ingested into ``db``
    (a submission checks the user's registered runs for what ran since)."""
    import json
    from pipeswift_slurm.history.rundir import register_job
    from pipeswift_slurm.history.store import History
    os.environ["PSWIFT_HOME"] = str(home)
    events = "".join(json.dumps(e) + "\n" for e in PAST_EVENTS)
    for i in range(jobs):
        run = home / "runs" / f"past-{i}"
        run.mkdir(parents=True)
        (run / "plan.json").write_text(json.dumps(PAST_PLAN))
        (run / "JOB_ID").write_text(f"{100_000 + i}\n")
        (run / "events.jsonl").write_text(events)
        register_job(str(100_000 + i), run)
        os.utime(home / "jobs" / f"{100_000 + i}.json", (5.0, 5.0))     # submitted before it ended
    h = History(db)
    h.ingest_registered()
    h.close()
    del os.environ["PSWIFT_HOME"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--registered", type=int, default=2000,
                    help="completed jobs in the big-history user's job registry")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "submit_latency.json"))
    ap.add_argument("--quick", action="store_true", help="10k jobs, 2 repeats (CI: the bench still runs)")
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.repeats, args.registered = 10_000, 2, 20
    pswift = shutil.which("pswift", path=str(Path(sys.executable).parent)) or "pswift"
    # what pip does at install time, which an editable install and PYTHONDONTWRITEBYTECODE skip:
    # byte-compile the package, so that both sides import compiled modules
    compileall.compile_dir(ROOT / "pipeswift_slurm", quiet=1)
    times: dict[str, list[float]] = {"submitit": [], "pswift": [], "pswift_big_history": []}
    job_ids: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
        tmp_path = Path(tmp)
        big_history(tmp_path / "big.db", args.jobs)
        past_runs(tmp_path / "big-home", tmp_path / "big.db", args.registered)
        base = {**os.environ, "PSWIFT_HOME": str(tmp_path / "home")}
        cmds = {
            "submitit": ([sys.executable, "-c", SUBMITIT, str(tmp_path / "submitit")], base),
            "pswift": ([pswift, "sbatch", "--parsable", str(EXAMPLE), "--", "--hold"],
                       {**base, "PSWIFT_DB": str(tmp_path / "empty.db")}),
            "pswift_big_history": ([pswift, "sbatch", "--parsable", str(EXAMPLE), "--", "--hold"],
                                   {**base, "PSWIFT_DB": str(tmp_path / "big.db"),
                                    "PSWIFT_HOME": str(tmp_path / "big-home")}),
        }
        names = list(cmds)
        try:
            for r in range(args.repeats):
                for name in names[r % 3:] + names[:r % 3]:      # rotate: drift falls on all alike
                    cmd, env = cmds[name]
                    took, job_id = timed(cmd, {**env, "PWD": tmp})
                    times[name].append(took)
                    job_ids.append(job_id)
        finally:
            if job_ids:
                subprocess.run(["scancel", *job_ids], capture_output=True, timeout=60)
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = {k: [a / b for a, b in zip(times[k], times["submitit"])] for k in ("pswift", "pswift_big_history")}
    res = {"benchmark": "submit_latency", "repeats": args.repeats, "history_jobs": args.jobs,
           "registered_jobs": args.registered,
           "median_s": med, "min_s": {k: min(v) for k, v in times.items()},
           "max_s": {k: max(v) for k, v in times.items()}, "seconds": times,
           "round_ratios": paired,
           "ratio": statistics.median(paired["pswift"]),
           "ratio_big_history": statistics.median(paired["pswift_big_history"]),
           # a bootstrap 90 % interval of each median ratio: what the rounds resolve
           "interval": {k: benchlib.median_interval(v) for k, v in paired.items()},
           "ratio_of_medians": med["pswift"] / med["submitit"],
           "ratio_of_medians_big_history": med["pswift_big_history"] / med["submitit"]}
    span = {k: f"90 % interval {res['interval'][k][0]:.2f}–{res['interval'][k][1]:.2f}; rounds {min(v):.2f}–{max(v):.2f}"
            for k, v in paired.items()}
    benchlib.save(args.out, res, quick=args.quick,
                  what=f"`pswift sbatch` of the example (plan with live cluster state and the history, "
                       f"batch script, run directory, real `sbatch`) vs submitit submitting a bare "
                       f"function, each a fresh interpreter, held jobs, {args.repeats} rotated rounds",
                  figures=f"median {med['pswift']:.3f} s vs submitit {med['submitit']:.3f} s "
                          f"({res['ratio']:.2f}×, the median of the rounds' ratios; "
                          f"{span['pswift']}); with a {args.jobs:,}-job history and "
                          f"{args.registered:,} finished jobs in the user's registry "
                          f"{med['pswift_big_history']:.3f} s ({res['ratio_big_history']:.2f}×, "
                          f"{span['pswift_big_history']})")


if __name__ == "__main__":
    main()
