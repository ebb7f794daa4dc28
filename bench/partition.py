"""Partition benchmark: bottleneck stage time of pswift's partitioner vs the exact optimum and
DeepSpeed's `parameters` and `uniform` methods, on an embedding + LM-head-heavy GPT profile;
and the partitioner's speed at 1,000 layers x 64 stages (against a plain O(n) pass, same run).

Profile (per micro-batch, relative units): a GPT with a 50k vocabulary and hidden size 2048:
the embedding holds many parameters but costs little time (a lookup); each block costs ~12h^2
per token; the LM head costs ~2hV per token and holds V x h parameters. Balancing by
parameters therefore overloads the stage with the head (or starves the one with the embedding).

    python bench/partition.py [--out bench/results/partition.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from pipeswift_slurm.planning.partition import balanced_boundaries, stage_sums  # noqa: E402


def gpt_profile(blocks: int, h: int = 2048, vocab: int = 50_000) -> tuple[list[float], list[int]]:
    time_ = [0.02 * h] + [12.0 * h * h / 1e6] * blocks + [2.0 * h * vocab / 1e6]
    params = [vocab * h] + [12 * h * h] * blocks + [vocab * h]
    return time_, params


def exact(costs: list[float], P: int) -> float:
    n = len(costs)
    return min(max(stage_sums(costs, [0, *c, n])) for c in combinations(range(1, n), P - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "partition.json"))
    ap.add_argument("--quick", action="store_true", help="100 layers x 8 stages (CI: the bench still runs)")
    args = ap.parse_args()
    from deepspeed.runtime.utils import partition_balanced, partition_uniform

    rows = []
    for blocks, P in ((6, 2), (6, 4), (14, 4), (22, 8), (30, 8)):
        costs, params = gpt_profile(blocks)
        ours = max(stage_sums(costs, balanced_boundaries(costs, P)))
        opt = exact(costs, P) if len(costs) <= 24 else ours
        by_params = [int(x) for x in partition_balanced(params, P)]
        uni = [int(x) for x in partition_uniform(len(costs), P)]
        row = {"layers": len(costs), "stages": P, "pswift": ours, "exact": opt,
               "deepspeed_parameters": max(stage_sums(costs, by_params)),
               "deepspeed_uniform": max(stage_sums(costs, uni)),
               "exact_checked": len(costs) <= 24}
        row["parameters_vs_pswift"] = row["deepspeed_parameters"] / ours
        row["uniform_vs_pswift"] = row["deepspeed_uniform"] / ours
        rows.append(row)
        print(f"{len(costs):3d} layers / {P} stages: bottleneck pswift {ours:8.2f} (exact {opt:8.2f}), "
              f"parameters {row['deepspeed_parameters']:8.2f} ({row['parameters_vs_pswift']:.2f}x), "
              f"uniform {row['deepspeed_uniform']:8.2f} ({row['uniform_vs_pswift']:.2f}x)")

    import random
    random.seed(1)
    layers, stages = (100, 8) if args.quick else (1000, 64)
    big = [random.uniform(0.5, 2.0) for _ in range(layers)]
    mem = [random.randint(1, 100) for _ in range(layers)]
    reps = 20
    t = time.perf_counter()
    for _ in range(reps):
        balanced_boundaries(big, stages)
    ms = (time.perf_counter() - t) / reps * 1000
    t = time.perf_counter()
    for _ in range(reps):
        balanced_boundaries(big, stages, mem, 2000)
    ms_mem = (time.perf_counter() - t) / reps * 1000
    t = time.perf_counter()
    for _ in range(reps):
        sum(big)  # one plain pass over the costs: the floor any partitioner pays
    one_pass = (time.perf_counter() - t) / reps * 1000
    speed = {"layers": layers, "stages": stages, "ms": ms, "ms_with_memory_cap": ms_mem,
             "one_pass_ms": one_pass, "ratio_to_one_pass": ms / one_pass}
    print(f"{layers} layers x {stages} stages: {ms:.2f} ms ({ms_mem:.2f} ms with a memory cap); "
          f"{speed['ratio_to_one_pass']:.0f}x one pass over the costs")
    exact_ok = all(abs(r["pswift"] - r["exact"]) <= 1e-9 * r["exact"] for r in rows if r["exact_checked"])
    benchlib.save(args.out, {"benchmark": "partition", "profiles": rows, "speed": speed}, quick=args.quick,
                  what=f"bottleneck stage on embedding+LM-head-heavy GPT profiles vs the exact optimum "
                       f"(brute force up to 24 layers) and DeepSpeed's `parameters`/`uniform`; speed at "
                       f"{layers} layers × {stages} stages vs one pass over the costs",
                  figures=f"{'always exact' if exact_ok else 'NOT always exact'}; `parameters` up to "
                          f"{max(r['parameters_vs_pswift'] for r in rows):.2f}×, `uniform` up to "
                          f"{max(r['uniform_vs_pswift'] for r in rows):.2f}× the optimum; {ms:.2f} ms "
                          f"({ms_mem:.2f} ms with a memory cap)")


if __name__ == "__main__":
    main()
