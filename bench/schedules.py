"""1F1B against ZB-H1 as DeepSpeed's engine runs them (issue 41, item 4): the same job through
`pswift run`, P stages, m micro-batches, `[pipeline] schedule` the only difference, in alternated
rounds (who goes first alternates), each its own processes, one per stage.

Figures per (P, m): the median over rounds of each round's own ratio of the runs' median step
times, ZB-H1 / 1F1B (the two ran seconds apart), with a bootstrap 90 % interval of that median
(what the rounds resolve; the ratio of the medians is kept beside), against
the ratio `pswift simulate` predicts for uniform stages with the weight gradient taken as half
the backward (the simulator's default when W is not measured), and the ratio it simulates on
this job's own stages (F, B and W per stage from the ZB-H1 run's instruction timer, plus the
step's fixed optimizer and reduction time), with the measured gain as a share of that one, and
the same in the order the engine runs (the planner's step model of this job); and
each schedule's measured step
against the step its plan.json predicted in the last round (the planner's step model, calibrated
by the earlier rounds of that schedule: each schedule keeps its own history). Both schedules must
train the same numbers (fp32: the same losses bit for bit), or the bench stops. With more stages
than cores (4 on a 2-core host) the stages share cores: the figures then say so.

    python bench/schedules.py [--rounds 4] [--steps 30] [--hidden 256] [--stages 2,4] [--micro-batches 4,8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import overhead  # noqa: E402  (its example and `pswift run` helpers)

ROOT = benchlib.ROOT
GLOBAL_BATCH = 32


def job(dst: Path, steps: int, hidden: int, stages: int, micro_batches: int, schedule: str) -> Path:
    toml = overhead.example(dst, steps, hidden)
    text = toml.read_text()
    mbs = GLOBAL_BATCH // micro_batches
    for old, new in (("micro_batch_size = 8", f"micro_batch_size = {mbs}"),
                     ("nodes = 2 ", f"nodes = {stages} "),
                     ("[pipeline]\n", f'[pipeline]\nschedule = "{schedule}"\n')):
        assert old in text, old
        text = text.replace(old, new)
    toml.write_text(text)
    return toml


def predicted_ratio(stages: int, micro_batches: int) -> float:
    """ZB-H1 / 1F1B step time by pswift's simulator, uniform stages, W = half of B."""
    from pipeswift_slurm.planning.simulate import simulate
    f, b = [1.0] * stages, [2.0] * stages
    one = simulate(f, b, micro_batches, "1f1b").step_time
    zb = simulate(f, b, micro_batches, "zb-h1").step_time
    return zb / one


def job_predicted_ratio(instructions: dict[str, dict[str, float]], micro_batches: int,
                        as_run: bool = False) -> float | None:
    """ZB-H1 / 1F1B step time by pswift's simulator on this job's own stages: each stage's F, B
    and W per micro-batch from the ZB-H1 run's instruction timer (its first profiled steps), the
    step's fixed part (optimizer, gradient reduction: the slowest stage's) added to both;
    ``as_run``: ZB-H1 in the order the engine runs it (the planner's step model), not the paper's."""
    from pipeswift_slurm.planning.simulate import simulate
    stages = [instructions[s] for s in sorted(instructions, key=int)]
    if not stages or any("WeightPass" not in ins for ins in stages):
        return None
    f = [ins["ForwardPass"] / micro_batches for ins in stages]
    b = [ins["BackwardPass"] / micro_batches for ins in stages]
    w = [ins["WeightPass"] / micro_batches for ins in stages]
    fixed = max(sum(ins.get(k, 0.0) for k in ("OptimizerStep", "ReduceGrads", "ReduceTiedGrads")) for ins in stages)
    whole = [x + y for x, y in zip(b, w)]
    one = simulate(f, whole, micro_batches, "1f1b").step_time + fixed
    zb = simulate(f, whole, micro_batches, "zb-h1", wgrad=w, as_run=as_run).step_time + fixed
    return zb / one


