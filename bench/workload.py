"""Workload benchmark: the JCT of many jobs from several users on the local Slurm with its
backfill scheduler (real `pswift sbatch`, real DeepSpeed on CPU, real `sbatch` for the others),
under five policies for the training jobs, the same arrivals each time.

The arrivals: a window of a public trace (``--trace FILE``: any SWF log or the Alibaba GPU CSV,
mapped by bench/traces.py, whose docstring gives the mapping: which jobs train, their node
ranges, the limits users wrote, the high-priority tenant) or, without ``--trace``, a seeded
synthetic mix (training jobs of two users, another user's plain jobs). Plain jobs are `sbatch`
jobs that sleep their run time, exclusive, the high tenant's on the preempting `high`
partition; training jobs are pswift jobs on `low` whose steps take the job's run time at the
size it asked.

A training job's layers sleep their *true* cost (forward a third, backward two thirds), so 4
virtual nodes on a 2-core host run like 4 machines (PSWIFT_RANKS_PER_HOST=1). No oracle: the
true costs differ layer by layer (x U(0.5, 1.5)), and the `[model] layer_costs` pswift is told
are wrong by a seeded error (each layer x U(0.6, 1.5), the whole job x a host factor
U(0.8, 1.25)); the launcher measures and re-balances as in life. The policies (every job
exclusive, 1 rank per node, one stage per rank):

- (T) the size the job asked, fixed; the limit as written;
- (L) the bottom of its node range, fixed; the limit as written;
- (H) the top of its node range, fixed; the limit as written;
- (S) Slurm alone: ``--nodes=lo-hi``, the launcher laying out whatever it got (a uniform cut:
  no planner, no re-balancing, no growth); the limit as written. What an elastic launcher gives;
- (P) pswift: the node range and the planner; limits from predictions (`--time-min` with them);
- (M) P as members (issue 62): ``members`` = the range's top, one node each (a job array, each
  task scheduled and preempted alone; a range of one node stays one job). Judged against P
  (``paired`` ``M/P``): on windows whose high tenant preempts, members should lose less.
  ``--contended K`` draws such windows by a rule fixed before any run: the first ``--seeds``
  seeds whose window holds K arrivals of the high tenant that would find the cluster full with
  a training job on it (bench/traces.py ``contended``), never by how a policy fares.
  ``--until-trained`` ends a policy's run once every training job ended and every other job
  started (a trace's hour-long job would hold the bench for an hour): a plain job still running
  ends at its start plus its sleep, marked ``cut`` (a preemption after the cut goes unseen).

Per policy, over every seed: mean, p50, p90 and p99 JCT and the mean bounded slowdown of the
training jobs (submit to COMPLETED; bench/jctstats.py), the other jobs' mean wait and bounded
slowdown, node utilisation and makespan (each seed's, averaged), requeues at a time limit, the
training jobs' requeues squeue showed (a preemption or a time limit; each member's own), steps
logged out of order with no launch between (two trainings of one run side by side), training
jobs lost (not COMPLETED with every step), other users' jobs not completed (the cluster's
JobRequeue=0: a preempted plain job ends), and for (P) the start-time error of pswift's queue
estimate and of Slurm's own (`squeue --start` just after the submission) against the real
start; P's mean JCT over each other policy's on the same jobs (``paired``, a bootstrap interval
over seeds and jobs). Each seed runs the policies in a rotated order. A picture of the first
seed's schedules (nodes x time, a colour per job) goes to docs/workload.png.

What it is not: one Unix user submits every job (the trace's users are labels: no fair share),
4 nodes, not 64.

    scripts/with-slurm 22.05 python bench/workload.py [--trace FILE --window S --compression X --train-min-size N]
                                                      [--seed 1 --seeds 1 --contended K --until-trained]
                                                      [--policies T,L,H,S,P]
                                                      [--quick] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import jctstats  # noqa: E402
import workload_outcome  # noqa: E402
import traces  # noqa: E402
from pipeswift_slurm import memberfiles  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NODES = 4
POLICIES = {"T": "the size asked, fixed; limit as written",
            "L": "the bottom of the node range, fixed; limit as written",
            "H": "the top of the node range, fixed; limit as written",
            "S": "Slurm alone: --nodes=lo-hi, a uniform cut of what it got; limit as written",
            "P": "pswift: node range, planner, predicted limits",
            "M": "P as members: a job array of one-node members, each preempted alone"}
QUICK_POLICIES = "H,S,P,M"   # T and L run H's code with another fixed count
LAYERS, COST_S, MICRO_BATCHES = 8, 0.01, 4
#: a training job's start before its first step (DeepSpeed's ranks), and its fewest steps
SETUP_S, MIN_STEPS = 15.0, 10
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


def build_layers(width=16, costs=(0.01,) * 8):
    return [LayerSpec(Paced, width, cost_s) for cost_s in costs]


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
grow_check_s = {grow}
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
layer_costs = [{told}]
kwargs = {{ width = 16, costs = [{true}] }}

[training]
steps = {steps}
global_batch_size = {batch}
micro_batch_size = 4
data = "paced:batch"
seed = 1
optimizer = {{ type = "AdamW", params = {{ lr = 0.001 }} }}
checkpoint_interval = 50

[pipeline]
stages = "auto"
data_parallel = 1
{pipeline}'''


def costs(seed: int, i: int) -> tuple[list[float], list[float]]:
    """Job ``i``'s true layer costs and the ones pswift is told (seeded: the same in every
    policy): true = COST_S x U(0.5, 1.5) per layer; told = true x U(0.6, 1.5) per layer x a
    host factor U(0.8, 1.25) for the job."""
    rng = random.Random(f"costs-{seed}-{i}")
    true = [COST_S * rng.uniform(0.5, 1.5) for _ in range(LAYERS)]
    host = rng.uniform(0.8, 1.25)
    return true, [c * rng.uniform(0.6, 1.5) * host for c in true]


def step_estimate_s(true: list[float], stages: int) -> float:
    """A 1F1B step of the paced model on ``stages`` ranks, cut evenly by layer count:
    (micro-batches + stages - 1) x the slowest stage's cost per micro-batch."""
    per = math.ceil(len(true) / stages)
    slowest = max(sum(true[k:k + per]) for k in range(0, len(true), per))
    return (MICRO_BATCHES + stages - 1) * slowest


