"""Workload benchmark: the JCT of many jobs from several users on the local Slurm with its
backfill scheduler (real `pswift sbatch`, real DeepSpeed on CPU, real `sbatch` for the others).

A seeded trace: training jobs of two users (alice, bob) of several lengths, each with a node
range, and another user's (carol's) plain exclusive jobs with the time limits users write
(2-4x what they need), all arriving over ``--window`` seconds on the `low` partition's 4 nodes.
The training model's layers sleep their cost (forward a third, backward two thirds) instead of
computing, so 4 virtual nodes on a 2-core host run like 4 machines and `[model] layer_costs`
is its true cost (the planner is told so: PSWIFT_RANKS_PER_HOST=1). Every job asks for whole
nodes (`--exclusive`). The same trace runs three ways, one after the other:

- (A) as users submit today: the top of each node range, fixed; the time limit as written;
- (B) pswift: the node range and the planner; limits from predictions (`time_policy = "predicted"`);
- (C) pswift: the node range and the planner; the time limit as written.

Per policy: mean, p50, p90 and p99 JCT and the mean bounded slowdown of the training jobs
(submit to COMPLETED; bench/jctstats.py), the other jobs' mean wait and bounded slowdown, node
utilisation and makespan, requeues at a time limit, jobs lost (not COMPLETED with
every step), and for (B) the start-time error of pswift's queue estimate and of Slurm's own
(`squeue --start` just after the submission) against the real start; B's and C's mean JCT over
A's on the same jobs (``paired``, with a bootstrap interval over the jobs). A picture of the three
schedules (nodes x time, a colour per job) goes to docs/workload.png.

    scripts/with-slurm 22.05 python bench/workload.py [--jobs 32] [--window 900] [--quick] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import jctstats  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NODES = 4
POLICIES = {"A": "as users submit: fixed nodes, limit as written",
            "B": "pswift: node range, planner, predicted limits",
            "C": "pswift: node range, planner, limit as written"}
LAYERS, COST_S = 8, 0.01
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}

PACED = '''"""Layers that sleep their cost: a pipeline of them runs like real stages on separate machines."""
import time

import torch
import torch.nn as nn
from deepspeed.pipe import LayerSpec


class _Pace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cost_s):
        ctx.cost_s = cost_s
        time.sleep(cost_s / 3)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.cost_s / 3)
        return grad, None


class Paced(nn.Module):
    def __init__(self, width, cost_s):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.cost_s = cost_s

    def forward(self, x):
        return _Pace.apply(torch.tanh(self.lin(x)), self.cost_s)


def build_layers(width=16, layers=8, cost_s=0.01):
    return [LayerSpec(Paced, width, cost_s) for _ in range(layers)]


def batch(step, index, micro_batch_size, seed, width=16, **_):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + index)
    x = torch.randn(micro_batch_size, width, generator=g)
    return x, 0.5 * x


def mse(out, labels):
    return torch.nn.functional.mse_loss(out, labels)
'''

TOML = '''[job]
name = "{name}"
partition = "low"
time = "{limit}"
time_policy = "{policy}"
max_requeues = 6
jct_slack = 0
sbatch_options = ["--exclusive"]

[resources]
nodes = {nodes}
tasks_per_node = 1
cpus_per_task = 1
device = "cpu"

[model]
entry = "paced:build_layers"
loss = "paced:mse"
num_layers = {layers}
layer_costs = [{costs}]
kwargs = {{ width = 16, layers = {layers}, cost_s = {cost} }}

[training]
steps = {steps}
global_batch_size = 16
micro_batch_size = 4
data = "paced:batch"
seed = 1
optimizer = {{ type = "AdamW", params = {{ lr = 0.001 }} }}
checkpoint_interval = 50

[pipeline]
stages = "auto"
data_parallel = 1
'''


def trace(seed: int, jobs: int, window: float, quick: bool) -> list[dict[str, Any]]:
    """The arrivals, in time order: training jobs (user, steps, node range, written limit) and
    plain jobs (nodes, seconds they run, written limit)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(jobs):
        at = round(rng.uniform(0, window), 1) if i else 0.0
        if quick or i % 7 in (0, 2, 4):   # 3 of 7 are training jobs
            steps = 12 if quick else rng.choice([60, 120, 200])
            lo, hi = rng.choice([(1, 2), (1, 4), (2, 4)])
            out.append({"kind": "train", "user": rng.choice(["alice", "bob"]), "at": at, "steps": steps,
                        "nodes": (lo, hi), "limit_min": rng.choice([15, 20, 30])})
        else:
            run_s = 5 if quick else rng.choice([20, 40, 60, 90, 120])
            out.append({"kind": "plain", "user": "carol", "at": at, "nodes": rng.choice([1, 1, 2, 3]),
                        "run_s": run_s, "limit_min": max(2, round(run_s * rng.uniform(2, 4) / 60))})
    if quick:   # one training job and two plain ones, seconds apart
        out = [out[0], {"kind": "plain", "user": "carol", "at": 2.0, "nodes": 1, "run_s": 5, "limit_min": 2},
               {"kind": "plain", "user": "carol", "at": 4.0, "nodes": 2, "run_s": 5, "limit_min": 2}]
    return sorted(out, key=lambda j: j["at"])