def measure(work: Path, args: argparse.Namespace, p: int, m: int) -> dict:
    tomls = {s: job(work / f"{s}-{p}-{m}", args.steps, args.hidden, p, m, s) for s in ("1f1b", "zb-h1")}
    rounds, planned, job_ratios, as_run = [], {}, [], []
    for r in range(args.rounds):
        order = ("1f1b", "zb-h1") if r % 2 == 0 else ("zb-h1", "1f1b")
        got = {s: overhead.run_pswift(tomls[s], work, history=work / f"{s}-{p}-{m}.db") for s in order}
        if got["1f1b"]["losses"] != got["zb-h1"]["losses"]:
            raise SystemExit(f"P={p} m={m}: ZB-H1 trained other numbers than 1F1B: not the same job")
        rounds.append({s: statistics.median(g["step_times"]) for s, g in got.items()})
        planned = {s: json.loads(Path(g["plan"]).read_text())["prediction"]["step_s"] for s, g in got.items()}
        job_ratios.append(job_predicted_ratio(got["zb-h1"]["instructions"], m))
        as_run.append(job_predicted_ratio(got["zb-h1"]["instructions"], m, as_run=True))
        print(f"P={p} m={m} round {r + 1}/{args.rounds}: step {rounds[-1]['zb-h1']:.4f} s (ZB-H1) vs "
              f"{rounds[-1]['1f1b']:.4f} s (1F1B)", flush=True)
    measured = {s: statistics.median(x[s] for x in rounds) for s in ("1f1b", "zb-h1")}
    ratios = [x["zb-h1"] / x["1f1b"] for x in rounds]
    ratio, known = statistics.median(ratios), [r for r in job_ratios if r is not None]
    job_ratio = statistics.median(known) if known else None
    model = [r for r in as_run if r is not None]
    return {"micro_batches": m, "stages": p, "rounds": rounds, "ratio": ratio,
            "ratio_interval": benchlib.median_interval(ratios),
            "ratio_of_medians": measured["zb-h1"] / measured["1f1b"],
            "round_ratios": ratios, "predicted_ratio": predicted_ratio(p, m),
            "job_predicted_ratio": job_ratio,
            # the same on the order the engine runs: the planner's step model of this job
            "job_as_run_ratio": statistics.median(model) if model else None,
            # the measured gain as a share of the gain simulated on this job's own stage times
            "gain_share": (1 - ratio) / (1 - job_ratio) if job_ratio is not None and job_ratio < 1 else None,
            "measured_step_s": measured,
            "planned_step_s": planned,
            "model_error": {s: planned[s] / measured[s] - 1 for s in measured},
            "shares_cores": p > (os.cpu_count() or 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--stages", default="2")
    ap.add_argument("--micro-batches", default="4,8")
    ap.add_argument("--quick", action="store_true", help="one round of 4 steps at hidden 128, P = 2, m = 4")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "schedules.json"))
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.hidden, args.stages, args.micro_batches = 1, 4, 128, "2", "4"
    work = Path(tempfile.mkdtemp(prefix="pswift-schedules-"))
    try:
        cells = [measure(work, args, int(p), int(m))
                 for p in args.stages.split(",") for m in args.micro_batches.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = "; ".join(
        f"{c['stages']} stages x {c['micro_batches']}: ZB-H1/1F1B {c['ratio']:.3f} (90 % interval "
        f"{c['ratio_interval'][0]:.3f}-{c['ratio_interval'][1]:.3f}; rounds "
        f"{min(c['round_ratios']):.3f}-{max(c['round_ratios']):.3f}; simulated {c['predicted_ratio']:.3f} "
        f"uniform, {c['job_predicted_ratio'] or float('nan'):.3f} on the job's measured F/B/W "
        f"(measured gain {c['gain_share'] if c['gain_share'] is not None else float('nan'):.0%} of it), "
        f"{c['job_as_run_ratio'] or float('nan'):.3f} in the order the engine runs (the step model's); "
        f"step model error 1F1B {c['model_error']['1f1b']:+.0%}, ZB-H1 {c['model_error']['zb-h1']:+.0%}"
        + (", stages share cores" if c["shares_cores"] else "") + ")" for c in cells)
    figures += f"; {args.rounds} alternated rounds of {args.steps} steps, hidden {args.hidden}"
    benchlib.save(args.out, {"cells": cells}, quick=args.quick,
                  what="1F1B vs ZB-H1 in DeepSpeed's engine (bench/schedules.py)", figures=figures)


if __name__ == "__main__":
    main()
