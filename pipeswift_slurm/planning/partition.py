"""Contiguous stage boundaries that minimise the slowest stage (optionally under a memory cap).

Pure functions, no I/O. ``balanced_boundaries(costs, P)`` returns ``[0, b1, ..., n]`` such that
the maximum per-stage sum of ``costs`` is minimal (to 1e-12 relative), every stage non-empty and,
when ``memory``/``memory_cap`` are given, every stage's memory within the cap.
"""

from __future__ import annotations

import functools

from itertools import accumulate
from typing import Sequence


class PartitionError(ValueError):
    """No partition satisfies the request (more stages than layers, a layer over the memory cap...)."""


def stage_sums(values: Sequence[float], boundaries: Sequence[int]) -> list[float]:
    return [sum(values[a:b]) for a, b in zip(boundaries, boundaries[1:])]


def _greedy(costs: Sequence[float], limit: float, memory: Sequence[float] | None,
            cap: float | None) -> list[int]:
    """Fewest contiguous stages with cost <= limit (and memory <= cap): extend each as far as it goes."""
    bounds = [0]
    cur = mem = 0.0
    for i, c in enumerate(costs):
        m = memory[i] if memory is not None else 0.0
        if i > bounds[-1] and (cur + c > limit or (cap is not None and mem + m > cap)):
            bounds.append(i)
            cur = mem = 0.0
        cur += c
        mem += m
    bounds.append(len(costs))
    return bounds


def _split_to(bounds: list[int], costs: Sequence[float], stages: int) -> list[int]:
    """Split the costliest multi-layer stages until there are ``stages`` (never raises the max)."""
    bounds = list(bounds)
    while len(bounds) - 1 < stages:
        best = max((j for j in range(len(bounds) - 1) if bounds[j + 1] - bounds[j] > 1),
                   key=lambda j: sum(costs[bounds[j]:bounds[j + 1]]))
        a, b = bounds[best], bounds[best + 1]
        # cut where the left part is closest to half the stage
        half = sum(costs[a:b]) / 2
        run, cut = 0.0, a + 1
        for k in range(a, b - 1):
            run += costs[k]
            cut = k + 1
            if run >= half:
                break
        bounds.insert(best + 1, cut)
    return bounds


def balanced_boundaries(costs: Sequence[float], stages: int, memory: Sequence[float] | None = None,
                        memory_cap: float | None = None) -> list[int]:
    """The exact min-max boundaries (memoised: the planner asks the same stage count for every
    node count of a range)."""
    return list(_balanced(tuple(costs), stages, None if memory is None else tuple(memory), memory_cap))


@functools.lru_cache(maxsize=1024)
def _balanced(costs: tuple[float, ...], stages: int, memory: tuple[float, ...] | None,
              memory_cap: float | None) -> tuple[int, ...]:
    return tuple(_balanced_boundaries(costs, stages, memory, memory_cap))


def _balanced_boundaries(costs: Sequence[float], stages: int, memory: Sequence[float] | None = None,
                         memory_cap: float | None = None) -> list[int]:
    n = len(costs)
    if stages < 1:
        raise PartitionError(f"stages = {stages} must be >= 1")
    if stages > n:
        raise PartitionError(f"{stages} stages > {n} layers: every stage needs a layer; use <= {n}")
    if any(c < 0 for c in costs):
        raise PartitionError("layer costs must be >= 0")
    if memory is not None and len(memory) != n:
        raise PartitionError(f"{len(memory)} memory values for {n} layers: give one per layer")
    if memory_cap is not None:
        if memory is None:
            raise PartitionError("a memory cap needs per-layer memory values")
        worst = max(range(n), key=lambda i: memory[i])
        if memory[worst] > memory_cap:
            raise PartitionError(f"layer {worst} alone needs {memory[worst]:g} > memory cap "
                                 f"{memory_cap:g}: raise the cap or split that layer")
    total = float(sum(costs))
    lo, hi = max(costs, default=0.0), total
    best = _greedy(costs, hi, memory, memory_cap)
    if len(best) - 1 > stages:
        need = len(best) - 1
        raise PartitionError(f"the memory cap {memory_cap:g} needs at least {need} stages, "
                             f"asked for {stages}: use {need} or more stages or raise the cap")
    hi = max(stage_sums(costs, best))
    if _ok(costs, lo, memory, memory_cap, stages):
        hi, best = lo, _greedy(costs, lo, memory, memory_cap)
    else:
        while hi - lo > 1e-12 * max(hi, 1e-300):
            mid = (lo + hi) / 2
            b = _greedy(costs, mid, memory, memory_cap)
            if len(b) - 1 <= stages:
                best, hi = b, max(stage_sums(costs, b))
            else:
                lo = mid
    return _split_to(best, costs, stages)


def _ok(costs: Sequence[float], limit: float, memory: Sequence[float] | None, cap: float | None,
        stages: int) -> bool:
    return len(_greedy(costs, limit, memory, cap)) - 1 <= stages


def uniform_boundaries(n_layers: int, stages: int) -> list[int]:
    """Equal layer counts per stage (the first ``n % stages`` stages get one more)."""
    if stages > n_layers:
        raise PartitionError(f"{stages} stages > {n_layers} layers")
    q, r = divmod(n_layers, stages)
    return [0, *accumulate(q + (1 if s < r else 0) for s in range(stages))]
