"""pswift's own cost inside a training step (issue 41, item 0): the same job run by `pswift run`
and by a bare DeepSpeed loop (the same layers, boundaries, data, seed and DeepSpeed config:
pswift's own builders, none of its hooks, timers, events, watchdog or stop flags), in
alternated rounds (who goes first alternates), each its own processes, one per stage.

Figures: the median over rounds of each round's own ratio, pswift / bare (the two ran seconds
apart: a drift of the host's speed falls on both), of the median step time (engine.train_batch
alone) and of the wall time from starting the processes to the last step (pswift's final
checkpoint comes after the last step: not counted), each with a bootstrap 90 % interval of that
median: what the run's rounds resolve on this host. The ratio of the step medians is kept beside.

    python bench/overhead.py [--rounds 8] [--steps 40] [--hidden 256] [--device cuda] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
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
#: one rank of the bare loop: argv = plan.json, rank, world size, port, out.json, device
BARE = r'''
import json, os, sys, time
started = time.time()
plan_path, rank, world, port, out, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=port, DS_ACCELERATOR=device)
import logging, torch, deepspeed
from pipeswift_slurm.plan import parse_plan
from pipeswift_launch import data, ds_compat, rng
from pipeswift_launch.pipe import build_pipe
from pipeswift_launch.train import ds_config
plan = parse_plan(open(plan_path, "rb").read())
layout = plan["layouts"][str(world)]
ds_compat.skip_shm_build()
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
torch.set_num_threads(int(plan["cpus_per_task"]))
if device == "cuda":
    torch.cuda.set_device(rank)
deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
seed = int(plan["training"]["seed"])
rng.reseed(seed, 0, 0)
model = build_pipe(plan, layout)
rng.reseed(seed, 0, rank)
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(plan, layout, sum(p.numel() for p in model.parameters())))
t = plan["training"]
fn, kwargs, m, mbs = data.source(plan), dict(plan["model"]["kwargs"]), layout["micro_batches"], layout["micro_batch_size"]
times, losses = [], []
for step in range(int(t["steps"])):
    batches = [fn(step=step, index=i, micro_batch_size=mbs, seed=seed, **kwargs) for i in range(m)]
    ts = time.time()
    loss = engine.train_batch(data_iter=iter(batches))
    times.append(time.time() - ts)
    losses.append(float(loss.item()))
if rank == 0:
    with open(out, "w") as f:
        json.dump({"step_times": times, "losses": losses, "last_step_at": time.time(), "started": started}, f)
from pipeswift_launch.hardexit import exit_now   # gloo's threads may abort the interpreter's teardown
exit_now(0)
'''


def example(dst: Path, steps: int, hidden: int, device: str = "cpu", world: int = 2) -> Path:
    """The tiny-gpt example, ``world`` stages x 4 micro-batches (2 on CPU), widened to ``hidden``,
    no checkpoint but the final one; on CUDA one GPU a stage, on one node."""
    from pipeswift_slurm.starter import init
    init(dst, "tiny-gpt")
    toml = dst / "train.toml"
    text = toml.read_text()
    on_gpu = (("nodes = 2 ", "nodes = 1 "), ("tasks_per_node = 1", f"tasks_per_node = {world}"),
              ('device = "cpu"', f'device = "cuda"\ngpus_per_node = {world}'),
              ('stages = "auto"', f"stages = {world}")) if device == "cuda" else ()
    for old, new in (("steps = 40", f"steps = {steps}"), ("hidden = 128", f"hidden = {hidden}"),
                     ("checkpoint_interval = 20 ", "checkpoint_interval = 0  "), *on_gpu):
        assert old in text, old
        text = text.replace(old, new)
    toml.write_text(text)
    return toml


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
    return {"step_times": [e["step_time"] for e in steps], "losses": [e["loss"] for e in steps],
            "to_last_step_s": steps[-1]["time"] - started, "plan": str(run / "plan.json"),
            "boundaries": start["boundaries"], "instructions": profile.get("instructions") or {}}


def run_bare(plan: Path, work: Path, world: int, device: str) -> dict:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = work / f"bare-{time.monotonic_ns()}.json"
    started = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", BARE, str(plan), str(r), str(world), port, str(out), device],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("bare DeepSpeed failed:\n" + "\n".join(log[-2000:] for log in logs))
    got = json.loads(out.read_text())
    return {"step_times": got["step_times"], "losses": got["losses"], "to_last_step_s": got["last_step_at"] - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="one round of 4 steps at hidden 128 (CI: the bench still runs)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: one stage a GPU, up to 2 (nccl); cpu: 2 stages (gloo)")
    ap.add_argument("--out", default=None, help="default bench/results/overhead.json (overhead.cuda.json on CUDA: a second row of the table)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.hidden = 1, 4, 128
    out = args.out or str(ROOT / "bench" / "results" / f"overhead{'.cuda' if args.device == 'cuda' else ''}.json")
    world = 2
    if args.device == "cuda":
        import torch   # the bench's own process: how many GPUs
        world = min(2, torch.cuda.device_count())
    work = Path(tempfile.mkdtemp(prefix="pswift-overhead-"))
    try:
        toml = example(work / "ex", args.steps, args.hidden, args.device, world)
        rounds, plan, cut = [], None, None
        for r in range(args.rounds):
            order = ("pswift", "bare") if r % 2 == 0 else ("bare", "pswift")   # round 0: pswift first
            got: dict[str, dict] = {}
            for who in order:
                got[who] = run_pswift(toml, work) if who == "pswift" else run_bare(plan, work, world, args.device)
                if who == "pswift":   # the bare loop trains the first run's plan: every round's is the same
                    plan, cut = plan or Path(shutil.copy(got[who]["plan"], work / "plan.json")), cut or got[who]["boundaries"]
                    if got[who]["boundaries"] != cut:
                        raise SystemExit(f"round {r + 1} planned other stages {got[who]['boundaries']} than {cut}")
            if got["pswift"]["losses"] != got["bare"]["losses"]:
                raise SystemExit("pswift and bare DeepSpeed trained different numbers: not the same job")
            rounds.append({who: {"median_step_s": statistics.median(g["step_times"]), "to_last_step_s": g["to_last_step_s"]}
                           for who, g in got.items()})
            print(f"round {r + 1}/{args.rounds}: step {rounds[-1]['pswift']['median_step_s']:.4f} s (pswift) vs "
                  f"{rounds[-1]['bare']['median_step_s']:.4f} s (bare); to the last step "
                  f"{rounds[-1]['pswift']['to_last_step_s']:.1f} vs {rounds[-1]['bare']['to_last_step_s']:.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    step_ratios = [x["pswift"]["median_step_s"] / x["bare"]["median_step_s"] for x in rounds]
    wall_ratios = [x["pswift"]["to_last_step_s"] / x["bare"]["to_last_step_s"] for x in rounds]
    step_ratio, wall_ratio = statistics.median(step_ratios), statistics.median(wall_ratios)
    of_medians = statistics.median(x["pswift"]["median_step_s"] for x in rounds) / \
        statistics.median(x["bare"]["median_step_s"] for x in rounds)
    step_ci, wall_ci = benchlib.median_interval(step_ratios), benchlib.median_interval(wall_ratios)
    figures = (f"step time pswift/bare {step_ratio:.3f} (90 % interval {step_ci[0]:.3f}-{step_ci[1]:.3f}; "
               f"rounds {min(step_ratios):.3f}-{max(step_ratios):.3f}; ratio of the medians {of_medians:.3f}), "
               f"launch to last step {wall_ratio:.3f} ({wall_ci[0]:.3f}-{wall_ci[1]:.3f}; rounds "
               f"{min(wall_ratios):.3f}-{max(wall_ratios):.3f}); {args.rounds} alternated rounds of {args.steps} "
               f"steps, {world} stage(s) x 4 micro-batches, hidden {args.hidden}, {args.device}")
    benchlib.save(out, {"rounds": rounds, "step_ratio": step_ratio, "wall_ratio": wall_ratio,
                        "step_ratio_interval": step_ci, "wall_ratio_interval": wall_ci,
                        "step_ratio_of_medians": of_medians,
                        "step_ratios": step_ratios, "wall_ratios": wall_ratios},
                  quick=args.quick, what="pswift's own cost per step against bare DeepSpeed (bench/overhead.py)",
                  figures=figures)


if __name__ == "__main__":
    main()