def write_job(d: Path, job: dict[str, Any], policy: str, name: str) -> Path:
    d.mkdir(parents=True)
    (d / "paced.py").write_text(PACED)
    lo, hi = job["nodes"]
    nodes = str(hi) if policy == "A" else f"[{lo}, {hi}]"
    text = TOML.format(name=name, limit=f"0:{job['limit_min']:02d}:00",
                       policy="predicted" if policy == "B" else "as_written", nodes=nodes, layers=LAYERS,
                       costs=", ".join([str(COST_S)] * LAYERS), cost=COST_S, steps=job["steps"])
    (d / "train.toml").write_text(text)
    return d / "train.toml"


class Poller(threading.Thread):
    """Every second, every job's state and nodes from squeue: when each started and ended, and
    which nodes it held when (for utilisation and the picture)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.time()
            out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%N"], capture_output=True,
                                 text=True, timeout=30).stdout
            for line in out.splitlines():
                jid, state, nodes = (line.split("|") + ["", ""])[:3]
                j = self.seen.setdefault(jid, {"start": None, "end": None, "state": "", "held": []})
                j["state"] = state
                if state == "RUNNING":
                    j["start"] = j["start"] or now
                    j["held"].append((now, nodes))
                elif state in ENDED and j["end"] is None:
                    j["end"] = now
            self.stop.wait(1.0)


def slurm_start_estimate(job: str) -> float | None:
    """Slurm's own start estimate for a just-submitted job (squeue's StartTime: the expected
    start of a pending job, as `squeue --start` shows it; the start of one already running)."""
    import datetime as dt
    for _ in range(6):
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%S|%T"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        when = out.partition("|")[0]
        if when and when not in ("N/A", "Unknown", "None"):
            return dt.datetime.fromisoformat(when).timestamp()
        time.sleep(0.5)
    return None


def submit(job: dict[str, Any], policy: str, i: int, tmp: Path, pswift: str, env: dict) -> dict[str, Any]:
    """Submit one arrival; what is known at its submission."""
    t0 = time.time()
    if job["kind"] == "plain":
        cmd = ["sbatch", "--parsable", "-p", "low", "--exclusive", f"-N{job['nodes']}",
               f"--time={job['limit_min']}", "-J", f"plain{i}", "-o", "/dev/null", "--wrap", f"sleep {job['run_s']}"]
        jid = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        return {"id": jid, "submit": t0, **job}
    toml = write_job(tmp / f"{policy}-{i}", job, policy, f"train{i}")
    run = tmp / f"{policy}-{i}-run"
    proc = subprocess.run([pswift, "sbatch", "--parsable", "--run-dir", str(run), str(toml)],
                          capture_output=True, text=True, env=env, timeout=180)
    if proc.returncode != 0:
        raise SystemExit(f"job {i}: pswift sbatch failed: {proc.stderr}")
    jid = proc.stdout.strip()
    pred = json.loads((run / "plan.json").read_text())["prediction"] or {}
    return {"id": jid, "submit": t0, "run": str(run), "slurm_start": slurm_start_estimate(jid),
            "pswift_start": t0 + float(pred.get("queue_s") or 0.0), **job}


def run_policy(policy: str, arrivals: list[dict[str, Any]], tmp: Path, pswift: str, timeout: float) -> dict:
    env = {**os.environ, "PSWIFT_HOME": str(tmp / f"{policy}-home"), "PSWIFT_HOST_CORES": "64",
           "PSWIFT_RANKS_PER_HOST": "1"}
    poller = Poller()
    poller.start()
    t0 = time.time()
    jobs = []
    try:
        for i, job in enumerate(arrivals):
            time.sleep(max(0.0, t0 + job["at"] - time.time()))
            jobs.append(submit(job, policy, i, tmp, pswift, env))
        deadline = time.time() + timeout
        while time.time() < deadline and not all(poller.seen.get(j["id"], {}).get("end") for j in jobs):
            time.sleep(2)
    finally:
        poller.stop.set()
        poller.join()
        subprocess.run(["scancel", *[j["id"] for j in jobs]], capture_output=True, timeout=60)
    for j in jobs:
        j.update({k: poller.seen.get(j["id"], {}).get(k) for k in ("start", "end", "state", "held")})
    return {"t0": t0, "jobs": jobs}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _waits_and_runs(jobs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(wait, run) of each job seen both starting and ending (bounded slowdown's input)."""
    return [(j["start"] - j["submit"], j["end"] - j["start"]) for j in jobs if j.get("start") and j.get("end")]