def synthetic(seed: int, jobs: int, window: float, quick: bool) -> list[dict[str, Any]]:
    """The arrivals, in time order: training jobs (user, steps, node range, the size asked,
    written limit) and plain jobs (nodes, seconds they run, written limit)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(jobs):
        at = round(rng.uniform(0, window), 1) if i else 0.0
        if quick or i % 7 in (0, 2, 4):   # 3 of 7 are training jobs
            steps = 12 if quick else rng.choice([60, 120, 200])
            lo, hi = rng.choice([(1, 2), (1, 4), (2, 4)])
            out.append({"kind": "train", "user": rng.choice(["alice", "bob"]), "high": False, "at": at,
                        "steps": steps, "nodes": (lo, hi), "asked": rng.randint(lo, hi),
                        "limit_min": rng.choice([15, 20, 30])})
        else:
            run_s = 5 if quick else rng.choice([20, 40, 60, 90, 120])
            out.append({"kind": "plain", "user": "carol", "high": False, "at": at, "nodes": rng.choice([1, 1, 2, 3]),
                        "run_s": run_s, "limit_min": max(2, round(run_s * rng.uniform(2, 4) / 60))})
    if quick:   # one training job and two plain ones, seconds apart
        out = [out[0], {"kind": "plain", "user": "carol", "high": False, "at": 2.0, "nodes": 1, "run_s": 5, "limit_min": 2},
               {"kind": "plain", "user": "carol", "high": False, "at": 4.0, "nodes": 2, "run_s": 5, "limit_min": 2}]
    return _with_costs(sorted(out, key=lambda j: j["at"]), seed)


def from_trace(path: Path, seed: int, window: float, compression: float, train_min_size: int | None
               ) -> list[dict[str, Any]]:
    """The arrivals of a trace's window (bench/traces.py's mapping): a training job's steps take
    its run time at the size it asked, after SETUP_S of start (at least MIN_STEPS)."""
    jobs, machine = traces.read_trace(path)
    out: list[dict[str, Any]] = []
    for i, w in enumerate(traces.workload(jobs, machine, NODES, window, seed, compression,
                                          train_min_size=train_min_size)):
        limit_min = max(1, math.ceil(w.limit_s / 60))
        if w.training:
            true, told = costs(seed, i)
            steps = max(MIN_STEPS, round((w.run_s - SETUP_S) / step_estimate_s(true, w.nodes_asked)))
            out.append({"kind": "train", "user": w.user, "high": w.high, "at": w.arrival_s, "steps": steps,
                        "nodes": (w.nodes_lo, w.nodes_hi), "asked": w.nodes_asked, "limit_min": limit_min,
                        "trace_job": w.job, "true_costs": true, "told_costs": told})
        else:
            out.append({"kind": "plain", "user": w.user, "high": w.high, "at": w.arrival_s, "nodes": w.nodes_asked,
                        "run_s": round(w.run_s, 1), "limit_min": limit_min, "trace_job": w.job})
    return out


def _with_costs(arrivals: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The synthetic mix's training jobs with their true costs and the ones pswift is told."""
    for i, job in enumerate(arrivals):
        if job["kind"] == "train":
            job["true_costs"], job["told_costs"] = costs(seed, i)
    return arrivals


