"""The workload benchmarks' statistics (issue 58), as the HPC scheduling field reports them: JCT
quantiles, bounded slowdown, and the paired ratio of two policies' mean JCT over the same jobs
with a bootstrap interval over seeds and the jobs within them.

- **Bounded slowdown** (Feitelson's): ``max(1, (wait + run) / max(run, tau))`` with ``tau`` =
  10 s, so a job of a few seconds that waited a little does not dominate the mean.
- **Paired ratio**: ``sum(mine) / sum(base)`` over the jobs both policies completed (keyed by
  seed and the trace's job), which is the ratio of their mean JCTs over the same jobs. Its
  interval resamples the seeds with replacement, then each drawn seed's jobs with replacement
  (a two-level bootstrap: windows differ more than jobs within one), a fixed seed, the central
  ``level`` share of the draws.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Hashable, Mapping, Sequence

from pipeswift_slurm.stats import quantiles

#: bounded slowdown's floor on the run time, seconds
TAU_S = 10.0


def bounded_slowdown(wait_s: float, run_s: float, tau_s: float = TAU_S) -> float:
    if wait_s < 0 or run_s < 0:
        raise ValueError(f"a wait ({wait_s}) or run time ({run_s}) below zero")
    return max(1.0, (wait_s + run_s) / max(run_s, tau_s))


def jct_summary(jcts: Sequence[float]) -> dict[str, float | None]:
    """Mean, p50, p90 and p99 of some JCTs (None where there are none)."""
    p50, p90, p99 = quantiles(jcts, (0.5, 0.9, 0.99))
    return {"jct_mean_s": sum(jcts) / len(jcts) if jcts else None, "jct_p50_s": p50, "jct_p90_s": p90,
            "jct_p99_s": p99}


def mean_bsld(waits_and_runs: Sequence[tuple[float, float]]) -> float | None:
    """The mean bounded slowdown of (wait, run) pairs (None where there are none)."""
    slow = [bounded_slowdown(w, r) for w, r in waits_and_runs]
    return sum(slow) / len(slow) if slow else None


Key = tuple[Hashable, Hashable]   # (seed, the trace's job)


def paired_ratio(mine: Mapping[Key, float], base: Mapping[Key, float], level: float = 0.9,
                 draws: int = 2000) -> dict[str, float | int | None]:
    """``mine``'s mean JCT over ``base``'s on the jobs both have, with a two-level bootstrap
    interval (seeds, then jobs within each drawn seed); ``n``: the jobs paired."""
    both = sorted(set(mine) & set(base), key=repr)
    if not both:
        return {"ratio": None, "lo": None, "hi": None, "n": 0}
    by_seed: dict[Hashable, list[Key]] = defaultdict(list)
    for key in both:
        by_seed[key[0]].append(key)
    seeds = sorted(by_seed, key=repr)
    rnd = random.Random(0)
    ratios = []
    for _ in range(draws):
        num = den = 0.0
        for seed in rnd.choices(seeds, k=len(seeds)):
            jobs = by_seed[seed]
            for key in rnd.choices(jobs, k=len(jobs)):
                num, den = num + mine[key], den + base[key]
        if den > 0:
            ratios.append(num / den)
    ratios.sort()
    cut = int(len(ratios) * (1 - level) / 2)
    total = sum(base[k] for k in both)
    return {"ratio": sum(mine[k] for k in both) / total if total > 0 else None,
            "lo": ratios[cut] if ratios else None, "hi": ratios[len(ratios) - 1 - cut] if ratios else None,
            "n": len(both)}
