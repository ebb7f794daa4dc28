"""The planner's cluster query (`slurm.cluster_state()`: every node, running and pending jobs)
through the CLI backend (scontrol/sinfo + squeue of pending and running jobs) vs the pyslurm backend, same cluster,
same run, alternating, medians.

Two figures per backend: *warm* (a query in a process that already asked once: what a long-lived
process such as rank 0's grow checks pays) and *cold* (a fresh interpreter importing pswift,
finding the Slurm version, choosing the backend and asking once: what one `pswift` command pays).
Needs a running dev cluster with pyslurm built for its Slurm (`scripts/with-slurm 25.11 ...`).

    scripts/with-slurm 25.11 python bench/slurm_backends.py [--repeats 15] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARM = """
import json, sys, time
from pipeswift_slurm.slurm import client as slurm
slurm.cluster_state()
ts = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter(); slurm.cluster_state(); ts.append(time.perf_counter() - t)
print(json.dumps({"backend": slurm.backend().name, "times": ts}))
"""
COLD = "from pipeswift_slurm.slurm import client as slurm; slurm.cluster_state(); print(slurm.backend().name)"


def run(backend: str, code: str, *args: str) -> tuple[str, float]:
    env = {**os.environ, "PSWIFT_SLURM_BACKEND": backend}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True)
    return proc.stdout, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="3 repeats (CI: the bench still runs)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "slurm_backends.json"))
    args = ap.parse_args()
    reps = 3 if args.quick else args.repeats
    from pipeswift_slurm.slurm import client as slurm
    from pipeswift_slurm.slurm import pyslurm_backend as slurm_pyslurm
    why = slurm_pyslurm.unusable(slurm.slurm_version())
    backends = ["cli"] + ([] if why else ["pyslurm"])
    warm: dict[str, list[float]] = {b: [] for b in backends}
    cold: dict[str, list[float]] = {b: [] for b in backends}
    for _ in range(reps):                     # alternate, so drift falls on both alike
        for b in backends:
            out, _ = run(b, WARM, "5")
            got = json.loads(out)
            assert got["backend"] == b, got
            warm[b] += got["times"]
            out, dt = run(b, COLD)
            assert out.strip() == b
            cold[b].append(dt)
    res: dict = {"benchmark": "slurm_backends", "slurm": ".".join(map(str, slurm.slurm_version())),
                 "repeats": reps, "pyslurm": None if why is None else why[0]}
    for b in backends:
        res[f"{b}_warm_median_ms"] = statistics.median(warm[b]) * 1000
        res[f"{b}_cold_median_ms"] = statistics.median(cold[b]) * 1000
    if "pyslurm" in backends:
        res["warm_ratio_pyslurm_over_cli"] = res["pyslurm_warm_median_ms"] / res["cli_warm_median_ms"]
        res["cold_ratio_pyslurm_over_cli"] = res["pyslurm_cold_median_ms"] / res["cli_cold_median_ms"]
    for k, v in res.items():
        print(f"{k}: {round(v, 3) if isinstance(v, float) else v}")
    if "pyslurm" in backends:
        figures = (f"warm {res['pyslurm_warm_median_ms']:.1f} ms vs {res['cli_warm_median_ms']:.1f} ms "
                   f"({res['warm_ratio_pyslurm_over_cli']:.2f}×); cold {res['pyslurm_cold_median_ms']:.0f} ms "
                   f"vs {res['cli_cold_median_ms']:.0f} ms ({res['cold_ratio_pyslurm_over_cli']:.2f}×: "
                   f"importing pyslurm eats the gain in a one-shot command)")
    else:
        figures = (f"CLI only (pyslurm: {res['pyslurm']}): warm {res['cli_warm_median_ms']:.1f} ms, "
                   f"cold {res['cli_cold_median_ms']:.0f} ms")
    benchlib.save(args.out, res, quick=args.quick,
                  what=f"the planner's cluster query (`slurm.cluster_state()`) through the pyslurm backend "
                       f"vs the CLI backend (`scontrol show nodes --json` + `squeue` of pending and running jobs), Slurm "
                       f"{res['slurm']}, {reps} alternated rounds: *warm* (a process that asked before) "
                       f"and *cold* (a fresh interpreter: import, version check, backend choice, one query)",
                  figures=figures)


if __name__ == "__main__":
    main()