def write_job(d: Path, job: dict[str, Any], policy: str, name: str) -> Path:
    d.mkdir(parents=True)
    (d / "paced.py").write_text(PACED)
    lo, hi = job["nodes"]
    fixed = {"T": job["asked"], "L": lo, "H": hi}.get(policy)
    nodes = str(fixed) if fixed is not None else str(lo) if lo == hi else f"[{lo}, {hi}]"
    if policy == "M" and hi > 1:
        nodes += f"\nmembers = {hi}\nmember_nodes = 1"
    elastic_only = policy == "S"     # no planner (a uniform cut), no re-balancing, no growth
    text = TOML.format(name=name, limit=f"{job['limit_min'] // 60}:{job['limit_min'] % 60:02d}:00",
                       policy="predicted" if policy in ("P", "M") else "as_written", nodes=nodes, layers=LAYERS,
                       told=", ".join(f"{c:.6g}" for c in job["told_costs"]),
                       true=", ".join(f"{c:.6g}" for c in job["true_costs"]), steps=job["steps"],
                       batch=4 * MICRO_BATCHES, grow=0 if elastic_only else 60,
                       pipeline='partition = "uniform"\nrebalance = false\n' if elastic_only else "")
    (d / "train.toml").write_text(text)
    return d / "train.toml"


