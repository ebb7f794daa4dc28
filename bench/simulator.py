"""Simulator speed: 64 stages x 512 micro-batches per schedule, against a bare loop that only
visits the same number of operations (the floor for any event-by-event simulator), same run.

    python bench/simulator.py [--out bench/results/simulator.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeswift_slurm.planning.simulate import simulate  # noqa: E402


def best_of(fn, n: int = 3) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "simulator.json"))
    ap.add_argument("--quick", action="store_true", help="8 stages x 32 micro-batches (CI: the bench still runs)")
    args = ap.parse_args()
    P, m = (8, 32) if args.quick else (64, 512)
    fwd, bwd = [1.0] * P, [2.0] * P
    ops = 2 * P * m
    floor = best_of(lambda: sum(1 for _ in range(ops)))
    res = {"benchmark": "simulator", "stages": P, "micro_batches": m, "bare_loop_s": floor, "schedules": {}}
    for sch, kw in (("gpipe", {}), ("1f1b", {}), ("interleaved", {"chunks": 2}), ("zb-h1", {})):
        t = best_of(lambda: simulate(fwd, bwd, m, sch, keep_ops=False, **kw))
        res["schedules"][sch] = {"seconds": t, "vs_bare_loop": t / floor}
        print(f"{sch:12s} {P} x {m}: {t * 1000:7.1f} ms ({t / floor:.0f}x a bare loop over the ops)")
    names = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved (v=2)", "zb-h1": "zero-bubble"}
    benchlib.save(args.out, res, quick=args.quick,
                  what=f"{P} stages × {m} micro-batches per schedule vs a bare loop over the same "
                       f"number of operations (best of repeats)",
                  figures=", ".join(f"{names[k]} {v['seconds'] * 1000:.0f} ms ({v['vs_bare_loop']:.0f}×)"
                                    for k, v in res["schedules"].items()))


if __name__ == "__main__":
    main()
