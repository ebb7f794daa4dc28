"""Predicted vs measured step time over a real DeepSpeed CPU grid (issues: planner, simulator).

1. Profile: real runs of the tiny-gpt example (2 stages, m=4) record per-layer costs and the
   engine's time outside the layers (the launcher's instruction timing) in the history; the
   median over --repeats runs is used.
2. Grid: P in {1, 2, 4} x m in {2, 4, 8, 16} (global batch = 8 x m, one data-parallel rank),
   each trained for real with `pswift run` on this machine --repeats times; measured = the
   median over runs of each run's median step time (this host's noise moves a single run by
   up to 15-20 %). Runs go in rounds (profiling run, calibration run, every cell shuffled), so
   the host's drift over minutes does not favour the runs made first.
3. Prediction for every cell from that profile by the cost model (1F1B simulator; all ranks
   share this machine's cores, processor sharing where they outnumber them), three ways:
   - model: the profile as recorded;
   - calibrated (profile run): x the ratio measured / estimated of the profiling runs
     themselves (what the planner does once a model has run: the profiling hooks and early
     steps make the profile slow);
   - calibrated (+ 4-stage run): also one 4-stage m=4 run (more ranks than cores here), from
     which the planner learns what fraction of its cores this host delivers when
     oversubscribed (context switches, wake-ups); measured separately from the grid.
4. Also the plain simulated 1F1B makespan of the layer costs (no overheads, no contention).

    python bench/step_time_model.py [--steps 14] [--repeats 3] [--out bench/results/step_time_model.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from pipeswift_slurm.planning.costmodel import Hardware, Profile, calibrate, estimate_step  # noqa: E402
from pipeswift_slurm.history.store import History  # noqa: E402
from pipeswift_slurm.planning.simulate import simulate, stage_times  # noqa: E402

PS, MS = (1, 2, 4), (2, 4, 8, 16)


def config(d: Path, P: int, m: int, steps: int) -> Path:
    shutil.copytree(ROOT / "examples" / "tiny-gpt", d, ignore=shutil.ignore_patterns("__pycache__"))
    t = (d / "train.toml").read_text()
    for k, v in {"nodes": str(P), "steps": str(steps), "global_batch_size": str(8 * m),
                 "checkpoint_interval": "0", "micro_batches": str(m)}.items():
        t = re.sub(rf"(?m)^{k} = .*$", f"{k} = {v}", t)
    (d / "train.toml").write_text(t)
    return d / "train.toml"


FAILED: list[dict] = []  # runs that failed and were retried (reported in the JSON)


def run(toml: Path, run_dir: Path, env: dict) -> list[dict]:
    for attempt in range(2):
        d = run_dir if attempt == 0 else run_dir.with_name(run_dir.name + "-retry")
        proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli.main", "run", "--run-dir", str(d),
                               str(toml)], capture_output=True, text=True, env=env)
        if proc.returncode == 0:
            if attempt:
                shutil.rmtree(run_dir, ignore_errors=True)
                d.rename(run_dir)
            return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
        FAILED.append({"config": str(toml), "rc": proc.returncode, "stderr": proc.stderr[-500:],
                       "stdout": proc.stdout[-1500:]})
        print(f"run failed (rc {proc.returncode}), {'retrying' if attempt == 0 else 'giving up'}: {toml}\n"
              f"{proc.stderr[-1000:]}\n{proc.stdout[-1500:]}", file=sys.stderr, flush=True)
    raise SystemExit(f"run failed twice: {toml}")


def steady(ev: list[dict]) -> float:
    """A run's median step time after its first two steps (warm-up)."""
    return statistics.median([e["step_time"] for e in ev if e["event"] == "step"][2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per cell (and profiling runs); medians tame this host's noise")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_time_model.json"))
    ap.add_argument("--quick", action="store_true",
                    help="P in {1, 2} x m = 4, one round of 6 steps (CI: the bench still runs)")
    args = ap.parse_args()
    global PS, MS
    if args.quick:
        PS, MS, args.repeats, args.steps = (1, 2), (4,), 1, 6
    cores = os.cpu_count() or 1
    hw = Hardware(host_cores=cores, ranks_per_host=max(PS))  # every rank on this one host
    with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "PSWIFT_HOME": str(tmp / "home"), "PSWIFT_DB": str(tmp / "h.db")}
        # rounds: each runs the profiling config, the 4-stage calibration config and every grid
        # cell once (cells shuffled), so the host's drift over minutes spreads over all of them
        profiles, overheads, prof_steps, four_steps, bounds = [], [], [], [], {}
        grid: dict[tuple[int, int], list[float]] = {(P, m): [] for P in PS for m in MS}
        for r in range(args.repeats):
            ev = run(config(tmp / f"prof{r}", 2, 4, args.steps), tmp / f"prof-run{r}", env)
            h = History(tmp / "h.db")
            h.ingest_run_dir(tmp / f"prof-run{r}")
            mkey = next(iter(h.conn.execute("SELECT model_key FROM jobs")))[0]
            profiles.append(h.layer_profile(mkey))
            overheads.append(h.pipe_overheads(mkey, profiles[-1][0]))
            h.close()
            prof_steps.append(steady(ev))
            bounds[(2, 4)] = [e for e in ev if e["event"] == "start"][0]["boundaries"]
            ev = run(config(tmp / f"four{r}", 4, 4, args.steps), tmp / f"four-run{r}", env)
            four_steps.append(steady(ev))
            bounds[(4, 4)] = [e for e in ev if e["event"] == "start"][0]["boundaries"]
            order = list(grid)
            random.Random(r).shuffle(order)
            for P, m in order:
                ev = run(config(tmp / f"c{P}-{m}-{r}", P, m, args.steps), tmp / f"r{P}-{m}-{r}", env)
                grid[(P, m)].append(steady(ev))
                bounds[(P, m)] = [e for e in ev if e["event"] == "start"][0]["boundaries"]
            print(f"round {r + 1}/{args.repeats} done", flush=True)
        mbs = profiles[0][0]
        secs = [statistics.median(p[1][i] for p in profiles) for i in range(len(profiles[0][1]))]
        params, acts = profiles[0][2], profiles[0][3]
        over = {k: statistics.median(o[k] for o in overheads) for k in overheads[0]}
        profile = Profile(tuple(secs), tuple(params), tuple(acts), mbs, "history", **over)
        prof_measured = (bounds[(2, 4)], 4, 8, 1, 1, statistics.median(prof_steps))
        cal1 = calibrate(profile, [prof_measured], hw)
        cal2 = calibrate(profile, [prof_measured, (bounds[(4, 4)], 4, 8, 1, 1, statistics.median(four_steps))], hw)
        models = {"predicted_s": (profile, hw),
                  "calibrated_profile_run_s": (profile.scaled(cal1.scale), hw._replace(shared_efficiency=cal1.shared_efficiency)),
                  "calibrated_s": (profile.scaled(cal2.scale), hw._replace(shared_efficiency=cal2.shared_efficiency))}
        cells = []
        for (P, m), runs in grid.items():
            b = bounds[(P, m)]
            measured = statistics.median(runs)
            cell = {"stages": P, "micro_batches": m, "boundaries": b, "measured_s": measured,
                    "measured_runs_s": runs}
            for key, (prof, h) in models.items():
                cell[key] = estimate_step(prof, b, m, 8, 1, 1, h).step_s
            fwd, bwd = stage_times(list(profile.costs), b)
            cell["simulated_1f1b_s"] = simulate(fwd, bwd, m, "1f1b").step_time
            cells.append(cell)
            print(f"P={P} m={m:2d} boundaries={b}: measured {measured * 1000:7.1f} ms, calibrated "
                  f"{cell['calibrated_s'] * 1000:7.1f} ms (profile run only {cell['calibrated_profile_run_s'] * 1000:7.1f}), "
                  f"model {cell['predicted_s'] * 1000:7.1f} ms, simulated 1F1B {cell['simulated_1f1b_s'] * 1000:7.1f} ms",
                  flush=True)
    keys = [*models, "simulated_1f1b_s"]
    for c in cells:
        for key in keys:
            c[key.replace("_s", "_error")] = (c[key] - c["measured_s"]) / c["measured_s"]

    def choices(key: str) -> list[dict]:
        """The planner's decision for a given global batch is the split: per m, which P?"""
        out = []
        for m in MS:
            row = [c for c in cells if c["micro_batches"] == m]
            fastest = min(row, key=lambda c: c["measured_s"])
            chosen = min(row, key=lambda c: c[key])
            out.append({"micro_batches": m, "measured_fastest_stages": fastest["stages"],
                        "model_choice_stages": chosen["stages"],
                        "choice_vs_fastest": chosen["measured_s"] / fastest["measured_s"]})
        return out

    summary: dict = {"repeats": args.repeats, "cores": cores,
                     "profile_overheads_ms": {k: v * 1000 for k, v in over.items()},
                     "profile_layer_ms": [c * 1000 for c in profile.costs],
                     "calibration_profile_run": cal1._asdict(), "calibration": cal2._asdict(), "cells": len(cells),
                     "failed_runs_retried": FAILED}
    for key in keys:
        name = key[:-2]
        errs = [abs(c[name + "_error"]) for c in cells]
        summary[name] = {"median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                         "cells_within_15pct": sum(e <= 0.15 for e in errs),
                         "cells_within_10pct": sum(e <= 0.10 for e in errs)}
        if key != "simulated_1f1b_s":
            ch = choices(key)
            summary[name].update(choices=ch, worst_choice_vs_fastest=max(c["choice_vs_fastest"] for c in ch))
    for k2, v in summary.items():
        print(f"{k2}: {v}")
    benchlib.save(args.out, {"benchmark": "step_time_model", "summary": summary, "cells": cells},
                  quick=args.quick, what=STEP_MODEL_WHAT.format(P="{" + ",".join(map(str, PS)) + "}",
                                                           m="{" + ",".join(map(str, MS)) + "}", r=args.repeats),
                  figures=step_model_figures(summary))


STEP_MODEL_WHAT = (
    "real DeepSpeed runs P ∈ {P} × m ∈ {m}, {r} round(s) (profiling run, calibration run, every "
    "cell shuffled; medians), vs the cost model from the profiled 2-stage run (layer costs + the "
    "engine's overheads from the launcher's instruction timing; ranks sharing cores simulated by "
    "processor sharing)")


def step_model_figures(s: dict) -> str:
    def errs(name: str) -> str:
        e = s[name]
        return (f"median error {e['median_abs_error']:.1%}, worst {e['max_abs_error']:.1%}, "
                f"{e['cells_within_15pct']}/{s['cells']} cells within 15 % "
                f"({e['cells_within_10pct']} within 10 %)")
    right = sum(c["model_choice_stages"] == c["measured_fastest_stages"] for c in s["calibrated"]["choices"])
    return (f"with the profiling run in the history: {errs('calibrated_profile_run')}; adding one "
            f"4-stage run (the planner learns the host delivers "
            f"{s['calibration']['shared_efficiency']:.0%} of ideal core sharing): {errs('calibrated')}. "
            f"Plain simulator on layer costs: median {s['simulated_1f1b']['median_abs_error']:.0%}. "
            f"Split choice = the measured fastest for {right} of {len(s['calibrated']['choices'])} m")


if __name__ == "__main__":
    main()
