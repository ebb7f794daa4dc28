"""1F1B against ZB-H1 as DeepSpeed's engine runs them (issue 41, item 4): the same job through
`pswift run`, 2 stages, m micro-batches, `[pipeline] schedule` the only difference, in alternated
rounds (who goes first alternates), each its own processes, one per stage.

Figures per m: the median over rounds of each run's median step time, ZB-H1 / 1F1B, against the
ratio `pswift simulate` predicts for the stages' measured forward and backward times with the
weight gradient taken as half the backward (the simulator's default when W is not measured).
Both schedules must train the same numbers (fp32: the same losses bit for bit), or the bench
stops. 4 stages are not measured: on this 2-core host they would share cores.

    python bench/schedules.py [--rounds 4] [--steps 30] [--hidden 256] [--micro-batches 4,8] [--quick]
"""

from __future__ import annotations

import argparse
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


def job(dst: Path, steps: int, hidden: int, micro_batches: int, schedule: str) -> Path:
    toml = overhead.example(dst, steps, hidden)
    text = toml.read_text()
    mbs = GLOBAL_BATCH // micro_batches
    for old, new in (("micro_batch_size = 8", f"micro_batch_size = {mbs}"),
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


def measure(work: Path, args: argparse.Namespace, m: int) -> dict:
    tomls = {s: job(work / f"{s}-{m}", args.steps, args.hidden, m, s) for s in ("1f1b", "zb-h1")}
    rounds = []
    for r in range(args.rounds):
        order = ("1f1b", "zb-h1") if r % 2 == 0 else ("zb-h1", "1f1b")
        got = {s: overhead.run_pswift(tomls[s], work) for s in order}
        if got["1f1b"]["losses"] != got["zb-h1"]["losses"]:
            raise SystemExit(f"m={m}: ZB-H1 trained other numbers than 1F1B: not the same job")
        rounds.append({s: statistics.median(g["step_times"]) for s, g in got.items()})
        print(f"m={m} round {r + 1}/{args.rounds}: step {rounds[-1]['zb-h1']:.4f} s (ZB-H1) vs "
              f"{rounds[-1]['1f1b']:.4f} s (1F1B)", flush=True)
    ratio = statistics.median(x["zb-h1"] for x in rounds) / statistics.median(x["1f1b"] for x in rounds)
    ratios = [x["zb-h1"] / x["1f1b"] for x in rounds]
    return {"micro_batches": m, "stages": 2, "rounds": rounds, "ratio": ratio, "round_ratios": ratios,
            "predicted_ratio": predicted_ratio(2, m)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--micro-batches", default="4,8")
    ap.add_argument("--quick", action="store_true", help="one round of 4 steps at hidden 128, m = 4")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "schedules.json"))
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.hidden, args.micro_batches = 1, 4, 128, "4"
    work = Path(tempfile.mkdtemp(prefix="pswift-schedules-"))
    try:
        cells = [measure(work, args, int(m)) for m in args.micro_batches.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = "; ".join(
        f"2 stages x {c['micro_batches']}: ZB-H1/1F1B {c['ratio']:.3f} (rounds {min(c['round_ratios']):.3f}-"
        f"{max(c['round_ratios']):.3f}; simulated {c['predicted_ratio']:.3f})" for c in cells)
    figures += f"; {args.rounds} alternated rounds of {args.steps} steps, hidden {args.hidden}"
    benchlib.save(args.out, {"cells": cells}, quick=args.quick,
                  what="1F1B vs ZB-H1 in DeepSpeed's engine (bench/schedules.py)", figures=figures)


if __name__ == "__main__":
    main()