class Poller(threading.Thread):
    """Every second, every job's state and nodes from squeue: when each first started and last
    ended, and which nodes it held when (for utilisation and the picture). A job array's tasks
    (``ID_TASK``) are seen apart; :meth:`job` makes one job of them."""

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
                j = self.seen.setdefault(jid, {"start": None, "end": None, "state": "", "held": [], "requeues": 0})
                j["requeues"] += j["state"] in ("RUNNING", "COMPLETING") and state in ("PENDING", "REQUEUED",
                                                                                     "PREEMPTED", "REQUEUE_HOLD")
                j["state"] = state
                if state == "RUNNING":
                    j["start"] = j["start"] or now
                    j["held"].append((now, nodes))
                if state not in ENDED:      # a job preempted and requeued has not ended
                    j["end"] = None
                elif j["end"] is None:
                    j["end"] = now
            self.stop.wait(1.0)

    def job(self, jid: str) -> dict[str, Any]:
        """Job ``jid`` as seen, or its array's tasks as one job: started at the first task's
        start, ended when every task ended (at the last end), COMPLETED when every task was,
        every task's nodes held. An array's pending rest (``ID_[1-3]``) is not a task."""
        tasks = [j for k, j in self.seen.items() if k.startswith(f"{jid}_") and "[" not in k]
        if not tasks:
            return {**self.seen.get(jid, {}), "tasks": 1}
        starts, ends = [t["start"] for t in tasks if t["start"]], [t["end"] for t in tasks]
        states = {t["state"] for t in tasks}
        return {"start": min(starts) if starts else None, "end": None if None in ends else max(ends),
                "state": states.pop() if len(states) == 1 else next(iter(states - {"COMPLETED"})),
                "held": [h for t in tasks for h in t["held"]], "requeues": sum(t["requeues"] for t in tasks),
                "tasks": len(tasks)}


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
    """Submit one arrival; what is known at its submission (P: pswift's start estimate and Slurm's)."""
    t0 = time.time()
    if job["kind"] == "plain":
        cmd = ["sbatch", "--parsable", "-p", "high" if job["high"] else "low", "--exclusive", f"-N{job['nodes']}",
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
    known: dict[str, Any] = {}
    if policy == "P":
        pred = json.loads((run / "plan.json").read_text())["prediction"] or {}
        known = {"slurm_start": slurm_start_estimate(jid), "pswift_start": t0 + float(pred.get("queue_s") or 0.0)}
    return {"id": jid, "submit": t0, "run": str(run), **known, **job}


def settled(jobs: list[dict[str, Any]], seen: Callable[[str], dict[str, Any]], until_trained: bool) -> bool:
    """Whether a policy's run is over: every job ended; with ``until_trained``, every training
    job ended and every other job started or ended (one that slept under the poll's second is
    seen ended, never running; a plain job's end is its start + its run time: :func:`cut_short`)."""
    if not until_trained:
        return all(seen(j["id"]).get("end") for j in jobs)
    return all(seen(j["id"]).get("end") if j["kind"] == "train" else
               seen(j["id"]).get("start") or seen(j["id"]).get("end") for j in jobs)


def cut_short(j: dict[str, Any]) -> None:
    """A plain job still running when its run was cut (``--until-trained``): it ends at its start
    plus the seconds it sleeps (a preemption after the cut is not seen: ``cut`` marks it)."""
    if j["kind"] == "plain" and j.get("start") and not j.get("end") and j.get("state") in ("RUNNING", "CANCELLED"):
        j.update(end=j["start"] + float(j["run_s"]), state="COMPLETED", cut=True)


def run_policy(policy: str, arrivals: list[dict[str, Any]], tmp: Path, pswift: str, timeout: float,
               until_trained: bool = False) -> dict:
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
        while time.time() < deadline and not settled(jobs, poller.job, until_trained):
            time.sleep(2)
        running = {j["id"] for j in jobs if poller.job(j["id"]).get("state") == "RUNNING"}
    finally:
        poller.stop.set()
        poller.join()
        subprocess.run(["scancel", *[j["id"] for j in jobs]], capture_output=True, timeout=60)
    for j in jobs:
        j.update({k: poller.job(j["id"]).get(k) for k in ("start", "end", "state", "held", "requeues", "tasks")})
        if j["kind"] == "train" and j.get("state") == "CANCELLED" and memberfiles.finished(Path(j["run"])):
            # a run of members that trained every step cancels its members still queued, the array's
            # own task among them: the run completed, as `pswift status` reads it (reports.watch)
            j["state"] = "COMPLETED"
        if until_trained and j["id"] in running:
            cut_short(j)
    return {"t0": t0, "jobs": jobs}


def picture(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """Nodes x time per policy, a colour per job (training jobs hatched)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pipeswift_slurm.slurm.records import expand_hostlist
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.2 * len(runs)), sharex=True, squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, (policy, run) in zip(axes[:, 0], runs.items()):
        for k, j in enumerate(run["jobs"]):
            for t, nl in j["held"] or []:
                for n in expand_hostlist(nl):
                    row = int("".join(c for c in n if c.isdigit()) or 1) - 1
                    ax.broken_barh([(t - run["t0"], 1.0)], (row, 0.9), color=cmap(k % 20),
                                   hatch="//" if j["kind"] == "train" else None, linewidth=0,
                                   edgecolor="black" if j["kind"] == "train" else None)   # a hatch is drawn in the edge colour
        ax.set_yticks([r + 0.45 for r in range(NODES)], [f"node{r + 1}" for r in range(NODES)])
        ax.set_title(f"({policy}) {POLICIES[policy]}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the first arrival (hatched: training jobs; plain: other users' jobs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, help="an SWF log or the Alibaba GPU CSV (default: the synthetic mix)")
    ap.add_argument("--window", type=float, help="seconds of arrivals: of the trace (default 3600) or "
                                                  "of the synthetic mix (default 900)")
    ap.add_argument("--compression", type=float, default=6.0, help="trace seconds per benchmark second")
    ap.add_argument("--train-min-size", type=int, default=16,
                    help="a trace job this large (processors, GPUs) trains (bench/traces.py)")
    ap.add_argument("--jobs", type=int, default=32, help="synthetic: arrivals (3 of 7 training jobs)")
    ap.add_argument("--seed", type=int, default=1, help="the first seed (the trace's window, the costs' errors)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds, from --seed on; the policies' order rotates")
    ap.add_argument("--contended", type=int, default=0,
                    help="trace: only windows where at least this many of the high tenant's arrivals would preempt "
                         "a training job (bench/traces.py contended); the first --seeds such seeds from --seed on")
    ap.add_argument("--until-trained", action="store_true",
                    help="a policy's run ends once every training job ended and every other job started; a plain "
                         "job still running ends at its start + its run time (it only sleeps), marked cut")
    ap.add_argument("--policies", default="T,L,H,S,P", help="of T, L, H, S, P, M, comma-separated (P required)")
    ap.add_argument("--out")
    ap.add_argument("--picture", default=str(ROOT / "docs" / "workload.png"))
    ap.add_argument("--quick", action="store_true",
                    help=f"synthetic, 3 jobs within seconds, policies {QUICK_POLICIES} (CI: the bench still runs)")
    args = ap.parse_args()
    if args.quick:
        args.trace, args.jobs, args.window, args.seeds, args.policies = None, 3, 5.0, 1, QUICK_POLICIES
    args.policies = [p for p in args.policies.split(",") if p]
    if "P" not in args.policies or set(args.policies) - set(POLICIES):
        ap.error(f"--policies {','.join(args.policies)}: name P and any of {', '.join(POLICIES)}, comma-separated")
    if args.window is None:
        args.window = 3600.0 if args.trace else 900.0
    name = f"workload-{args.trace.name.split('.')[0]}.json" if args.trace else "workload.json"
    args.out = args.out or str(ROOT / "bench" / "results" / name)
    return args


def draw_seeds(args: argparse.Namespace, tries: int = 10_000) -> list[int]:
    """``--seeds`` seeds from ``--seed`` on; with ``--contended K``, the first ones whose trace
    window holds K arrivals of the high tenant that would preempt a training job."""
    if not args.contended:
        return list(range(args.seed, args.seed + args.seeds))
    if not args.trace:
        raise SystemExit("workload: --contended reads a trace's windows: give --trace")
    jobs, machine = traces.read_trace(args.trace)
    out: list[int] = []
    for seed in range(args.seed, args.seed + tries):
        window = traces.workload(jobs, machine, NODES, args.window, seed, args.compression,
                                 train_min_size=args.train_min_size)
        if traces.contended(window, NODES) >= args.contended:
            out.append(seed)
            if len(out) == args.seeds:
                return out
    raise SystemExit(f"workload: fewer than {args.seeds} of {tries} windows hold {args.contended} contended arrivals")


def arrivals_of(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    if args.trace:
        return from_trace(args.trace, seed, args.window, args.compression, args.train_min_size)
    return synthetic(seed, args.jobs, args.window, args.quick)


def main() -> None:
    args = arguments()
    pswift = shutil.which("pswift", path=str(Path(sys.executable).parent)) or "pswift"
    seeds = draw_seeds(args)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in args.policies}
    try:
        windows = {seed: arrivals_of(args, seed) for seed in seeds}
    except (OSError, traces.TraceError, ValueError) as e:
        raise SystemExit(f"workload: {e}") from None
    with tempfile.TemporaryDirectory(prefix="pswift-bench-workload-") as tmp:
        for n, seed in enumerate(seeds):
            order = args.policies[n % len(args.policies):] + args.policies[:n % len(args.policies)]
            for policy in order:
                got = run_policy(policy, windows[seed], Path(tmp) / f"s{seed}", pswift, timeout=3600,
                                 until_trained=args.until_trained)
                runs[policy].append({**got, "seed": seed})
                print(f"seed {seed} ({policy}) {json.dumps(workload_outcome.summarise([got], NODES))}", flush=True)
            # every seed's result written as it ends (the runs' events are read before they go): a
            # run of many seeds stopped part-way keeps the seeds it finished, said in `seeds`
            save_result(args, {s: windows[s] for s in seeds[:n + 1]}, runs)
    if not args.quick:
        picture({p: runs[p][0] for p in args.policies}, Path(args.picture))


def save_result(args: argparse.Namespace, windows: dict[int, list], runs: dict[str, list[dict[str, Any]]]) -> None:
    """bench/results' file for the seeds in ``windows`` (those every policy has run)."""
    summary = {p: workload_outcome.summarise(runs[p], NODES) for p in args.policies}
    source = str(args.trace.name) if args.trace else "synthetic"
    res = {"benchmark": "workload", "source": source, "seeds": list(windows), "policies": args.policies,
           "window_s": args.window, "compression": args.compression if args.trace else None,
           "train_min_size": args.train_min_size if args.trace else None,
           "contended": args.contended, "until_trained": args.until_trained,
           "jobs_per_seed": {s: len(w) for s, w in windows.items()},
           "summary": summary, "paired": paired(runs), "per_seed": per_seed(runs),
           "runs": {p: [{**{k: v for k, v in r.items() if k != "jobs"},
                         "jobs": [{k: v for k, v in j.items() if k != "held"} for j in r["jobs"]]} for r in rs]
                    for p, rs in runs.items()}}
    benchlib.save(args.out, res, quick=args.quick, what=what(args, source, windows),
                  figures=figures(summary, res["paired"], res["per_seed"]))


def what(args: argparse.Namespace, source: str, windows: dict[int, list]) -> str:
    train = sum(j["kind"] == "train" for w in windows.values() for j in w)
    jobs = sum(len(w) for w in windows.values())
    told = (f"{args.window:.0f} s windows of {source} compressed {args.compression:g}x" if args.trace
            else f"a synthetic mix over {args.window / 60:.0f} min")
    return (f"{jobs} jobs ({train} training) in {len(windows)} seed(s), {told}, on 4 nodes with backfill; "
            f"training jobs' costs told to pswift wrong by a seeded error; policies "
            + ", ".join(f"({p}) {POLICIES[p]}" for p in args.policies))


def paired(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict]:
    """P's mean JCT over each other policy's (M's over P's) on the training jobs both completed,
    keyed by (seed, job): jctstats.paired_ratio, a bootstrap over seeds, then jobs."""
    def jcts(policy: str) -> dict:
        return {(r["seed"], i): j["end"] - j["submit"] for r in runs[policy] for i, j in enumerate(r["jobs"])
                if j["kind"] == "train" and j["end"] and j["state"] == "COMPLETED"}
    pairs = [("P", p) if p != "M" else ("M", "P") for p in runs if p != "P"]
    return {f"{a}/{b}": jctstats.paired_ratio(jcts(a), jcts(b)) for a, b in pairs}


def per_seed(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict]:
    """Each seed's own summary and paired ratios, where there are several seeds (a pooled figure
    can hide a window that goes the other way)."""
    seeds = sorted({r["seed"] for rs in runs.values() for r in rs})
    out: dict[str, dict] = {}
    for seed in seeds if len(seeds) > 1 else ():
        mine = {p: [r for r in rs if r["seed"] == seed] for p, rs in runs.items()}
        if all(mine.values()):
            out[str(seed)] = {"summary": {p: workload_outcome.summarise(v, NODES) for p, v in mine.items()},
                              "paired": paired(mine)}
    return out


def figures(summary: dict[str, Any], pair: dict[str, dict], seeds: dict[str, dict] | None = None) -> str:
    """The table row's figures: P's JCT against each policy, others' slowdown, lost, start errors;
    with several seeds, each one's paired ratios too."""
    p = summary["P"]
    err = p["start_error_median_s"]
    ratios = "; ".join(f"{k} {_fmt(v.get('ratio'), 2)} ({_fmt(v.get('lo'), 2)}–{_fmt(v.get('hi'), 2)})"
                       for k, v in pair.items())
    means = " / ".join(f"{_fmt(s['jct_mean_s'])} ({k})" for k, s in summary.items())
    p90 = " / ".join(f"{_fmt(s['jct_p90_s'])} ({k})" for k, s in summary.items())
    others = " / ".join(f"{_fmt(s['others_bsld_mean'], 2)} ({k})" for k, s in summary.items())
    return (f"training JCT mean {means} s; p90 {p90} s; paired mean JCT {ratios}; other users' bounded "
            f"slowdown {others}; training goodput "
            + " / ".join(f"{_fmt(s.get('goodput'), 2)} ({k})" for k, s in summary.items())
            + "; training jobs lost " + "/".join(str(s["lost"]) for s in summary.values())
            + "; other users' jobs not completed (a preemption ends them) "
            + "/".join(str(s.get("others_not_completed", "n/a")) for s in summary.values())
            + f"; start-time error (P, median) pswift {_fmt(err['pswift'])} s, Slurm {_fmt(err['slurm'])} s"
            + "".join(f"; seed {s}: " + ", ".join(f"{k} {_fmt(v.get('ratio'), 2)} ({_fmt(v.get('lo'), 2)}–"
                                                   f"{_fmt(v.get('hi'), 2)})" for k, v in one["paired"].items())
                      for s, one in (seeds or {}).items()))


def _fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


if __name__ == "__main__":
    main()
