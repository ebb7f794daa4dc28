"""The layout rules, in one place: which pipeline layouts a train.toml allows on a node count.

A layout is (nodes, tasks per node, stages P, data-parallel DP, micro-batches m, micro-batch
size, boundaries). The rules: P x DP = nodes x tasks_per_node; micro_batch_size x m x DP =
global_batch_size; P <= layers; m <= LIMITS; explicit boundaries have P stages. Every refusal
names the numbers and the fix. Two askers: :func:`layout_for` (the TOML's own rule, one layout
per node count: what plan.json holds when the planner does not choose) and :func:`splits` with
:func:`check` (every (P, DP) the planner estimates).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from pipeswift_slurm.config import TrainConfig
from pipeswift_slurm.settings import LIMITS
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.planning.partition import PartitionError, balanced_boundaries, uniform_boundaries


class Layout(NamedTuple):
    nodes: int
    tasks_per_node: int
    world_size: int
    stages: int
    data_parallel: int
    micro_batches: int
    micro_batch_size: int
    #: explicit boundaries [0, b1, ..., n_layers]; None = let the job compute them by ``partition``
    boundaries: list[int] | None
    #: how boundaries were chosen: explicit | uniform | cost | parameters | measured (an in-job
    #: re-layout cut them from the job's measured layer times)
    partition: str


def _slots(cfg: TrainConfig, nodes: int) -> str:
    world = nodes * cfg.resources.tasks_per_node
    return f"{nodes} node(s) x tasks_per_node {cfg.resources.tasks_per_node} = {world} task slots"


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def splits(cfg: TrainConfig, nodes: int) -> list[tuple[int, int]]:
    """Every (P, DP) with P x DP = the task slots that the TOML's stages / data_parallel allow."""
    world = nodes * cfg.resources.tasks_per_node
    p = cfg.pipeline
    return [(P, world // P) for P in _divisors(world)
            if (p.stages == "auto" or P == p.stages)
            and (p.data_parallel is None or world // P == p.data_parallel)]


def micro_batch_sizes(cfg: TrainConfig, dp: int) -> list[int]:
    """The micro-batch sizes the TOML allows with DP data-parallel replicas: each of its options
    that divides the batch into at most LIMITS micro-batches (and gives [pipeline] micro_batches
    when that is fixed). A single size is returned as is: :func:`micro_batches` says what is
    wrong with it."""
    t, p = cfg.training, cfg.pipeline
    options = t.micro_batch_options
    if len(options) == 1:
        return list(options)
    ok = [mbs for mbs in options if t.global_batch_size % (mbs * dp) == 0
          and t.global_batch_size // (mbs * dp) <= LIMITS["micro_batches"]
          and (p.micro_batches == "auto" or mbs * int(p.micro_batches) * dp == t.global_batch_size)]
    return ok or [options[0]]


def rule_micro_batch_size(cfg: TrainConfig, stages: int, dp: int) -> int:
    """The TOML's own choice among its sizes when no profile can weigh them: the largest with
    m >= 2 x stages (a 1F1B bubble under a third), else the smallest."""
    sizes = sorted(micro_batch_sizes(cfg, dp))
    gbs = cfg.training.global_batch_size
    deep = [mbs for mbs in sizes if gbs // (mbs * dp) >= 2 * stages]
    return deep[-1] if deep else sizes[0]


def micro_batches(cfg: TrainConfig, dp: int, mbs: int | None = None) -> int:
    """m for DP data-parallel replicas of micro-batches of ``mbs`` (default the TOML's); ConfigError
    with the fix when the batch does not divide."""
    t, p = cfg.training, cfg.pipeline
    mbs, gbs = mbs or t.micro_batch_size, t.global_batch_size
    if p.micro_batches == "auto":
        if gbs % (mbs * dp):
            raise ConfigError(f"global_batch_size {gbs} is not divisible by micro_batch_size {mbs} x "
                              f"data_parallel {dp} = {mbs * dp}: make the global batch a multiple "
                              f"of {mbs * dp}")
        m = gbs // (mbs * dp)
    else:
        m = int(p.micro_batches)
        if mbs * m * dp != gbs:
            fix = (f"set micro_batches = {gbs // (mbs * dp)}" if gbs % (mbs * dp) == 0
                   else f"set global_batch_size = {mbs * m * dp}")
            raise ConfigError(f"micro_batch_size {mbs} x micro_batches {m} x data_parallel {dp} = "
                              f"{mbs * m * dp} != global_batch_size {gbs}; {fix}")
    if m > LIMITS["micro_batches"]:
        raise ConfigError(f"{m} micro-batches per step: pswift plans at most "
                          f"{LIMITS['micro_batches']}; raise micro_batch_size or lower global_batch_size")
    return m


def check(cfg: TrainConfig, nodes: int, stages: int, dp: int, n_layers: int | None,
          mbs: int | None = None) -> int:
    """m of the layout (nodes, P, DP, micro-batch size) after every rule; ConfigError says which
    rule fails."""
    if n_layers is not None and stages > n_layers:
        raise ConfigError(f"{stages} stages > {n_layers} layers on {_slots(cfg, nodes)}: every stage "
                          f"needs a layer; give fewer nodes/tasks or set data_parallel")
    part = cfg.pipeline.partition
    if isinstance(part, tuple) and len(part) - 1 != stages:
        raise ConfigError(f"[pipeline] partition {list(part)} has {len(part) - 1} stages but this "
                          f"layout needs {stages}; drop the explicit boundaries or fix the nodes")
    return micro_batches(cfg, dp, mbs)


def _rule_split(cfg: TrainConfig, nodes: int) -> tuple[int, int]:
    """The TOML's own (P, DP): stages as given (DP fills the slots), or as many stages as the
    slots allow after data_parallel; ConfigError with the choices that would fit."""
    p = cfg.pipeline
    world = nodes * cfg.resources.tasks_per_node
    slots = _slots(cfg, nodes)
    if p.stages == "auto":
        dp = p.data_parallel or 1
        if world % dp:
            raise ConfigError(f"[pipeline] data_parallel = {dp} does not divide the {slots}; "
                              f"choose a divisor of {world}")
        return world // dp, dp
    stages = int(p.stages)
    dp = p.data_parallel or max(1, world // stages)
    if stages * dp != world:
        if p.data_parallel is None:
            fix = f"use stages in {{{', '.join(str(d) for d in _divisors(world))}}}"
        elif world % p.data_parallel == 0:
            fix = f"with data_parallel = {p.data_parallel} use stages = {world // p.data_parallel}"
        else:
            fix = f"data_parallel = {p.data_parallel} must divide {world}"
        raise ConfigError(f"pp x dp must equal the world size: stages {stages} x data_parallel "
                          f"{dp} = {stages * dp}, but the job has {slots}; {fix}")
    return stages, dp


def layout_for(cfg: TrainConfig, nodes: int) -> Layout:
    """The layout for ``nodes`` allocated nodes by the TOML's own rule; ConfigError names the
    numbers and the fix."""
    stages, dp = _rule_split(cfg, nodes)
    mbs = rule_micro_batch_size(cfg, stages, dp)
    m = check(cfg, nodes, stages, dp, cfg.layer_count, mbs)
    bounds, how = _boundaries(cfg, stages)
    r = cfg.resources
    return Layout(nodes=nodes, tasks_per_node=r.tasks_per_node, world_size=nodes * r.tasks_per_node,
                  stages=stages, data_parallel=dp, micro_batches=m,
                  micro_batch_size=mbs, boundaries=bounds, partition=how)


def _boundaries(cfg: TrainConfig, stages: int) -> tuple[list[int] | None, str]:
    part = cfg.pipeline.partition
    n_layers = cfg.layer_count
    if isinstance(part, tuple):
        return list(part), "explicit"
    costs = cfg.model.layer_costs
    if part == "auto" and costs is not None:
        try:
            return list(balanced_boundaries(costs, stages, cfg.model.layer_memory)), "cost"
        except PartitionError as e:
            raise ConfigError(f"[model] layer_costs: {e}") from None
    if part == "uniform" and n_layers is not None:
        return uniform_boundaries(n_layers, stages), "uniform"
    if part == "uniform":
        return None, "uniform"
    return None, "parameters"  # 'parameters', or 'auto' without cost hints: DeepSpeed balances params


def rule_layouts(cfg: TrainConfig) -> tuple[dict[str, Layout], dict[str, str]]:
    """Layouts by the TOML's rule for every node count of the range, and why the others fail;
    ConfigError if none fits."""
    layouts: dict[str, Layout] = {}
    infeasible: dict[str, str] = {}
    for n in cfg.resources.node_counts:
        try:
            layouts[str(n)] = layout_for(cfg, n)
        except ConfigError as e:
            infeasible[str(n)] = str(e)
    if not layouts:
        if len(infeasible) == 1:
            raise ConfigError(next(iter(infeasible.values())))
        raise ConfigError("no node count in [resources] nodes gives a valid layout: " +
                          "; ".join(f"{k} nodes: {v}" for k, v in infeasible.items()))
    return layouts, infeasible
