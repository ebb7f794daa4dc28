"""Planning the largest config the caps allow vs planning the example, same run, medians.

The caps in `pipeswift_slurm/config.py` (LIMITS: 512 layers, 16 node counts in a range, 16 tasks
per node, 4096 micro-batches) exist so that planning any valid config takes under a second. The
worst case here: 512 layers of unequal costs, nodes [17, 32] x 16 tasks (every stage count that
divides 272..512 slots), a global batch of 65536, all in-process (`pswift plan --no-live`).

    python bench/plan_worst_case.py [--repeats 7] [--quick]
"""

from __future__ import annotations

import argparse
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
EXAMPLE = ROOT / "examples" / "tiny-gpt"


def worst_case(dst: Path) -> Path:
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    toml = dst / "train.toml"
    t = toml.read_text()
    t = re.sub(r"(?m)^nodes = .*$", "nodes = [17, 32]", t)
    t = re.sub(r"(?m)^tasks_per_node = .*$", "tasks_per_node = 16", t)
    t = re.sub(r"(?m)^num_layers = .*$", "num_layers = 512", t)
    t = re.sub(r"(?m)^layer_costs = .*$", "layer_costs = [" + ", ".join(f"0.00{1 + i % 7}" for i in range(512)) + "]", t)
    t = re.sub(r"(?m)^global_batch_size = .*$", "global_batch_size = 65536", t)
    t = re.sub(r"(?m)^micro_batch_size = .*$", "micro_batch_size = 16", t)
    t = re.sub(r"(?m)^data_parallel = .*$", "", t)
    toml.write_text(t)
    return toml


def timed(toml: Path) -> float:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli.main", "plan", "--no-live", "--json", str(toml)],
                          capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"planning {toml} failed: {proc.stderr.strip()}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="2 repeats (CI: the bench still runs)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_worst_case.json"))
    args = ap.parse_args()
    reps = 2 if args.quick else args.repeats
    with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
        big = worst_case(Path(tmp) / "big")
        small = EXAMPLE / "train.toml"
        worst, example = [], []
        for _ in range(reps):              # alternate: drift falls on both alike
            worst.append(timed(big))
            example.append(timed(small))
    res = {"benchmark": "plan_worst_case", "repeats": reps,
           "worst_case_median_s": statistics.median(worst), "example_median_s": statistics.median(example),
           "ratio": statistics.median(worst) / statistics.median(example), "worst_case_s": worst,
           "example_s": example}
    for k in ("worst_case_median_s", "example_median_s", "ratio"):
        print(f"{k}: {res[k]:.3f}")
    benchlib.save(args.out, res, quick=args.quick,
                  what=f"`pswift plan --no-live` of the largest config the caps allow (512 layers, nodes "
                       f"[17, 32] × 16 tasks, global batch 65536) vs of the example, {reps} alternated "
                       f"rounds, interpreter start-up included",
                  figures=f"{res['worst_case_median_s']:.2f} s vs {res['example_median_s']:.2f} s "
                          f"({res['ratio']:.1f}×)")


if __name__ == "__main__":
    main()
