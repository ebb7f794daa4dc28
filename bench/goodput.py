"""Goodput benchmark: one job under a scripted fault trace on the local Slurm (real `pswift
sbatch`, real DeepSpeed on CPU), pswift against a baseline, beside the same job without faults.

The job: the tiny-gpt example on 2 nodes, ``--steps`` steps, a checkpoint every ``--interval``
steps. The trace, at fixed fractions of the steps, each half an interval past a checkpoint (the
issue's: 2 rank crashes, 1 node loss, 2 preemptions; ``--quick``: one crash):

- crash: rank 1's launcher SIGKILLed (a crash nobody announces);
- preempt: another user's exclusive job on the `high` partition takes the job's nodes for 3 s;
- node: the job's last node lost (its slurmd, step daemon and rank killed, the node marked DOWN
  as slurmctld does after SlurmdTimeout), repaired and back in the partition NODE_DOWN_S later.

Three runs, one after the other:

- fault-free: no fault (the reference time);
- pswift: the trace; a crash restarts the ranks inside the allocation (`[job] max_restarts`); a
  lost node requeues the job without that node, since `nodes = 2` has no layout for the one
  node left (a TOML with a node range goes on with the nodes left: tests/test_failures.py; on
  this 2-core host the planner runs a [1, 2] job on 1 node, where there is no rank to crash);
- baseline: the trace with `max_restarts = 0`: every crash or lost node ends the allocation and
  requeues the job, as Slurm's own `--requeue` would (and without the minutes a person takes to
  notice a FAILED job and resubmit it, so the baseline is the best case of resubmitting by hand).

goodput = fault-free time / faulty time, each `pswift sbatch` to COMPLETED seen from outside.

    scripts/with-slurm 22.05 python bench/goodput.py [--steps 2000] [--interval 50] [--quick] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACE = [(0.15, "crash"), (0.3, "preempt"), (0.45, "node"), (0.6, "crash"), (0.75, "preempt")]
QUICK_TRACE = [(0.5, "crash")]
NODE_DOWN_S = 20.0


def make_config(d: Path, steps: int, interval: int, max_restarts: int) -> Path:
    shutil.copytree(ROOT / "examples" / "tiny-gpt", d, ignore=shutil.ignore_patterns("__pycache__"))
    t = (d / "train.toml").read_text()
    for key, value in {"steps": str(steps), "checkpoint_interval": str(interval), "time": '"0:30:00"',
                       "max_requeues": "6"}.items():
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
            env: dict) -> dict:
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
        for frac, kind in trace:
            wait_step(run, fault_step(frac, steps, interval), since, deadline)
            repairs.append(fault(kind, job, run))
            since = time.time()
        while time.time() < deadline and squeue(job, "%T") not in ("COMPLETED", "FAILED", "CANCELLED", ""):
            time.sleep(0.25)
        jct = time.time() - t0
    finally:
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
            "steps_run": sum(e["event"] == "step" for e in evs), "downtime_s": downtimes(evs)}


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
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--interval", type=int, default=50, help="steps between periodic checkpoints")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "goodput.json"))
    ap.add_argument("--quick", action="store_true", help="60 steps, one crash (CI: the bench still runs)")
    args = ap.parse_args()
    trace = QUICK_TRACE if args.quick else TRACE
    if args.quick:
        args.steps, args.interval = 60, 10
    pswift = shutil.which("pswift", path=str(Path(sys.executable).parent)) or "pswift"
    runs = {}
    with tempfile.TemporaryDirectory(prefix="pswift-bench-goodput-") as tmp:
        for name, restarts, faults in (("fault_free", 3, []), ("pswift", 3, trace), ("baseline", 0, trace)):
            runs[name] = r = one_run(Path(tmp), name, args.steps, args.interval, restarts, faults, pswift,
                                     dict(os.environ))
            print(f"{name:10s} JCT {r['jct_s']:6.1f} s  launches {r['launches']}  attempts {r['attempts']}  "
                  f"restarts {r['restarts']}  steps run {r['steps_run']}  downtime per fault {r['downtime_s']} s",
                  flush=True)
    free = runs["fault_free"]["jct_s"]
    goodput = {k: free / runs[k]["jct_s"] for k in ("pswift", "baseline")}
    kinds = ", ".join(f"{k} at {f:.0%}" for f, k in trace)
    benchlib.save(args.out, {"benchmark": "goodput", "steps": args.steps, "interval": args.interval,
                             "trace": trace, "runs": runs, "goodput": goodput}, quick=args.quick,
                  what=f"goodput (fault-free time / faulty time) of a {args.steps}-step 2-node job checkpointing "
                       f"every {args.interval} steps under a fault trace ({kinds}; each half an interval past a "
                       f"checkpoint): pswift (restart in the "
                       f"allocation; a lost node requeues without it) vs a baseline that requeues on every "
                       f"fault (`max_restarts = 0`)",
                  figures=f"pswift {goodput['pswift']:.2f} ({runs['pswift']['jct_s']:.0f} s), baseline "
                          f"{goodput['baseline']:.2f} ({runs['baseline']['jct_s']:.0f} s), fault-free {free:.0f} s; "
                          f"seconds without a step per fault: pswift {fmt_list(runs['pswift']['downtime_s'])}, "
                          f"baseline {fmt_list(runs['baseline']['downtime_s'])}")


def fmt_list(xs: list[float]) -> str:
    return "[" + ", ".join(f"{x:.1f}" for x in xs) + "]"


if __name__ == "__main__":
    main()
