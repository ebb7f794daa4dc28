"""Members benchmark (issue 62): the seconds a run trains no step when a member is preempted,
against an in-allocation restart of the same job, on the local Slurm (real `pswift sbatch`, real
DeepSpeed on CPU).

The job: the tiny-gpt example on 2 nodes, ``--steps`` steps, a checkpoint every ``--interval``,
each fault half an interval past a checkpoint (as bench/goodput.py's trace). Two configurations,
``--rounds`` times each, alternated:

- members: ``[resources] members = 2`` (one node each, `--exclusive`); a higher-priority job on
  the `high` partition takes member 1's node for HOLD_S seconds. Every rank stops at a step
  boundary with a stage-consistent checkpoint; member 0 trains on alone (1 stage) in its own
  allocation; member 1 is requeued (a run with steps left when it comes back grows back to it:
  a second relaunch, in the run's ``downtime_s``, not in the figure).
- restart: the same job as one 2-node job; rank 1's launcher is SIGKILLed (a crash nobody
  announces) and the launcher starts the ranks again inside the allocation from the newest
  checkpoint (`[job] max_restarts`): pswift's in-allocation restart.

The figure is the issue's: seconds without a step per change, from the last step before the
relaunch to the first step after it (bench/goodput.py's ``downtimes``: detection, the stop's
checkpoint or none, the ranks' set-up, the checkpoint's load), members' first relaunch against
the restart's; the ratio of their medians with a 90 % bootstrap interval over rounds (pairs).
The issue asks for at most 2x. What it is not: the steps a crash loses (the restart re-runs the
steps since its checkpoint; the preempted member loses none) are not in the figure.

    scripts/with-slurm 22.05 python bench/members.py [--steps 200] [--interval 50] [--rounds 4] [--quick] [--out ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import goodput  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOLD_S = 10
CONFIGS = ("members", "restart")


def make_config(d: Path, config: str, steps: int, interval: int) -> Path:
    """The goodput bench's job (tiny-gpt, the limit as written); as members, a range of two
    one-node members on nodes of their own."""
    toml = goodput.make_config(d, steps, interval, max_restarts=3)
    if config == "members":
        t = toml.read_text().replace("nodes = 2 ", "nodes = [1, 2] ", 1)
        t = t.replace("[resources]\n", "[resources]\nmembers = 2\nmember_wait_s = 60\n", 1)
        toml.write_text(t.replace("[job]\n", '[job]\nsbatch_options = ["--exclusive"]\n', 1))
    return toml


def member_node(array: str, task: int) -> str:
    """The node array task ``task`` runs on ('' while it does not run)."""
    out = subprocess.run(["squeue", "-h", "-t", "R", "-j", array, "-o", "%K %N"], capture_output=True, text=True,
                         timeout=30).stdout.split("\n")
    return next((line.split()[1] for line in out if line.split()[:1] == [str(task)]), "")


def fault(config: str, job: str, run: Path) -> str | None:
    """Members: preempt member 1 (returns the preemptor's job id); restart: kill rank 1."""
    if config == "restart":
        pid = goodput.rank_pid(run, 1)
        if pid is None:
            raise SystemExit(f"no rank 1 to kill in {run}")
        os.kill(pid, signal.SIGKILL)
        return None
    node = member_node(job, 1)
    if not node:
        raise SystemExit(f"member 1 of {job} is not running")
    return subprocess.run(["sbatch", "--parsable", "-p", "high", "-N1", "--exclusive", f"--nodelist={node}",
                           "-o", "/dev/null", "--wrap", f"sleep {HOLD_S}"],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def ended(job: str) -> bool:
    """Every task of ``job`` (an array's, or the one job) left the queue or COMPLETED."""
    states = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True,
                            timeout=30).stdout.split()
    return all(s in ("COMPLETED", "FAILED", "CANCELLED") for s in states)


def one_run(tmp: Path, config: str, rnd: int, steps: int, interval: int, pswift: str) -> dict:
    name = f"{config}-{rnd}"
    toml = make_config(tmp / f"{name}-ex", config, steps, interval)
    run = tmp / f"{name}-run"
    t0 = time.time()
    proc = subprocess.run([pswift, "sbatch", "--parsable", "--run-dir", str(run), str(toml)], capture_output=True,
                          text=True, env={**os.environ, "PSWIFT_HOME": str(tmp / f"{name}-home")}, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: pswift sbatch failed: {proc.stderr}")
    job, high = proc.stdout.strip(), None
    deadline = t0 + 900
    try:
        goodput.wait_step(run, goodput.fault_step(0.375, steps, interval), t0, deadline)
        high = fault(config, job, run)
        while not ended(job):
            if time.time() > deadline:
                raise SystemExit(f"{name}: job {job} did not end in 900 s; see {run}")
            time.sleep(0.5)
    finally:
        if high:
            subprocess.run(["scancel", high], capture_output=True, timeout=30)
    evs = goodput.events(run)
    steps_run = sorted(e["step"] for e in evs if e["event"] == "step")
    if not evs or evs[-1].get("event") != "end" or evs[-1].get("reason") != "completed" or steps_run[-1] != steps:
        raise SystemExit(f"{name}: the run did not complete its {steps} steps; see {run}")
    down = goodput.downtimes(evs)
    return {"jct_s": round(time.time() - t0, 2), "downtime_s": down, "change_s": down[0],
            "layouts": [(e["nodes"], e["stages"]) for e in evs if e["event"] == "start"],
            "steps_run": len(steps_run)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--interval", type=int, default=50, help="steps between periodic checkpoints")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="1 round of 100 steps (CI)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "members.json"))
    a = ap.parse_args()
    if a.quick:
        a.steps, a.rounds = 100, 1
    pswift = str(Path(sys.executable).parent / "pswift")
    runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="pswift-bench-members-") as tmp:
        for rnd in range(a.rounds):
            for config in CONFIGS if rnd % 2 == 0 else CONFIGS[::-1]:
                res = one_run(Path(tmp), config, rnd, a.steps, a.interval, pswift)
                runs[config].append(res)
                print(f"round {rnd} {config}: seconds without a step {res['downtime_s']}, layouts {res['layouts']}, "
                      f"JCT {res['jct_s']} s", flush=True)
    mem, rst = [r["change_s"] for r in runs["members"]], [r["change_s"] for r in runs["restart"]]
    ratio = statistics.median(mem) / statistics.median(rst)
    lo, hi = benchlib.ratio_of_medians_interval(mem, rst)
    result = {"benchmark": "members", "steps": a.steps, "interval": a.interval, "rounds": a.rounds,
              "hold_s": HOLD_S, "runs": runs, "members_change_s": statistics.median(mem),
              "restart_s": statistics.median(rst), "ratio": {"members/restart": {"ratio": ratio, "lo": lo, "hi": hi}}}
    interval = "" if lo is None else f" ({lo:.2f}–{hi:.2f})"
    benchlib.save(a.out, result, quick=a.quick,
                  what=f"seconds without a step when one of 2 one-node members of a {a.steps}-step tiny-gpt run is "
                       f"preempted (every rank stops at a step boundary with a checkpoint; the other member trains "
                       f"on alone in its own allocation) vs pswift's in-allocation restart of the same job as one "
                       f"2-node job (rank 1 killed; the ranks started again from the newest checkpoint)",
                  figures=f"medians of {a.rounds} alternated round(s), 90 % interval: members "
                          f"{statistics.median(mem):.1f} s, restart {statistics.median(rst):.1f} s: "
                          f"{ratio:.2f}×{interval} (the issue's bound: 2×)")


if __name__ == "__main__":
    main()
