"""pswift's own cost per step (issues 41 and 61): the same job run by `pswift run` with every
per-step hook on (the step's event, the metrics sinks csv and TensorBoard, the watchdog, the
flags every rank agrees on each step, the step's end) and by a bare DeepSpeed loop (the same
layers, boundaries, data, seed and DeepSpeed config: pswift's own builders, none of its hooks),
each its own processes, one per stage, for each stage count asked (``--stages 2,4``). A round
runs bare, pswift, bare (ABA: a drift of the host's speed within the round cancels against the
two bare runs' geometric mean), and its two bare runs give the **control**: bare / bare, what
two runs of the same job differ by on this host (an A/A ratio). A ratio pswift / bare whose
interval lies inside the control's says pswift's cost is below what this host can resolve.

Figures, each the median over rounds of a round's own ratio pswift / bare (the three ran seconds
apart) with a bootstrap 90 % interval of that median:

- **whole steps**: the wall time from step K's end to the last step's, per step (K = 6: after
  pswift's layer-profile window, steps 2-4, and the step that reads it): everything each step
  does, pswift's hooks included, timed where both loops report a step;
- the step alone (``engine.train_batch``), and launch to the last step (start-up and the
  profile window included; pswift's final checkpoint comes after: not counted).

Beside them, the ``step_parts`` event of each pswift run (pipeswift_launch.stepparts): rank 0's
seconds per steady step in each part, its hooks' sum ("own") against the whole step.

    python bench/overhead.py [--rounds 10] [--stages 2,4] [--steps 40] [--hidden 256] [--device cuda] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = benchlib.ROOT
#: the bare loop's body after benchlib's DeepSpeed prelude: argv[6] = out.json
BARE = r'''
out = sys.argv[6]
t = plan["training"]
times, losses, ends = [], [], []
for step in range(int(t["steps"])):
    batches = [fn(step=step, index=i, micro_batch_size=mbs, seed=seed, **kwargs) for i in range(m)]
    ts = time.time()
    loss = engine.train_batch(data_iter=iter(batches))
    times.append(time.time() - ts)
    losses.append(float(loss.item()))
    ends.append(time.time())   # where pswift's rank 0 writes the step's event
if rank == 0:
    with open(out, "w") as f:
        json.dump({"step_times": times, "losses": losses, "ends": ends, "last_step_at": ends[-1], "started": started}, f)
'''


#: the first step of the whole-step window: after pswift's layer-profile window (steps 2-4) and
#: the step that reads it (pipeswift_launch.layerprofile.PROFILE_STEPS)
FIRST_WHOLE = 6


def example(dst: Path, steps: int, hidden: int, device: str = "cpu", world: int = 2,
            metrics: tuple[str, ...] = ()) -> Path:
    """The tiny-gpt example, ``world`` stages x 4 micro-batches (2 on CPU), widened to ``hidden``,
    no checkpoint but the final one, ``metrics`` sinks (else the example's); on CPU a node per
    stage, on CUDA one GPU a stage, on one node."""
    from pipeswift_slurm.starter import init
    init(dst, "tiny-gpt")
    toml = dst / "train.toml"
    text = toml.read_text()
    on_gpu = (("nodes = 2 ", "nodes = 1 "), ("tasks_per_node = 1", f"tasks_per_node = {world}"),
              ('device = "cpu"', f'device = "cuda"\ngpus_per_node = {world}'),
              ('stages = "auto"', f"stages = {world}")) if device == "cuda" else ()
    on_cpu = (("nodes = 2 ", f"nodes = {world} "), ('stages = "auto"', f"stages = {world}")) \
        if device == "cpu" and world != 2 else ()
    sinks = (("eval_every = 0", f"eval_every = 0\nmetrics = {list(metrics)!r}".replace("'", '"')),) if metrics else ()
    for old, new in (("steps = 40", f"steps = {steps}"), ("hidden = 128", f"hidden = {hidden}"),
                     ("checkpoint_interval = 20 ", "checkpoint_interval = 0  "), *on_gpu, *on_cpu, *sinks):
        assert old in text, old
        text = text.replace(old, new)
    toml.write_text(text)
    return toml


def whole_step_s(ends: list[float]) -> float:
    """Seconds per step from step FIRST_WHOLE's end to the last step's (``ends``: each step's)."""
    first = FIRST_WHOLE - 1
    if len(ends) - 1 <= first:
        raise SystemExit(f"whole steps need more than {FIRST_WHOLE} steps (--steps)")
    return (ends[-1] - ends[first]) / (len(ends) - 1 - first)


def run_pswift(toml: Path, work: Path, history: Path | None = None) -> dict:
    """`pswift run`, each with a fresh history (so every round plans the same, from layer_costs),
    or with ``history``, the one given (the planner calibrated by the runs before)."""
    run = work / f"pswift-{time.monotonic_ns()}"
    env = {**os.environ, "PSWIFT_HOME": str(run) + "-home", "PSWIFT_DB": str(history or f"{run}.db")}
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli.main", "run", "--run-dir", str(run), str(toml)],
                          capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"pswift run failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    from pipeswift_slurm import events
    evs = events.read(run)[0]
    steps = [e for e in evs if e["event"] == "step"]
    start = next(e for e in evs if e["event"] == "start")
    profile = next((e for e in evs if e["event"] == "layer_profile"), {})
    parts = next((e for e in evs if e["event"] == "step_parts"), {})
    return {"step_times": [e["step_time"] for e in steps], "losses": [e["loss"] for e in steps],
            "ends": [e["time"] for e in steps],
            "to_last_step_s": steps[-1]["time"] - started, "plan": str(run / "plan.json"),
            "boundaries": start["boundaries"], "instructions": profile.get("instructions") or {},
            "parts": parts.get("seconds") or {}}


def run_bare(plan: Path, work: Path, world: int, device: str) -> dict:
    out = work / f"bare-{time.monotonic_ns()}.json"
    started = time.time()
    benchlib.run_deepspeed_ranks(BARE, plan, world, device, str(out), what="bare DeepSpeed")
    got = json.loads(out.read_text())
    return {"step_times": got["step_times"], "losses": got["losses"], "ends": got["ends"],
            "to_last_step_s": got["last_step_at"] - started}


FIGURES = ("median_step_s", "whole_step_s", "to_last_step_s")


def figures(got: dict) -> dict:
    return {"median_step_s": statistics.median(got["step_times"]), "whole_step_s": whole_step_s(got["ends"]),
            "to_last_step_s": got["to_last_step_s"]}


def one_round(r: int, toml: Path, work: Path, world: int, device: str, first: dict) -> dict:
    """Round ``r``: bare, pswift, bare; each figure of "bare" is the geometric mean of the two
    bare runs', "bare_a" and "bare_b" their own (the control); ``first`` keeps the first pswift
    run's plan (the bare loop trains it) and cut (every round must plan the same)."""
    if not first:   # the plan the bare loop trains: pswift's, made once before the rounds
        made = run_pswift(toml, work)
        first.update(plan=Path(shutil.copy(made["plan"], work / f"plan-{world}.json")), cut=made["boundaries"])
    bare_a = run_bare(first["plan"], work, world, device)
    pswift = run_pswift(toml, work)
    bare_b = run_bare(first["plan"], work, world, device)
    if pswift["boundaries"] != first["cut"]:
        raise SystemExit(f"round {r + 1} planned other stages {pswift['boundaries']} than {first['cut']}")
    if not pswift["losses"] == bare_a["losses"] == bare_b["losses"]:
        raise SystemExit("pswift and bare DeepSpeed trained different numbers: not the same job")
    a, b = figures(bare_a), figures(bare_b)
    return {"pswift": figures(pswift), "bare_a": a, "bare_b": b,
            "bare": {k: math.sqrt(a[k] * b[k]) for k in FIGURES}, "parts": pswift["parts"]}


def ratio_of(rounds: list[dict], figure: str, num: str = "pswift", den: str = "bare") -> dict:
    """The median over ``rounds`` of ``num`` / ``den`` for ``figure`` (pswift / bare; the control:
    bare_b / bare_a), its 90 % interval and range."""
    per = [x[num][figure] / x[den][figure] for x in rounds]
    lo, hi = benchlib.median_interval(per)
    return {"ratio": statistics.median(per), "lo": lo, "hi": hi, "min": min(per), "max": max(per), "per_round": per}


def hooks(rounds: list[dict]) -> dict:
    """Seconds per steady step of each part (the median over rounds); "own": pswift's hooks
    together (every part but building the data and train_batch, which the bare loop does too),
    with its share of the median whole step."""
    parts = [x["parts"] for x in rounds if x["parts"]]
    if not parts:
        return {}
    out = {k: statistics.median(p.get(k, 0.0) for p in parts) for k in parts[0]}
    own = statistics.median(sum(v for k, v in p.items() if k not in ("data", "train_batch")) for p in parts)
    whole = statistics.median(x["pswift"]["whole_step_s"] for x in rounds)
    return {"seconds_per_step": out, "own_s": own, "own_share_of_whole_step": own / whole}


def measure(stages: int, args: argparse.Namespace, work: Path) -> dict:
    """``args.rounds`` rounds (bare, pswift, bare) at ``stages`` stages: the figures of one stage count."""
    toml = example(work / f"ex-{stages}", args.steps, args.hidden, args.device, stages, metrics=("csv", "tensorboard"))
    rounds: list[dict] = []
    first: dict = {}
    for r in range(args.rounds):
        rounds.append(one_round(r, toml, work, stages, args.device, first))
        x = rounds[-1]
        print(f"{stages} stages, round {r + 1}/{args.rounds}: whole step {x['pswift']['whole_step_s']:.4f} s (pswift) "
              f"vs {x['bare']['whole_step_s']:.4f} s (bare); step {x['pswift']['median_step_s']:.4f} vs "
              f"{x['bare']['median_step_s']:.4f} s; to the last step {x['pswift']['to_last_step_s']:.1f} vs "
              f"{x['bare']['to_last_step_s']:.1f} s", flush=True)
    whole = ratio_of(rounds, "whole_step_s")
    return {"whole_step_ratio": whole["ratio"], "lo": whole["lo"], "hi": whole["hi"], "rounds": args.rounds,
            "whole_step": whole, "step": ratio_of(rounds, "median_step_s"), "wall": ratio_of(rounds, "to_last_step_s"),
            "control": ratio_of(rounds, "whole_step_s", "bare_b", "bare_a"),
            "hooks": hooks(rounds), "per_round": rounds}


def figures_of(stages: str, m: dict, args: argparse.Namespace) -> str:
    w, st, wall, h, aa = m["whole_step"], m["step"], m["wall"], m["hooks"], m["control"]
    own = (f", pswift's hooks {h['own_s'] * 1000:.2f} ms a step ({h['own_share_of_whole_step'] * 100:.2f} % of it)"
           if h else "")
    return (f"{stages} stages: whole steps pswift/bare {w['ratio']:.3f} (90 % interval {w['lo']:.3f}-{w['hi']:.3f}; "
            f"rounds {w['min']:.3f}-{w['max']:.3f}); control bare/bare {aa['ratio']:.3f} ({aa['lo']:.3f}-{aa['hi']:.3f}; "
            f"rounds {aa['min']:.3f}-{aa['max']:.3f}){own}; the step alone {st['ratio']:.3f} ({st['lo']:.3f}-{st['hi']:.3f}); "
            f"launch to last step {wall['ratio']:.3f} ({wall['lo']:.3f}-{wall['hi']:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--stages", default="2,4", help="stage counts, comma-separated (the example has 6 layers: 1 to 6)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="one round of 8 steps at hidden 128, 2 stages (CI: the bench still runs)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: one stage a GPU, up to as many as there are GPUs (nccl); cpu: gloo")
    ap.add_argument("--out", default=None, help="default bench/results/overhead.json (overhead.cuda.json on CUDA: a second row of the table)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.hidden, args.stages = 1, 8, 128, "2"
    out = args.out or str(ROOT / "bench" / "results" / f"overhead{'.cuda' if args.device == 'cuda' else ''}.json")
    counts = sorted({int(x) for x in args.stages.split(",")})
    if args.device == "cuda":
        import torch   # the bench's own process: how many GPUs
        counts = sorted({min(c, torch.cuda.device_count()) for c in counts})
    work = Path(tempfile.mkdtemp(prefix="pswift-overhead-"))
    try:
        by_stages = {str(c): measure(c, args, work) for c in counts}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = "; ".join(figures_of(c, m, args) for c, m in by_stages.items()) + \
        f"; {args.rounds} rounds (bare, pswift, bare) of {args.steps} steps (whole steps from step {FIRST_WHOLE}), " \
        f"4 micro-batches, hidden {args.hidden}, metrics csv + TensorBoard, {args.device}"
    benchlib.save(out, {"stages": by_stages, "first_whole_step": FIRST_WHOLE,
                        # the 2-stage (else first) count's ratios at the top, as earlier results had them
                        "whole_step_ratio": by_stages[str(counts[0])]["whole_step_ratio"],
                        "step_ratio": by_stages[str(counts[0])]["step"]["ratio"]},
                  quick=args.quick, what="pswift's own cost per step, every hook on, against bare DeepSpeed "
                                         "(bench/overhead.py)", figures=figures)


if __name__ == "__main__":
    main()
