"""A candidate's JCT as a distribution: its 10th, 50th and 90th percentiles (pure functions).

The planner's point estimate is an expectation; two layouts with the same mean can differ a lot
in how late they may finish. Sampled here (seeded, pure Python: the submit path never imports
numpy), each term from what the history knows:

- queue wait: the live estimate when Slurm gave one, else the past waits of that node count
  on the partition (resampled), else the single estimate; setup: this model's past setups
  (resampled) when there are any;
- training: steps x step time x (1 + e), e ~ N(0, r) the step-time model's relative error (the
  history's past predictions when there are at least ``MIN_ERRORS`` of them, else
  ``MODEL_REL_SD`` by how the step time was obtained), plus per-step noise: the measured
  step-time variance over the steps (sqrt(steps) x sd);
- preemptions: Poisson with the partition's measured rate over the training time, each costing
  a restart's setup and the work lost since the last checkpoint (uniform in an interval).

Percentiles of the sum are read from the samples (``stats.quantile``): not the sum of each
term's percentile. ``band_coverage`` says how often actual JCTs fell inside predicted bands.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple, Sequence

from pipeswift_slurm.stats import quantiles

SAMPLES = 2000
#: relative sd of the step time when the history has too few past predictions to measure it:
#: a measured config is its own mean; calibrated and model-only estimates err more (bench:
#: step_time_model measured 5.7 % mean error with the overhead terms, 29 % without)
MODEL_REL_SD = {"measured": 0.02, "calibrated": 0.08, "model": 0.15}
MIN_ERRORS = 3


class Band(NamedTuple):
    p10: float
    p50: float
    p90: float
    #: the 90th percentile of the time the job holds its nodes (the JCT without the queue wait):
    #: what a time limit must cover (pipeswift_slurm.planning.limits)
    run_p90: float | None = None


class JctTerms(NamedTuple):
    """What a candidate's JCT distribution is built from (the planner's estimate + history)."""
    queue_s: float
    setup_s: float
    steps: int
    step_s: float
    checkpoint_s: float
    step_source: str = "model"
    step_var: float | None = None               # measured per-step variance (s^2)
    rel_sd: float | None = None                 # the step model's measured relative error
    queue_samples: Sequence[float] = ()         # past waits, when no live estimate
    setup_samples: Sequence[float] = ()         # past setups of this model
    preemptions_per_s: float = 0.0
    checkpoint_interval_s: float = 0.0          # 0: only signals checkpoint (no work lost)


def step_rel_sd(errors: Sequence[tuple[float, float]]) -> float | None:
    """The step model's relative error from past (predicted, actual) step times: the RMS of
    log(actual / predicted), or None with fewer than MIN_ERRORS usable pairs."""
    logs = [math.log(a / p) for p, a in errors if p and a and p > 0 and a > 0]
    if len(logs) < MIN_ERRORS:
        return None
    return math.sqrt(sum(x * x for x in logs) / len(logs))


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 50:   # normal approximation: exact sampling would loop ~mean times per sample
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    k, p, limit = 0, 1.0, math.exp(-mean)
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def jct_samples(t: JctTerms, n: int = SAMPLES, seed: int = 0) -> list[float]:
    return [queue + held for queue, held in draws(t, n, seed)]


def draws(t: JctTerms, n: int = SAMPLES, seed: int = 0) -> list[tuple[float, float]]:
    """``n`` sampled (queue wait, time on the nodes) pairs of one JCT each."""
    rng = random.Random(seed)
    gauss, choice, uniform01 = rng.gauss, rng.choice, rng.random   # looked up once: every submission plans
    rel = t.rel_sd if t.rel_sd is not None else MODEL_REL_SD.get(t.step_source, MODEL_REL_SD["model"])
    noise = math.sqrt(t.step_var * t.steps) if t.step_var else 0.0
    mean_train, rate, every = t.steps * t.step_s, t.preemptions_per_s, t.checkpoint_interval_s
    queues, setups, checkpoint = t.queue_samples, t.setup_samples, t.checkpoint_s
    out: list[tuple[float, float]] = []
    for _ in range(n):
        queue = choice(queues) if queues else t.queue_s
        setup = choice(setups) if setups else t.setup_s
        train = mean_train * (1.0 + gauss(0.0, rel)) + (gauss(0.0, noise) if noise else 0.0)
        train = train if train > 0.0 else 0.0
        lost = 0.0
        if rate > 0:    # no preemption draws no number
            for _ in range(_poisson(rng, rate * train)):
                lost += setup + uniform01() * every
        out.append((queue, setup + train + checkpoint + lost))
    return out


def jct_band(t: JctTerms, seed: int = 0) -> Band:
    pairs = draws(t, seed=seed)
    p10, p50, p90 = quantiles([q + h for q, h in pairs], (0.1, 0.5, 0.9), clean=True)   # never empty
    (held_p90,) = quantiles([h for _, h in pairs], (0.9,), clean=True)
    assert p10 is not None and p50 is not None and p90 is not None
    return Band(p10, p50, p90, held_p90)


def band_coverage(rows: Sequence[tuple[float | None, float | None, float | None]]) -> tuple[int, int]:
    """(inside, counted) over (p10, p90, actual) rows that have all three."""
    full = [(lo, hi, a) for lo, hi, a in rows if lo is not None and hi is not None and a is not None]
    return sum(1 for lo, hi, a in full if lo <= a <= hi), len(full)
