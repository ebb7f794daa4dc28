"""Dynamic benchmark: the JCT of a re-balancing job and of a growing one against the best static
job a user could have chosen, under a scripted load on the local Slurm (real `pswift sbatch`,
real DeepSpeed on CPU).

The job: the tiny-gpt example at hidden 256, nodes = [1, 4]. Another user's job (the `high`
partition, exclusive) is the load. Two scenarios, each run as several configurations of the
same job, ``--rounds`` times in a rotated order:

- **straggler**: the other job holds node3-node4 throughout, so the job runs on 2 nodes (2
  stages). Half-way through, block 0 turns ``SLOW``x slower (the benchmark creates a file the
  block looks for: a node throttled, a noisy neighbour), so the cut that was right at
  submission is wrong from then on. Against it: static with the costs right at submission, and
  static with the costs right after the straggler (cut for a slowness it has not yet), both
  ``rebalance = false``; re-balancing (the costs right at submission, the cut measured and fixed
  in place when the step times drift).
- **freeing**: the other job holds node2-node4 for ``--hold`` seconds. Against growing (starts
  on node1, grows when nodes free up): static on what is free now (growth off), and static on 2
  and on 4 nodes, which wait for the other job to end (the growing job grows to 4 nodes here).
  Which of those is best depends on the hold, which a user cannot know at submission; the
  best static here is the best of them in hindsight.

The costs every static job is given are the right ones, measured: an unmeasured warm-up run
(re-balancing on) records its layer profile before the straggler and after it; those are the
`layer_costs` of the configurations above. Each run has its own history (PSWIFT_HOME), so none
starts from another's measured profile, and every run asks for 30 minutes as written, so none
meets a limit predicted before its straggler: what differs is the cut and the node count alone.
JCT = `pswift sbatch` to COMPLETED, seen from outside.
Per scenario the best static is the static configuration with the lower median JCT; the ratio
is its JCT over the dynamic job's, paired by round (> 1: the dynamic job finished sooner), with
the 90 % bootstrap interval of the median. The planner is told that all virtual nodes share this
host's cores (PSWIFT_HOST_CORES, PSWIFT_RANKS_PER_HOST), so its estimates reflect the host.

    scripts/with-slurm 22.05 python bench/dynamic.py [--rounds 3] [--steps 150] [--grow-steps 200] [--hold 30] [--quick] [--out ...]
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: how many times slower block 0 turns in the straggler scenario
SLOW = 3
#: the example's layers, block ``slow_block`` a straggler once the file ``flag`` exists
STRAGGLER = '''"""The example's layers; block ``slow_block`` does its work ``slow_factor`` times once the file
``flag`` exists (the benchmark creates it mid-run: a straggler that appears, not one from the start)."""
import os

from deepspeed.pipe import LayerSpec

import model


class Straggler(model.SlowBlock):
    def __init__(self, hidden, heads, dropout=0.0, repeat=3, flag=""):
        super().__init__(hidden, heads, dropout, repeat)
        self.flag = flag

    def forward(self, x):
        if self.flag and os.path.exists(self.flag):
            return super().forward(x)
        return model.Block.forward(self, x)


def build_layers(vocab=96, hidden=128, heads=4, blocks=4, seq_len=32, dropout=0.0, slow_block=-1, slow_factor=3,
                 flag=""):
    layers = model.build_layers(vocab, hidden, heads, blocks, seq_len, dropout)
    if slow_block >= 0:
        layers[1 + slow_block] = LayerSpec(Straggler, hidden, heads, dropout, slow_factor, flag)
    return layers
'''
#: scenario: (the holder's nodes, whether it holds for --hold seconds (else throughout), the
#: dynamic configuration, {configuration: (nodes, rebalance, grow_check_s, costs: "start"/"after")})
SCENARIOS = {
    "straggler": ("node[3-4]", False, "rebalanced",
                  {"static_start_costs": ("[1, 4]", "false", 0, "start"),
                   "static_after_costs": ("[1, 4]", "false", 0, "after"),
                   "rebalanced": ("[1, 4]", "true", 0, "start")}),
    "freeing": ("node[2-4]", True, "growing",
                {"static_now": ("[1, 4]", "true", 0, "start"),
                 "static_2_nodes": ("2", "true", 0, "start"),
                 "static_4_nodes": ("4", "true", 0, "start"),
                 "growing": ("[1, 4]", "true", 5, "start")}),
}


def make_config(d: Path, steps: int, nodes: str, rebalance: str, grow_check_s: int, costs: list[float] | None,
                flag: Path | None) -> Path:
    shutil.copytree(ROOT / "examples" / "tiny-gpt", d, ignore=shutil.ignore_patterns("__pycache__"))
    (d / "straggler.py").write_text(STRAGGLER)
    t = (d / "train.toml").read_text()
    slow = f", slow_block = 0, slow_factor = {SLOW}, flag = {json.dumps(str(flag))}" if flag else ""
    subs = {"nodes": nodes, "jct_slack": "0", "steps": str(steps), "checkpoint_interval": "0", "data_parallel": "1",
            "time": '"0:30:00"', "time_policy": '"as_written"', "entry": '"straggler:build_layers"',
            "kwargs": f"{{ vocab = 96, hidden = 256, heads = 4, blocks = 4, seq_len = 32{slow} }}"}
    if costs:
        subs["layer_costs"] = "[" + ", ".join(f"{c:.6g}" for c in costs) + "]"
    for key, value in subs.items():
        t, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", t, count=1)
        assert n == 1, key
    t = t.replace("max_requeues = 3", f"max_requeues = 3\ngrow_check_s = {grow_check_s}")
    t = t.replace("[pipeline]\n", f"[pipeline]\nrebalance = {rebalance}\n")
    (d / "train.toml").write_text(t)
    return d / "train.toml"


def state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True,
                         text=True, timeout=30).stdout.strip()
    return out or "GONE"


def wait_for(job: str, states: set[str], timeout: float, tick=None) -> str:
    """Poll ``job`` until it is in ``states``; ``tick()`` runs between polls."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = state(job)
        if s in states:
            return s
        if tick:
            tick()
        time.sleep(0.25)
    raise SystemExit(f"job {job} not in {states} after {timeout:.0f} s (last: {state(job)})")


