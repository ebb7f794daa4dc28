"""Goodput benchmark: one job under a scripted fault trace on the local Slurm (real `pswift
sbatch`, real DeepSpeed on CPU), pswift against a baseline, beside the same job without faults.

The job: the tiny-gpt example on 2 nodes, ``--steps`` steps, a checkpoint every ``--interval``
steps. The trace, at fixed fractions of the steps, each half an interval past a checkpoint (the
issue's: 2 rank crashes, 1 node loss, 2 preemptions; ``--quick``: one crash):

- crash: rank 1's launcher SIGKILLed (a crash nobody announces);
- preempt: another user's exclusive job on the `high` partition takes the job's nodes for 3 s;
- node: the job's last node lost (its slurmd, step daemon and rank killed, the node marked DOWN
  as slurmctld does after SlurmdTimeout), repaired and back in the partition NODE_DOWN_S later.

Three configurations, ``--rounds`` times each in a rotated order:

- fault-free: no fault (the reference time);
- pswift: the trace; a crash restarts the ranks inside the allocation (`[job] max_restarts`); a
  lost node requeues the job without that node, since `nodes = 2` has no layout for the one
  node left (a TOML with a node range goes on with the nodes left: tests/test_failures.py; on
  this 2-core host the planner runs a [1, 2] job on 1 node, where there is no rank to crash);
- baseline: the trace with `max_restarts = 0`: every crash or lost node ends the allocation and
  requeues the job, as Slurm's own `--requeue` would (and without the minutes a person takes to
  notice a FAILED job and resubmit it, so the baseline is the best case of resubmitting by hand).

goodput = fault-free time / faulty time of the same round, each `pswift sbatch` to COMPLETED
seen from outside. The ratio of pswift's median goodput to the baseline's comes with the 90 %
bootstrap interval of its rounds (resampled as pairs).

The queue (``--queue``): ``busy`` (the default) as at a site: once the job trains, another
user's jobs (2 nodes each, exclusive, ``sleep`` a seeded U(OTHER_RUN_S) seconds) hold the rest
of the partition with OTHER_BACKLOG more of them pending at all times, in every configuration.
A job that leaves its nodes (a requeue) finds them taken by the next of those while it is not
yet eligible again (Slurm's requeue delay), and waits for one of them to end, as a requeue waits
at a site; priority/basic keeps its place ahead of jobs submitted after it. The other user is a
job name, not a Unix user (one Unix user submits everything; no fair share). ``idle``: nothing
else runs, a requeue starts at once (the rows before 2026-12-06).

    scripts/with-slurm 22.05 python bench/goodput.py [--steps 600] [--interval 50] [--rounds 3] [--queue busy|idle] [--quick] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import statistics
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACE = [(0.15, "crash"), (0.3, "preempt"), (0.45, "node"), (0.6, "crash"), (0.75, "preempt")]
QUICK_TRACE = [(0.5, "crash")]
NODE_DOWN_S = 20.0
#: the other user's jobs on a busy queue: their job name, how many are pending at all times,
#: the seconds each runs (uniform), and in --quick
OTHER_NAME = "goodput-other-user"
OTHER_BACKLOG = 2
OTHER_RUN_S = (20.0, 60.0)
QUICK_OTHER_RUN_S = (5.0, 10.0)
CONFIGS = (("fault_free", 3, False), ("pswift", 3, True), ("baseline", 0, True))


class OtherUser:
    """Another user's jobs on the partition: OTHER_BACKLOG of them pending at all times (2 nodes
    each, exclusive), each running a seeded draw from ``run_s``, until stop() cancels them all."""

    def __init__(self, seed: int, run_s: tuple[float, float]) -> None:
        self.rng, self.run_s, self.submitted = random.Random(seed), run_s, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._feed, daemon=True)

    def start(self) -> "OtherUser":
        self.thread.start()
        return self

    def _feed(self) -> None:
        while not self.done.is_set():
            pending = subprocess.run(["squeue", "-h", "-n", OTHER_NAME, "-t", "PD", "-o", "%i"], capture_output=True,
                                     text=True, timeout=30).stdout.split()
            for _ in range(OTHER_BACKLOG - len(pending)):
                run_s = self.rng.uniform(*self.run_s)
                subprocess.run(["sbatch", "--parsable", "-p", "low", "-N", "2", "--exclusive", "-J", OTHER_NAME,
                                "--time=5", "-o", "/dev/null", "--wrap", f"sleep {run_s:.1f}"],
                               capture_output=True, text=True, check=True, timeout=30)
                self.submitted += 1
            self.done.wait(0.5)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        subprocess.run(["scancel", "-n", OTHER_NAME], capture_output=True, timeout=30)
        while subprocess.run(["squeue", "-h", "-n", OTHER_NAME, "-o", "%i"], capture_output=True, text=True,
                             timeout=30).stdout.strip():
            time.sleep(0.25)     # the next run starts on an empty partition
        return self.submitted


def make_config(d: Path, steps: int, interval: int, max_restarts: int) -> Path:
    shutil.copytree(ROOT / "examples" / "tiny-gpt", d, ignore=shutil.ignore_patterns("__pycache__"))
    t = (d / "train.toml").read_text()
    # the limit as written: a limit predicted from the example's costs (not this host's) would
    # requeue the fault-free run too (the limit's prediction is bench/workload.py's to judge)
    for key, value in {"steps": str(steps), "checkpoint_interval": str(interval), "time": '"0:30:00"',
                       "time_policy": '"as_written"', "max_requeues": "6"}.items():
        t = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", t, count=1)
    t = t.replace("[job]\n", f"[job]\nmax_restarts = {max_restarts}\n", 1)
    (d / "train.toml").write_text(t)
    return d / "train.toml"


def squeue(job: str, fmt: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", fmt], capture_output=True,
                          text=True, timeout=30).stdout.strip()


def events(run: Path) -> list[dict]:
    try:
        lines = (run / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def rank_pid(run: Path, rank: int) -> int | None:
    plan = str(run / "plan.json").encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if b"pipeswift_launch" not in cmd or plan not in cmd:
                continue
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"SLURM_PROCID={rank}".encode() in env:
            return int(pid)
    return None


def wait_step(run: Path, step: int, since: float, deadline: float) -> None:
    """Until a step >= ``step`` was logged after ``since`` and its rank 1 is running."""
    while time.time() < deadline:
        if any(e.get("event") == "step" and e["step"] >= step and e["time"] >= since for e in events(run)):
            return
        time.sleep(0.1)
    raise SystemExit(f"step {step} not reached in {run}")


def rank_node(pid: int) -> str:
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return next(x.split(b"=", 1)[1].decode() for x in env if x.startswith(b"SLURMD_NODENAME="))


def lose_node(run: Path) -> threading.Thread:
    """The node of the job's last rank lost; a thread that repairs it NODE_DOWN_S later."""
    world = max((e.get("world_size", 1) for e in events(run) if e.get("event") == "start"), default=1)
    pid = rank_pid(run, world - 1)
    if pid is None:
        raise SystemExit(f"no rank {world - 1} in {run}")
    node = rank_node(pid)
    stepd = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    conf = Path(os.environ["SLURM_CONF"])
    slurmd = int((conf.parent.parent / "run" / f"slurmd-{node}.pid").read_text())
    for p in (slurmd, stepd, pid):
        os.kill(p, signal.SIGKILL)
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=goodput bench: node lost"],
                   check=True, timeout=30)
    repair = threading.Thread(target=bring_back, args=(node, NODE_DOWN_S), daemon=True)
    repair.start()
    return repair


