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
the same in the order the engine runs (the planner's step model of this job); then that order
with the 1F1B side from the 1F1B run's own F and whole backward (so what the split itself costs,
the autograd function around each Linear and the weight pass apart, is counted: `split_cost`,
the stages' F + B + W under ZB-H1 over their F + backward under 1F1B); and
each schedule's measured step
against the step its plan.json predicted in the last round (the planner's step model, calibrated
by the earlier rounds of that schedule: each schedule keeps its own history). Both schedules must
train the same numbers (fp32: the same losses bit for bit), or the bench stops. With more stages
than cores (4 on a 2-core host) the stages share cores: the figures then say so, and add the
ratio simulated with the stages sharing the host's cores (as the step model does there), each
schedule on its own passes' CPU time (their wall time stretches with what runs beside them), the
measured gain as a share of it.

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


def stage_passes(instructions: dict[str, dict[str, float]], micro_batches: int, cpu: bool = False
                 ) -> tuple[list[float], list[float], list[float], float] | None:
    """One run's stages, in order, from its instruction timer (its first profiled steps): F,
    the whole backward (B + W) and W per micro-batch (``cpu``: the passes' CPU time, not their
    wall time), and the step's fixed part (optimizer, gradient reduction: the slowest stage's)."""
    stages = [instructions[s] for s in sorted(instructions, key=int)]
    if not stages or (cpu and any("ForwardPass:cpu" not in ins for ins in stages)):
        return None
    at = ":cpu" if cpu else ""
    f = [ins["ForwardPass" + at] / micro_batches for ins in stages]
    w = [ins.get("WeightPass" + at, 0.0) / micro_batches for ins in stages]
    whole = [ins["BackwardPass" + at] / micro_batches + x for ins, x in zip(stages, w)]
    fixed = max(sum(ins.get(k, 0.0) for k in ("OptimizerStep", "ReduceGrads", "ReduceTiedGrads")) for ins in stages)
    return f, whole, w, fixed


def job_predicted_ratio(instructions: dict[str, dict[str, float]], micro_batches: int,
                        as_run: bool = False, one_f1b: dict[str, dict[str, float]] | None = None) -> float | None:
    """ZB-H1 / 1F1B step time by pswift's simulator on this job's own stages: each stage's F, B
    and W per micro-batch from the ZB-H1 run's instruction timer, the step's fixed part added to
    both; ``as_run``: ZB-H1 in the order the engine runs it (the planner's step model), not the
    paper's; ``one_f1b``: the 1F1B side from the 1F1B run's own F and whole backward (what the
    split costs counted), the fixed part the mean of the two runs' (the same optimizer step)."""
    from pipeswift_slurm.planning.simulate import simulate
    zb = stage_passes(instructions, micro_batches)
    if zb is None or any("WeightPass" not in ins for ins in instructions.values()):
        return None
    one = stage_passes(one_f1b, micro_batches) if one_f1b else zb
    if one is None:
        return None
    fixed = (zb[3] + one[3]) / 2
    f, whole, w, _ = zb
    zb_step = simulate(f, whole, micro_batches, "zb-h1", wgrad=w, as_run=as_run).step_time + fixed
    return zb_step / (simulate(one[0], one[1], micro_batches, "1f1b").step_time + fixed)


def shared_ratio(one_f1b: dict[str, dict[str, float]], zb: dict[str, dict[str, float]], micro_batches: int,
                 cores: int, step_1f1b: float) -> float | None:
    """ZB-H1 / 1F1B simulated with the stages sharing this host's ``cores`` (the planner's step
    model where more ranks than cores share a host: a stage's bubble is partly another's work),
    each side on its own run's passes as CPU time (a pass's wall time there stretches with what
    runs beside it; its CPU time is the work the cores must do), the ratio applied to the
    measured 1F1B step less its fixed part."""
    from pipeswift_slurm.planning.simulate import simulate_shared
    one, two = stage_passes(one_f1b, micro_batches, cpu=True), stage_passes(zb, micro_batches, cpu=True)
    if one is None or two is None or any("WeightPass" not in ins for ins in zb.values()):
        return None
    fixed = (one[3] + two[3]) / 2      # the wall time outside the passes, as recorded
    host = [0] * len(one[0])
    if step_1f1b <= fixed:
        return None
    sim = (simulate_shared(two[0], two[1], micro_batches, 0.0, host, cores, wgrad=two[2])
           / simulate_shared(one[0], one[1], micro_batches, 0.0, host, cores))
    return (sim * (step_1f1b - fixed) + fixed) / step_1f1b


def split_cost(one_f1b: dict[str, dict[str, float]], zb: dict[str, dict[str, float]], cpu: bool = False
               ) -> float | None:
    """The stages' F + B + W under ZB-H1 over their F + backward under 1F1B: the compute the
    split itself adds (the autograd function around each Linear, the weight pass apart); ``cpu``:
    in CPU time (None where not recorded)."""
    at = ":cpu" if cpu else ""
    if not one_f1b or not zb or any("ForwardPass" + at not in ins for ins in (*one_f1b.values(), *zb.values())):
        return None

    def compute(instructions: dict[str, dict[str, float]]) -> float:
        return sum(ins["ForwardPass" + at] + ins["BackwardPass" + at] + ins.get("WeightPass" + at, 0.0)
                   for ins in instructions.values())
    return compute(zb) / compute(one_f1b)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _share(ratio: float, simulated: float | None) -> float | None:
    """The measured gain as a share of a simulated one (none where no gain is simulated)."""
    return (1 - ratio) / (1 - simulated) if simulated is not None and simulated < 1 else None


def measure(work: Path, args: argparse.Namespace, p: int, m: int) -> dict:
    tomls = {s: job(work / f"{s}-{p}-{m}", args.steps, args.hidden, p, m, s) for s in ("1f1b", "zb-h1")}
    rounds, planned, profiles = [], {}, []
    for r in range(args.rounds):
        order = ("1f1b", "zb-h1") if r % 2 == 0 else ("zb-h1", "1f1b")
        got = {s: overhead.run_pswift(tomls[s], work, history=work / f"{s}-{p}-{m}.db") for s in order}
        if got["1f1b"]["losses"] != got["zb-h1"]["losses"]:
            raise SystemExit(f"P={p} m={m}: ZB-H1 trained other numbers than 1F1B: not the same job")
        rounds.append({s: statistics.median(g["step_times"]) for s, g in got.items()})
        planned = {s: json.loads(Path(g["plan"]).read_text())["prediction"]["step_s"] for s, g in got.items()}
        profiles.append((got["1f1b"]["instructions"], got["zb-h1"]["instructions"]))
        print(f"P={p} m={m} round {r + 1}/{args.rounds}: step {rounds[-1]['zb-h1']:.4f} s (ZB-H1) vs "
              f"{rounds[-1]['1f1b']:.4f} s (1F1B)", flush=True)
    measured = {s: statistics.median(x[s] for x in rounds) for s in ("1f1b", "zb-h1")}
    ratios = [x["zb-h1"] / x["1f1b"] for x in rounds]
    ratio = statistics.median(ratios)
    job_ratio = _median([job_predicted_ratio(zb, m) for _, zb in profiles])
    own_ratio = _median([job_predicted_ratio(zb, m, as_run=True, one_f1b=one) for one, zb in profiles])
    cores = os.cpu_count() or 1
    shared = (_median([shared_ratio(one, zb, m, cores, x["1f1b"]) for (one, zb), x in zip(profiles, rounds)])
              if p > cores else None)
    return {"micro_batches": m, "stages": p, "rounds": rounds, "ratio": ratio,
            "ratio_interval": benchlib.median_interval(ratios),
            "ratio_of_medians": measured["zb-h1"] / measured["1f1b"],
            "round_ratios": ratios, "predicted_ratio": predicted_ratio(p, m),
            "job_predicted_ratio": job_ratio,
            # the same on the order the engine runs: the planner's step model of this job
            "job_as_run_ratio": _median([job_predicted_ratio(zb, m, as_run=True) for _, zb in profiles]),
            # the measured gain as a share of the gain simulated on this job's own stage times
            "gain_share": _share(ratio, job_ratio),
            # the order the engine runs, 1F1B from its own run's passes: the split's cost counted
            "own_passes_ratio": own_ratio,
            "own_passes_gain_share": _share(ratio, own_ratio),
            "split_cost": _median([split_cost(one, zb) for one, zb in profiles]),
            "split_cost_cpu": _median([split_cost(one, zb, cpu=True) for one, zb in profiles]),
            "measured_step_s": measured,
            "planned_step_s": planned,
            "model_error": {s: planned[s] / measured[s] - 1 for s in measured},
            "shares_cores": p > cores, "cores": cores,
            # where the stages share cores: simulated with them sharing, as the step model does
            "shared_ratio": shared, "shared_gain_share": _share(ratio, shared)}


def _figures(c: dict) -> str:
    def num(x: float | None, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)
    share = c["own_passes_gain_share"]
    own = (f"{num(c['own_passes_ratio'], '.3f')} with 1F1B's own passes (the split costs "
           f"{num(c['split_cost'] and c['split_cost'] - 1, '+.1%')} of F + B; "
           + (f"measured gain {share:.0%} of it)" if share is not None else "no gain simulated)"))
    return (f"{c['stages']} stages x {c['micro_batches']}: ZB-H1/1F1B {c['ratio']:.3f} (90 % interval "
            f"{c['ratio_interval'][0]:.3f}-{c['ratio_interval'][1]:.3f}; rounds "
            f"{min(c['round_ratios']):.3f}-{max(c['round_ratios']):.3f}; simulated {c['predicted_ratio']:.3f} "
            f"uniform, {num(c['job_predicted_ratio'], '.3f')} on the ZB-H1 run's F/B/W "
            f"(measured gain {num(c['gain_share'], '.0%')} of it), "
            f"{num(c['job_as_run_ratio'], '.3f')} in the order the engine runs (the step model's), {own}; "
            f"step model error 1F1B {c['model_error']['1f1b']:+.0%}, ZB-H1 {c['model_error']['zb-h1']:+.0%}"
            + (f", stages share cores: {num(c.get('shared_ratio'), '.3f')} simulated with them sharing "
               f"{c.get('cores')} cores on the passes' CPU time (the split costs "
               f"{num(c.get('split_cost_cpu') and c['split_cost_cpu'] - 1, '+.1%')} of it; measured gain "
               f"{num(c.get('shared_gain_share'), '.0%')} of it)" if c["shares_cores"] else "") + ")")


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
    figures = "; ".join(_figures(c) for c in cells)
    figures += f"; {args.rounds} alternated rounds of {args.steps} steps, hidden {args.hidden}"
    benchlib.save(args.out, {"cells": cells}, quick=args.quick,
                  what="1F1B vs ZB-H1 in DeepSpeed's engine (bench/schedules.py)", figures=figures)


if __name__ == "__main__":
    main()