def _train_outcome(j: dict[str, Any]) -> tuple[bool, int]:
    """(completed with every step, attempts that ended at a time limit) from the run's events."""
    try:
        evs = [json.loads(x) for x in (Path(j["run"]) / "events.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return False, 0
    steps = {e["step"] for e in evs if e["event"] == "step"}
    ends = [e.get("reason") for e in evs if e["event"] == "end"]
    return (j["state"] == "COMPLETED" and steps == set(range(1, j["steps"] + 1)), ends.count("time_limit"))


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    jobs = run["jobs"]
    train = [j for j in jobs if j["kind"] == "train"]
    plain = [j for j in jobs if j["kind"] == "plain"]
    jct = [j["end"] - j["submit"] for j in train if j["end"]]
    outcomes = [_train_outcome(j) for j in train]
    ends = [j["end"] for j in jobs if j["end"]]
    makespan = max(ends) - run["t0"] if ends else None
    node_s = sum(_nodes_in(nl) for j in jobs for _, nl in j["held"] or [])   # one poll a second
    started = [j for j in train if j.get("start")]
    def err(key: str) -> list[float]:
        return [abs(j[key] - j["start"]) for j in started if j.get(key) is not None]
    return {"train_jobs": len(train), "other_jobs": len(plain), **jctstats.jct_summary(jct),
            "bsld_mean": jctstats.mean_bsld(_waits_and_runs(train)),
            "other_wait_mean_s": _mean([j["start"] - j["submit"] for j in plain if j["start"]]),
            "others_bsld_mean": jctstats.mean_bsld(_waits_and_runs(plain)),
            "makespan_s": makespan, "utilisation": node_s / (NODES * makespan) if makespan else None,
            "time_limit_requeues": sum(n for _, n in outcomes),
            "jobs_lost": sum(1 for ok, _ in outcomes if not ok) + sum(1 for j in plain if j["state"] != "COMPLETED"),
            "start_error_median_s": {"pswift": _median(err("pswift_start")), "slurm": _median(err("slurm_start"))}}


def _median(xs: list[float]) -> float | None:
    from pipeswift_slurm.stats import median
    return median(xs)


def _nodes_in(nodelist: str) -> int:
    from pipeswift_slurm.slurm.records import expand_hostlist
    return len(expand_hostlist(nodelist)) if nodelist else 0


def picture(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """Nodes x time per policy, a colour per job (training jobs hatched)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pipeswift_slurm.slurm.records import expand_hostlist
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.2 * len(runs)), sharex=True)
    cmap = plt.get_cmap("tab20")
    for ax, (policy, run) in zip(axes, runs.items()):
        for k, j in enumerate(run["jobs"]):
            for t, nl in j["held"] or []:
                for n in expand_hostlist(nl):
                    row = int("".join(c for c in n if c.isdigit()) or 1) - 1
                    ax.broken_barh([(t - run["t0"], 1.0)], (row, 0.9), color=cmap(k % 20),
                                   hatch="//" if j["kind"] == "train" else None, linewidth=0,
                                   edgecolor="black" if j["kind"] == "train" else None)   # a hatch is drawn in the edge colour
        ax.set_yticks([r + 0.45 for r in range(NODES)], [f"node{r + 1}" for r in range(NODES)])
        ax.set_title(f"({policy}) {POLICIES[policy]}", fontsize=9, loc="left")
    axes[-1].set_xlabel("seconds since the first arrival (hatched: training jobs; plain: other users' jobs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=32, help="arrivals in the trace (3 of 7 training jobs)")
    ap.add_argument("--window", type=float, default=900.0, help="seconds over which they arrive")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "workload.json"))
    ap.add_argument("--picture", default=str(ROOT / "docs" / "workload.png"))
    ap.add_argument("--quick", action="store_true", help="3 jobs within seconds (CI: the bench still runs)")
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.window = 3, 5.0
    arrivals = trace(args.seed, args.jobs, args.window, args.quick)
    pswift = shutil.which("pswift", path=str(Path(sys.executable).parent)) or "pswift"
    runs, summary = {}, {}
    with tempfile.TemporaryDirectory(prefix="pswift-bench-workload-") as tmp:
        for policy in POLICIES:
            runs[policy] = run_policy(policy, arrivals, Path(tmp), pswift, timeout=3600)
            summary[policy] = summarise(runs[policy])
            print(f"({policy}) {json.dumps(summary[policy])}", flush=True)
        if not args.quick:
            picture(runs, Path(args.picture))
    ratio = ratios(summary)
    res = {"benchmark": "workload", "jobs": args.jobs, "window_s": args.window, "seed": args.seed,
           "summary": summary, "ratios": ratio, "paired": paired(runs, args.seed),
           "runs": {p: [{k: v for k, v in j.items() if k != "held"} for j in r["jobs"]] for p, r in runs.items()}}
    benchlib.save(args.out, res, quick=args.quick,
                  what=f"{args.jobs} jobs of 3 users arriving over {args.window / 60:.0f} min on 4 nodes with "
                       f"backfill: training jobs as users submit them (A), through pswift with predicted "
                       f"limits (B) and with the limits as written (C)",
                  figures=figures(summary, ratio))


def paired(runs: dict[str, dict[str, Any]], seed: int) -> dict[str, dict]:
    """B's and C's mean JCT over A's on the training jobs both completed (jctstats.paired_ratio:
    a bootstrap over the trace's jobs; one seed here)."""
    def jcts(policy: str) -> dict:
        return {(seed, i): j["end"] - j["submit"] for i, j in enumerate(runs[policy]["jobs"])
                if j["kind"] == "train" and j["end"] and j["state"] == "COMPLETED"}
    return {f"{p}/A": jctstats.paired_ratio(jcts(p), jcts("A")) for p in ("B", "C")}


def ratios(summary: dict[str, Any]) -> dict[str, float | None]:
    a, b, c = summary["A"], summary["B"], summary["C"]
    return {"jct_mean_B_over_A": _ratio(b["jct_mean_s"], a["jct_mean_s"]),
            "jct_p90_B_over_A": _ratio(b["jct_p90_s"], a["jct_p90_s"]),
            "jct_mean_B_over_C": _ratio(b["jct_mean_s"], c["jct_mean_s"]),
            "other_wait_B_over_A": _ratio(b["other_wait_mean_s"], a["other_wait_mean_s"])}


def figures(summary: dict[str, Any], ratio: dict[str, float | None]) -> str:
    """The table row's figures: JCT, the other users' wait, jobs lost, start-time errors."""
    a, b, c = summary["A"], summary["B"], summary["C"]
    err = b["start_error_median_s"]
    return (f"training JCT mean {_fmt(a['jct_mean_s'])} (A) / {_fmt(b['jct_mean_s'])} (B) / "
            f"{_fmt(c['jct_mean_s'])} (C) s, B/A {_fmt(ratio['jct_mean_B_over_A'], 2)}; p90 B/A "
            f"{_fmt(ratio['jct_p90_B_over_A'], 2)}; other users' wait B/A "
            f"{_fmt(ratio['other_wait_B_over_A'], 2)}; lost {a['jobs_lost']}/{b['jobs_lost']}/{c['jobs_lost']}; "
            f"start-time error (B, median) pswift {_fmt(err['pswift'])} s, Slurm {_fmt(err['slurm'])} s")


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def _fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


if __name__ == "__main__":
    main()