def bring_back(node: str, after_s: float) -> None:
    time.sleep(after_s)
    subprocess.run(["slurmd", "-f", os.environ["SLURM_CONF"], "-N", node], check=True, timeout=60)
    for _ in range(90):
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True, timeout=30)
        if subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True,
                          timeout=30).stdout.strip() in ("idle", "alloc", "mix"):
            return
        time.sleep(1)


def fault(kind: str, job: str, run: Path) -> threading.Thread | None:
    if kind == "crash":
        pid = rank_pid(run, 1)
        if pid is None:
            raise SystemExit(f"no rank 1 to kill in {run}")
        os.kill(pid, signal.SIGKILL)
        return None
    if kind == "node":
        return lose_node(run)
    nodes = squeue(job, "%N")
    subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", nodes, "--exclusive", "--time=5",
                    "-o", "/dev/null", "--wrap", "sleep 3"], capture_output=True, text=True, check=True)
    return None


def fault_step(frac: float, steps: int, interval: int) -> int:
    """The step a fault of the trace waits for: half an interval past a checkpoint step, the
    work a fault at a random time loses on average (the trace's fractions of 2,000 steps are
    multiples of 50: a crash there, as the checkpoint of that step is being written, would
    lose the whole interval every time)."""
    return int(frac * steps) // interval * interval + interval // 2


