"""Predicted vs measured step time over a real DeepSpeed CPU grid (issues: planner, simulator).

1. Profile: real runs of the tiny-gpt example (2 stages, m=4) record per-layer costs in the
   history (the launcher's profiling hooks); the median over --repeats runs is used.
2. Grid: P in {1, 2, 4} x m in {2, 4, 8, 16} (global batch = 8 x m, one data-parallel rank),
   each trained for real with `pswift run` on this machine --repeats times; measured = the
   median over runs of each run's median step time (this host's noise moves a single run by
   up to 15-20 %).
3. Prediction for every cell from that one profile: the cost model (1F1B simulator + CPU
   contention: all ranks share this machine's cores), before and after calibration: the
   per-micro-batch overhead outside the layers is fitted on the profiling run's own measured
   step time (what the planner does once a model has run).
4. Also the plain simulated 1F1B makespan (no contention) for the simulator's own error.

    python bench/step_time_model.py [--steps 14] [--out bench/results/step_time_model.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataclasses import replace  # noqa: E402

from pipeswift_slurm.costmodel import Hardware, Profile, estimate_step, fit_overhead  # noqa: E402
from pipeswift_slurm.history import History  # noqa: E402
from pipeswift_slurm.simulate import simulate, stage_times  # noqa: E402

PS, MS = (1, 2, 4), (2, 4, 8, 16)


def config(d: Path, P: int, m: int, steps: int) -> Path:
    shutil.copytree(ROOT / "examples" / "tiny-gpt", d, ignore=shutil.ignore_patterns("__pycache__"))
    t = (d / "train.toml").read_text()
    for k, v in {"nodes": str(P), "steps": str(steps), "global_batch_size": str(8 * m),
                 "checkpoint_interval": "0", "micro_batches": str(m)}.items():
        t = re.sub(rf"(?m)^{k} = .*$", f"{k} = {v}", t)
    (d / "train.toml").write_text(t)
    return d / "train.toml"


def run(toml: Path, run_dir: Path, env: dict) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", "run", "--run-dir", str(run_dir),
                           str(toml)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {toml}\n{proc.stderr[-2000:]}")
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per cell (and profiling runs); medians tame this host's noise")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_time_model.json"))
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "PSWIFT_HOME": str(tmp / "home"), "PSWIFT_DB": str(tmp / "h.db")}
        # 1) the profiling runs: per-layer costs and measured step time, medians over --repeats
        profiles, prof_steps, prof_start = [], [], None
        for r in range(args.repeats):
            ev = run(config(tmp / f"prof{r}", 2, 4, args.steps), tmp / f"prof-run{r}", env)
            h = History(tmp / "h.db")
            h.ingest_run_dir(tmp / f"prof-run{r}")
            mkey = next(iter(h.db.conn.execute("SELECT model_key FROM jobs")))[0]
            profiles.append(h.layer_profile(mkey))
            h.close()
            prof_steps.append(statistics.median([e["step_time"] for e in ev if e["event"] == "step"][1:]))
            prof_start = [e for e in ev if e["event"] == "start"][0]
        mbs = profiles[0][0]
        secs = [statistics.median(p[1][i] for p in profiles) for i in range(len(profiles[0][1]))]
        params, acts = profiles[0][2], profiles[0][3]
        profile = Profile(tuple(secs), tuple(params), tuple(acts), mbs, "history")
        # what the planner does once a model has run: fit the per-micro-batch overhead on the
        # profiling runs' own measured step time (P=2, m=4), then predict every cell
        overhead = fit_overhead(profile, [(prof_start["boundaries"], 4, 8, 1, 1, statistics.median(prof_steps))],
                                Hardware(host_cores=cores, ranks_per_host=2))
        tuned = replace(profile, overhead_s=overhead)
        # 2) the grid
        cells = []
        for P in PS:
            for m in MS:
                runs = []
                for r in range(args.repeats):
                    ev = run(config(tmp / f"c{P}-{m}-{r}", P, m, args.steps), tmp / f"r{P}-{m}-{r}", env)
                    runs.append(statistics.median([e["step_time"] for e in ev if e["event"] == "step"][2:]))
                measured = statistics.median(runs)
                start = [e for e in ev if e["event"] == "start"][0]
                b = start["boundaries"]
                hw = Hardware(host_cores=cores, ranks_per_host=P)
                est = estimate_step(profile, b, m, 8, 1, 1, hw)
                cal = estimate_step(tuned, b, m, 8, 1, 1, hw)
                fwd, bwd = stage_times(list(profile.costs), b)
                sim = simulate(fwd, bwd, m, "1f1b").step_time
                cells.append({"stages": P, "micro_batches": m, "boundaries": b, "measured_s": measured,
                              "measured_runs_s": runs,
                              "predicted_s": est.step_s, "calibrated_s": cal.step_s,
                              "simulated_1f1b_s": sim, "contention": cal.contention})
                print(f"P={P} m={m:2d} boundaries={b}: measured {measured * 1000:7.1f} ms, "
                      f"calibrated {cal.step_s * 1000:7.1f} ms, uncalibrated {est.step_s * 1000:7.1f} ms, "
                      f"simulated 1F1B {sim * 1000:7.1f} ms", flush=True)
        for c in cells:
            for key in ("predicted_s", "calibrated_s", "simulated_1f1b_s"):
                c[key.replace("_s", "_error")] = (c[key] - c["measured_s"]) / c["measured_s"]
    # the planner's decision for a given global batch is the split: per m, which P?
    choices = []
    for m in MS:
        row = [c for c in cells if c["micro_batches"] == m]
        fastest = min(row, key=lambda c: c["measured_s"])
        chosen = min(row, key=lambda c: c["calibrated_s"])
        choices.append({"micro_batches": m, "measured_fastest_stages": fastest["stages"],
                        "model_choice_stages": chosen["stages"],
                        "choice_vs_fastest": chosen["measured_s"] / fastest["measured_s"]})
    summary = {
        "repeats": args.repeats, "cores": cores, "fitted_overhead_ms_per_microbatch_per_stage": overhead * 1000,
        "median_abs_error_model": statistics.median(abs(c["predicted_error"]) for c in cells),
        "median_abs_error_calibrated": statistics.median(abs(c["calibrated_error"]) for c in cells),
        "max_abs_error_calibrated": max(abs(c["calibrated_error"]) for c in cells),
        "median_abs_error_simulator_only": statistics.median(abs(c["simulated_1f1b_error"]) for c in cells),
        "cells_within_15pct": sum(abs(c["calibrated_error"]) <= 0.15 for c in cells),
        "cells": len(cells),
        "choices": choices,
        "worst_choice_vs_fastest": max(c["choice_vs_fastest"] for c in choices),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "step_time_model", "summary": summary,
                                          "cells": cells}, indent=2) + "\n")
    for k2, v in summary.items():
        print(f"{k2}: {v}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
