"""Dynamic benchmark: the JCT of a static job vs a re-balanced one vs a growing one, under a
scripted load on the local Slurm (real `pswift sbatch`, real DeepSpeed on CPU).

The job: the tiny-gpt example at hidden 256 with block 0 three times slower (a model kwarg) and
`layer_costs` that are wrong (they put the slow block with three others), nodes = [1, 4]. Another
user's job (the `high` partition, exclusive) is the load; two scripts, each run for two
configurations of the same job, one after the other:

- half busy: the other job holds node3-node4 throughout: the job starts on 2 nodes (2 stages).
  static (`[pipeline] rebalance = false`) vs re-balanced (the cut measured and fixed in place);
- freeing: the other job holds node2-node4 and leaves after ``--hold`` seconds: the job starts
  on node1. static (`[job] grow_check_s = 0`) vs growing (it grows when the nodes free up, and
  re-balances the bigger layout in place).

Each run has its own history (PSWIFT_HOME), so none starts from another's measured profile.
JCT = `pswift sbatch` to COMPLETED, seen from outside. The ratio is static / dynamic (> 1: the
dynamic job finished sooner). The planner is told that all virtual nodes share this host's
cores (PSWIFT_HOST_CORES, PSWIFT_RANKS_PER_HOST), so its estimates reflect what the host can do.

    scripts/with-slurm 22.05 python bench/dynamic.py [--steps 250] [--grow-steps 1000] [--hold 30] [--quick] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {  # name: (holder's nodes, seconds it holds them or None: throughout, the two configs)
    "half_busy": ("node[3-4]", None, {"static": ("false", 0), "rebalanced": ("true", 0)}),
    "freeing": ("node[2-4]", "hold", {"static": ("true", 0), "growing": ("true", 5)}),
}


def make_config(d: Path, steps: int, rebalance: str, grow_check_s: int) -> Path:
    shutil.copytree(ROOT / "examples" / "tiny-gpt", d, ignore=shutil.ignore_patterns("__pycache__"))
    t = (d / "train.toml").read_text()
    subs = {"nodes": "[1, 4]", "jct_slack": "0", "steps": str(steps), "checkpoint_interval": "0", "data_parallel": "1",
            "time": '"0:30:00"',
            "kwargs": "{ vocab = 96, hidden = 256, heads = 4, blocks = 4, seq_len = 32, slow_block = 0, slow_factor = 3 }",
            "layer_costs": "[0.0001, 0.001, 0.001, 0.001, 0.001, 0.1]"}
    for key, value in subs.items():
        t = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", t, count=1)
    t = t.replace("max_requeues = 3", f"max_requeues = 3\ngrow_check_s = {grow_check_s}")
    t = t.replace("[pipeline]\n", f"[pipeline]\nrebalance = {rebalance}\n")
    (d / "train.toml").write_text(t)
    return d / "train.toml"


def state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True,
                         text=True, timeout=30).stdout.strip()
    return out or "GONE"


def wait_for(job: str, states: set[str], timeout: float) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = state(job)
        if s in states:
            return s
        time.sleep(0.25)
    raise SystemExit(f"job {job} not in {states} after {timeout:.0f} s (last: {state(job)})")


def one_run(tmp: Path, name: str, steps: int, holder_nodes: str, hold_s: float | None,
            rebalance: str, grow_check_s: int, pswift: str, env: dict) -> dict:
    toml = make_config(tmp / f"{name}-ex", steps, rebalance, grow_check_s)
    env = {**env, "PSWIFT_HOME": str(tmp / f"{name}-home")}   # no run learns from another's profile
    sleep = f"sleep {hold_s:.0f}" if hold_s else "sleep 3600"
    holder = subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", holder_nodes, "--exclusive",
                             "--time=10", "-o", "/dev/null", "--wrap", sleep],
                            capture_output=True, text=True, check=True).stdout.strip()
    run = tmp / f"{name}-run"
    try:
        wait_for(holder, {"RUNNING"}, 60)
        t0 = time.time()
        proc = subprocess.run([pswift, "sbatch", "--parsable", "--run-dir", str(run), str(toml)],
                              capture_output=True, text=True, env=env, timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: pswift sbatch failed: {proc.stderr}")
        job = proc.stdout.strip()
        got = wait_for(job, {"COMPLETED", "FAILED", "CANCELLED", "GONE"}, 1800)
        jct = time.time() - t0
    finally:
        subprocess.run(["scancel", holder], capture_output=True, timeout=30)
    if got != "COMPLETED":
        raise SystemExit(f"{name}: job {job} ended {got}; see {run}")
    evs = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    starts = [e for e in evs if e["event"] == "start"]
    return {"jct_s": jct, "launches": [(s["attempt"], s["nodes"], s["boundaries"]) for s in starts],
            "relayouts": sum(e["event"] == "relayout" for e in evs), "grows": sum(e["event"] == "grow" for e in evs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=250, help="steps of the half-busy job")
    ap.add_argument("--grow-steps", type=int, default=1000,
                    help="steps of the freeing job: growing repays its requeue (~11 s) and the 30 s on "
                         "one node over the steps left; on a 2-core host, where 2 virtual nodes are "
                         "~1.25x one, 250 steps give ~1.13x and 1,000 ~1.28x")
    ap.add_argument("--hold", type=float, default=30.0, help="seconds the freeing load holds its nodes")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dynamic.json"))
    ap.add_argument("--quick", action="store_true", help="12 steps, a 5 s hold (CI: the bench still runs)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.grow_steps, args.hold = 12, 12, 5.0
    pswift = shutil.which("pswift", path=str(Path(sys.executable).parent)) or "pswift"
    runs: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="pswift-bench-dyn-") as tmp:
        env = {**os.environ, "PSWIFT_HOST_CORES": str(os.cpu_count() or 1), "PSWIFT_RANKS_PER_HOST": "4"}
        for scenario, (nodes, hold, configs) in SCENARIOS.items():
            runs[scenario] = {}
            for config, (rebalance, grow_check_s) in configs.items():
                r = one_run(Path(tmp), f"{scenario}-{config}", args.grow_steps if hold else args.steps, nodes,
                            args.hold if hold else None, rebalance, grow_check_s, pswift, env)
                runs[scenario][config] = r
                print(f"{scenario:9s} {config:10s} JCT {r['jct_s']:6.1f} s  launches {r['launches']}  "
                      f"relayouts {r['relayouts']}  grows {r['grows']}", flush=True)
    half, free = runs["half_busy"], runs["freeing"]
    ratios = {"rebalanced": half["static"]["jct_s"] / half["rebalanced"]["jct_s"],
              "growing": free["static"]["jct_s"] / free["growing"]["jct_s"]}
    res = {"benchmark": "dynamic", "steps": args.steps, "grow_steps": args.grow_steps, "hold_s": args.hold,
           "runs": runs, "ratios": ratios}
    benchlib.save(args.out, res, quick=args.quick,
                  what=f"JCT of one job (a slow block, wrong `layer_costs`, nodes [1, 4]) under another "
                       f"user's job: holding 2 of 4 nodes throughout ({args.steps} steps: static vs "
                       f"re-balanced in place), or 3 of 4 for {args.hold:.0f} s ({args.grow_steps} steps: "
                       f"static vs growing), "
                       f"`pswift sbatch` to COMPLETED",
                  figures=f"re-balanced {half['rebalanced']['jct_s']:.0f} s vs static {half['static']['jct_s']:.0f} s "
                          f"({ratios['rebalanced']:.2f}× faster); growing {free['growing']['jct_s']:.0f} s vs "
                          f"static {free['static']['jct_s']:.0f} s ({ratios['growing']:.2f}× faster)")


if __name__ == "__main__":
    main()