def one_run(tmp: Path, name: str, steps: int, interval: int, max_restarts: int, trace: list, pswift: str,
            env: dict, other: OtherUser | None = None) -> dict:
    toml = make_config(tmp / f"{name}-ex", steps, interval, max_restarts)
    run = tmp / f"{name}-run"
    t0 = time.time()
    proc = subprocess.run([pswift, "sbatch", "--parsable", "--run-dir", str(run), str(toml)],
                          capture_output=True, text=True, env={**env, "PSWIFT_HOME": str(tmp / f"{name}-home")},
                          timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: pswift sbatch failed: {proc.stderr}")
    job = proc.stdout.strip()
    deadline, since = t0 + 1800, t0
    repairs = []
    try:
        if other is not None:     # the other user's jobs fill the partition once the job trains
            wait_step(run, 1, since, deadline)
            other.start()
        for frac, kind in trace:
            wait_step(run, fault_step(frac, steps, interval), since, deadline)
            repairs.append(fault(kind, job, run))
            since = time.time()
        while time.time() < deadline and squeue(job, "%T") not in ("COMPLETED", "FAILED", "CANCELLED", ""):
            time.sleep(0.25)
        jct = time.time() - t0
    finally:
        others = other.stop() if other is not None else 0
        for r in repairs:
            if r is not None:
                r.join()        # the lost node is back before the next run or the next test
    got = squeue(job, "%T")
    if got != "COMPLETED":
        raise SystemExit(f"{name}: job {job} ended {got or 'GONE'}; see {run}")
    evs = events(run)
    return {"jct_s": jct, "launches": sum(e["event"] == "start" for e in evs),
            "restarts": sum(e["event"] == "crash" and e.get("action") == "restart" for e in evs),
            "attempts": len({e["attempt"] for e in evs if e["event"] == "start"}),
            "steps_run": sum(e["event"] == "step" for e in evs), "downtime_s": downtimes(evs),
            "other_jobs": others}


def downtimes(evs: list[dict]) -> list[float]:
    """Seconds from the last step before each relaunch to the first step after it: what a fault
    costs beside the steps it loses (detection, Slurm's requeue, the ranks' set-up)."""
    out, last, waiting = [], None, False
    for e in evs:
        if e["event"] == "start" and last is not None:
            waiting = True
        elif e["event"] == "step":
            if waiting:
                out.append(round(e["time"] - last, 2))
                waiting = False
            last = e["time"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--interval", type=int, default=50, help="steps between periodic checkpoints")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each configuration, in a rotated order")
    ap.add_argument("--queue", choices=("busy", "idle"), default="busy",
                    help="busy: another user's jobs hold the rest of the partition, with a backlog")
    ap.add_argument("--seed", type=int, default=1, help="the other user's run times")
    ap.add_argument("--out", default=None, help="default bench/results/goodput[-idle].json")
    ap.add_argument("--quick", action="store_true", help="60 steps, one crash, one round (CI: the bench still runs)")
    args = ap.parse_args()
    trace = QUICK_TRACE if args.quick else TRACE
    if args.quick:
        args.steps, args.interval, args.rounds = 60, 10, 1
    out = args.out or str(ROOT / "bench" / "results" / f"goodput{'' if args.queue == 'busy' else '-idle'}.json")
    runs = measure(args, trace)
    summary = summarise(runs)
    kinds = ", ".join(f"{k} at {f:.0%}" for f, k in trace)
    queue = (f"a busy queue (another user's 2-node jobs of {OTHER_RUN_S[0]:.0f}-{OTHER_RUN_S[1]:.0f} s hold the "
             f"other nodes, {OTHER_BACKLOG} more pending)" if args.queue == "busy" else "an idle queue")
    g, jr = summary["goodput"], summary["ratios"]
    benchlib.save(out, {"benchmark": "goodput", "steps": args.steps, "interval": args.interval, "queue": args.queue,
                        "rounds": args.rounds, "seed": args.seed, "trace": trace, "runs": runs, **summary},
                  quick=args.quick,
                  what=f"goodput (fault-free time / faulty time) of a {args.steps}-step 2-node job checkpointing "
                       f"every {args.interval} steps under a fault trace ({kinds}; each half an interval past a "
                       f"checkpoint) on {queue}: pswift (restart in the allocation; a lost node requeues without "
                       f"it) vs a baseline that requeues on every fault (`max_restarts = 0`)",
                  figures=f"medians of {args.rounds} rotated round(s), 90 % intervals: pswift {g['pswift']:.2f} "
                          f"({summary['jct_median_s']['pswift']:.0f} s), baseline {g['baseline']:.2f} "
                          f"({summary['jct_median_s']['baseline']:.0f} s), fault-free "
                          f"{summary['jct_median_s']['fault_free']:.0f} s; pswift's goodput "
                          f"{fmt_ratio(jr['goodput pswift/baseline'])} the baseline's, its JCT "
                          f"{fmt_ratio(jr['jct pswift/baseline'])}; seconds without a step per fault (median "
                          f"round): pswift {fmt_list(summary['downtime_s']['pswift'])}, baseline "
                          f"{fmt_list(summary['downtime_s']['baseline'])}")


def measure(args: argparse.Namespace, trace: list) -> dict[str, list[dict]]:
    """Every configuration ``args.rounds`` times, round r starting with the r-th (rotated)."""
    pswift = shutil.which("pswift", path=str(Path(sys.executable).parent)) or "pswift"
    run_s = QUICK_OTHER_RUN_S if args.quick else OTHER_RUN_S
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="pswift-bench-goodput-") as tmp:
        for r in range(args.rounds):
            for name, restarts, faulty in CONFIGS[r % 3:] + CONFIGS[:r % 3]:
                other = OtherUser(args.seed * 1000 + r, run_s) if args.queue == "busy" else None
                res = one_run(Path(tmp) / f"r{r}", name, args.steps, args.interval, restarts,
                              trace if faulty else [], pswift, dict(os.environ), other)
                runs[name].append(res)
                print(f"round {r} {name:10s} JCT {res['jct_s']:6.1f} s  launches {res['launches']}  attempts "
                      f"{res['attempts']}  restarts {res['restarts']}  steps run {res['steps_run']}  downtime "
                      f"per fault {res['downtime_s']} s  other jobs {res['other_jobs']}", flush=True)
    return runs


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Goodput per round (that round's fault-free time over the faulty one), the medians, and the
    paired ratios of pswift to the baseline with their bootstrap intervals."""
    free = [r["jct_s"] for r in runs["fault_free"]]
    jct = {k: [r["jct_s"] for r in v] for k, v in runs.items()}
    per_round = {k: [f / j for f, j in zip(free, jct[k])] for k in ("pswift", "baseline")}
    ratios = {}
    for label, xs, ys in (("goodput pswift/baseline", per_round["pswift"], per_round["baseline"]),
                          ("jct pswift/baseline", jct["pswift"], jct["baseline"])):
        lo, hi = benchlib.ratio_of_medians_interval(xs, ys)
        ratios[label] = {"ratio": statistics.median(xs) / statistics.median(ys), "lo": lo, "hi": hi}
    mid = {k: sorted(v, key=lambda r: r["jct_s"])[(len(v) - 1) // 2] for k, v in runs.items()}
    return {"goodput": {k: statistics.median(v) for k, v in per_round.items()}, "goodput_per_round": per_round,
            "jct_median_s": {k: statistics.median(v) for k, v in jct.items()}, "ratios": ratios,
            "downtime_s": {k: mid[k]["downtime_s"] for k in ("pswift", "baseline")}}


def fmt_ratio(r: dict) -> str:
    interval = f" ({r['lo']:.2f}–{r['hi']:.2f})" if r["lo"] is not None else ""
    return f"{r['ratio']:.2f}×{interval}"


def fmt_list(xs: list[float]) -> str:
    return "[" + ", ".join(f"{x:.1f}" for x in xs) + "]"


if __name__ == "__main__":
    main()