def read_events(run: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def straggle_at(run: Path, flag: Path, step: int):
    """A poll-time check that creates ``flag`` once the run has reported step ``step``."""
    def tick() -> None:
        if not flag.exists() and any(e["event"] == "step" and e["step"] >= step for e in read_events(run)):
            flag.touch()
    return tick


def one_run(tmp: Path, name: str, steps: int, scenario: str, config: str, costs: dict, hold: float,
            pswift: str, env: dict) -> dict:
    holder_nodes, holds, _, configs = SCENARIOS[scenario]
    nodes, rebalance, grow_check_s, which = configs[config]
    flag = tmp / f"{name}.slow" if scenario == "straggler" else None
    toml = make_config(tmp / f"{name}-ex", steps, nodes, rebalance, grow_check_s, costs.get(which), flag)
    env = {**env, "PSWIFT_HOME": str(tmp / f"{name}-home")}   # no run learns from another's profile
    holder = subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", holder_nodes, "--exclusive", "--time=10",
                             "-o", "/dev/null", "--wrap", f"sleep {hold:.0f}" if holds else "sleep 3600"],
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
        tick = straggle_at(run, flag, steps // 2) if flag else None
        got = wait_for(job, {"COMPLETED", "FAILED", "CANCELLED", "GONE"}, 1800, tick)
        jct = time.time() - t0
    finally:
        subprocess.run(["scancel", holder], capture_output=True, timeout=30)
    if got != "COMPLETED":
        raise SystemExit(f"{name}: job {job} ended {got}; see {run}")
    evs = read_events(run)
    profiles = [e for e in evs if e["event"] == "layer_profile"]
    return {"jct_s": jct, "launches": [(s["attempt"], s["nodes"], s["boundaries"]) for s in evs if s["event"] == "start"],
            "relayouts": sum(e["event"] == "relayout" for e in evs), "grows": sum(e["event"] == "grow" for e in evs),
            "straggler_from": flag.stat().st_mtime - t0 if flag and flag.exists() else None,
            "profiles": [[p["seconds"][str(i)] for i in range(len(p["seconds"]))] for p in profiles]}


def measured_costs(warm: dict) -> dict[str, list[float]]:
    """The right costs from the warm-up's layer profiles: its first (before the straggler) and
    its last (after it; a run too short to drift has none: the first again)."""
    if not warm["profiles"]:
        raise SystemExit("the warm-up run profiled no layers: its steps are too few")
    return {"start": warm["profiles"][0], "after": warm["profiles"][-1]}


def compare(rounds: list[dict[str, dict]], dynamic: str) -> dict:
    """The best static (lower median JCT) against ``dynamic``, paired by round."""
    statics = [c for c in rounds[0] if c != dynamic]
    med = {c: statistics.median(r[c]["jct_s"] for r in rounds) for c in rounds[0]}
    best = min(statics, key=med.__getitem__)
    per = [r[best]["jct_s"] / r[dynamic]["jct_s"] for r in rounds]
    lo, hi = benchlib.median_interval(per)
    return {"best_static": best, "ratio": statistics.median(per), "lo": lo, "hi": hi, "per_round": per,
            "median_jct_s": med}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds, each configuration once, order rotated")
    ap.add_argument("--steps", type=int, default=150, help="steps of the straggler job (block 0 turns slow half-way)")
    ap.add_argument("--grow-steps", type=int, default=200, help="steps of the freeing job")
    ap.add_argument("--hold", type=float, default=30.0, help="seconds the freeing load holds its nodes")
    ap.add_argument("--scenario", choices=("both", *SCENARIOS), default="both", help="the scenarios to run")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dynamic.json"))
    ap.add_argument("--quick", action="store_true",
                    help="one round of 12 steps, a 5 s hold, no warm-up (CI: the bench still runs)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.grow_steps, args.hold = 1, 12, 12, 5.0
    pswift = shutil.which("pswift", path=str(Path(sys.executable).parent)) or "pswift"
    env = {**os.environ, "PSWIFT_HOST_CORES": str(os.cpu_count() or 1), "PSWIFT_RANKS_PER_HOST": "4"}
    scenarios = {k: v for k, v in SCENARIOS.items() if args.scenario in ("both", k)}
    runs: dict[str, list[dict[str, dict]]] = {s: [] for s in scenarios}
    with tempfile.TemporaryDirectory(prefix="pswift-bench-dyn-") as tmp:
        costs: dict = {}
        if not args.quick:
            warm = one_run(Path(tmp), "warm-up", args.steps, "straggler", "rebalanced", {}, 0, pswift, env)
            costs = measured_costs(warm)
            print(f"warm-up: JCT {warm['jct_s']:.1f} s, costs {costs}", flush=True)
        for r in range(args.rounds):
            for scenario, (_, _, _, configs) in scenarios.items():
                order = list(configs)
                order = order[r % len(order):] + order[:r % len(order)]
                got = {}
                for config in order:
                    got[config] = one_run(Path(tmp), f"{r}-{scenario}-{config}",
                                          args.grow_steps if scenario == "freeing" else args.steps,
                                          scenario, config, costs, args.hold, pswift, env)
                    print(f"round {r + 1} {scenario:9s} {config:18s} JCT {got[config]['jct_s']:6.1f} s  "
                          f"launches {got[config]['launches']}  relayouts {got[config]['relayouts']}  "
                          f"grows {got[config]['grows']}", flush=True)
                runs[scenario].append({c: got[c] for c in configs})
    ratios = {dyn: compare(runs[s], dyn) for s, (_, _, dyn, _) in scenarios.items()}
    res = {"benchmark": "dynamic", "scenarios": list(scenarios), "rounds": args.rounds, "steps": args.steps, "grow_steps": args.grow_steps,
           "hold_s": args.hold, "slow_factor": SLOW, "costs": costs, "runs": runs, "ratios": ratios}
    benchlib.save(args.out, res, quick=args.quick, what=what(args), figures=figures(ratios, args.rounds))


def what(args: argparse.Namespace) -> str:
    told = {"straggler": f"on 2 free nodes with a block turning {SLOW}x slower half-way ({args.steps} steps: "
                         f"re-balanced in place vs static cut for the costs before or after)",
            "freeing": f"with 3 of 4 nodes held for {args.hold:.0f} s ({args.grow_steps} steps: growing vs static "
                       f"on 1 node now or on 2 or 4 nodes later)"}
    return ("JCT of one job (nodes [1, 4]) under another user's job, against the best static job given "
            "the measured costs: " + ", or ".join(v for k, v in told.items() if args.scenario in ("both", k))
            + "; `pswift sbatch` to COMPLETED")


def figures(ratios: dict[str, dict], rounds: int) -> str:
    def one(name: str) -> str:
        c = ratios[name]
        best = c["best_static"]
        return (f"{name} {c['median_jct_s'][name]:.0f} s vs best static ({best.replace('_', ' ')}) "
                f"{c['median_jct_s'][best]:.0f} s: {c['ratio']:.2f}× ({c['lo']:.2f}–{c['hi']:.2f}) sooner")
    return f"medians of {rounds} rotated round(s), 90 % intervals: " + "; ".join(one(n) for n in ratios)


if __name__ == "__main__":
    main()
