"""The plan: one pipeline layout per node count the job may get, written as versioned plan.json.

plan.json is the only contract between the login node and the job: the in-job launcher reads
it, picks the layout for the node count Slurm actually allocated, and trains. Invariants are
checked here, where layouts are built, with all the numbers and the fix in the message.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import LIMITS, TrainConfig
from .errors import ConfigError
from .partition import PartitionError, balanced_boundaries, uniform_boundaries

if TYPE_CHECKING:
    from .planner import PlanResult

PLAN_VERSION = 1
#: Slurm checks time limits periodically: --signal may arrive up to about a minute off
SIGNAL_SLACK_S = 60


@dataclass(frozen=True)
class Layout:
    nodes: int
    tasks_per_node: int
    world_size: int
    stages: int
    data_parallel: int
    micro_batches: int
    micro_batch_size: int
    #: explicit boundaries [0, b1, ..., n_layers]; None = let the job compute them by ``partition``
    boundaries: list[int] | None
    #: how boundaries were chosen: explicit | uniform | cost | parameters
    partition: str


def layout_for(cfg: TrainConfig, nodes: int) -> Layout:
    """The layout for ``nodes`` allocated nodes; ConfigError names the numbers and the fix."""
    r, p, t = cfg.resources, cfg.pipeline, cfg.training
    world = nodes * r.tasks_per_node
    slots = f"{nodes} node(s) x tasks_per_node {r.tasks_per_node} = {world} task slots"
    if p.stages == "auto":
        dp = p.data_parallel or 1
        if world % dp:
            raise ConfigError(f"[pipeline] data_parallel = {dp} does not divide the {slots}; "
                              f"choose a divisor of {world}")
        stages = world // dp
    else:
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
    n_layers = cfg.layer_count
    if n_layers is not None and stages > n_layers:
        raise ConfigError(f"{stages} stages > {n_layers} layers on {slots}: every stage needs a "
                          f"layer; give fewer nodes/tasks or set data_parallel")
    mbs, gbs = t.micro_batch_size, t.global_batch_size
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
        raise ConfigError(f"{m} micro-batches per step on {slots}: pswift plans at most "
                          f"{LIMITS['micro_batches']}; raise micro_batch_size or lower global_batch_size")
    bounds, how = _boundaries(cfg, stages)
    return Layout(nodes=nodes, tasks_per_node=r.tasks_per_node, world_size=world, stages=stages,
                  data_parallel=dp, micro_batches=m, micro_batch_size=mbs, boundaries=bounds,
                  partition=how)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _boundaries(cfg: TrainConfig, stages: int) -> tuple[list[int] | None, str]:
    part = cfg.pipeline.partition
    n_layers = cfg.layer_count
    if isinstance(part, tuple):
        if len(part) - 1 != stages:
            raise ConfigError(f"[pipeline] partition {list(part)} has {len(part) - 1} stages but this "
                              f"layout needs {stages}; drop the explicit boundaries or fix the nodes")
        return list(part), "explicit"
    costs = cfg.model.layer_costs
    if part == "auto" and costs is not None:
        try:
            return balanced_boundaries(costs, stages, cfg.model.layer_memory), "cost"
        except PartitionError as e:
            raise ConfigError(f"[model] layer_costs: {e}") from None
    if part == "uniform" and n_layers is not None:
        return uniform_boundaries(n_layers, stages), "uniform"
    if part == "uniform":
        return None, "uniform"
    return None, "parameters"  # 'parameters', or 'auto' without cost hints: DeepSpeed balances params


def signal_lead_s(cfg: TrainConfig) -> int | None:
    """Seconds before the time limit to send USR2: the checkpoint estimate plus Slurm's slack,
    at least 10 s and at most half the limit (None without a time limit)."""
    limit = cfg.job.time_seconds
    if limit is None:
        return None
    from .costmodel import checkpoint_seconds
    want = math.ceil(checkpoint_seconds(cfg.model.layer_memory, unknown=10.0) + SIGNAL_SLACK_S)
    return max(10, min(want, limit // 2))


def rule_layouts(cfg: TrainConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """Layouts by the simple rule (stages = slots / data_parallel); ConfigError if none fits."""
    layouts: dict[str, Any] = {}
    infeasible: dict[str, str] = {}
    for n in cfg.resources.node_counts:
        try:
            layouts[str(n)] = asdict(layout_for(cfg, n))
        except ConfigError as e:
            infeasible[str(n)] = str(e)
    if not layouts:
        if len(infeasible) == 1:
            raise ConfigError(next(iter(infeasible.values())))
        raise ConfigError("no node count in [resources] nodes gives a valid layout: " +
                          "; ".join(f"{k} nodes: {v}" for k, v in infeasible.items()))
    return layouts, infeasible


def build_plan(cfg: TrainConfig, run_dir: Path, python: str | None = None,
               planned: "PlanResult | None" = None) -> dict[str, Any]:
    """Layouts for every node count of the range: the planner's best per count when it ran
    (``planned``), else the simple rule. ConfigError if none is feasible."""
    layouts, infeasible = rule_layouts(cfg)
    prediction = None
    candidates: list[dict[str, Any]] = []
    nodes_request = cfg.resources.nodes_spec
    if planned is not None and planned.chosen is not None:
        best = planned.best_per_nodes()
        layouts = {str(n): asdict(c.layout()) for n, c in sorted(best.items())}
        infeasible = {str(c.nodes): c.rejected for c in planned.candidates
                      if c.rejected and str(c.nodes) not in layouts}
        ch = planned.chosen
        e = ch.estimate
        candidates = [c.to_dict() for c in planned.candidates]
        prediction = {"nodes": ch.nodes, "step_s": e.step_s, "jct_s": e.jct_s, "queue_s": e.queue_s,
                      "train_s": e.train_s, "step_source": e.step_source,
                      "profile_source": planned.profile_source}
        lo = cfg.resources.nodes_min
        # waiting for the chosen count: ask exactly it; starting now: up to it (a requeue may
        # then start on fewer when the cluster shrank)
        nodes_request = str(ch.nodes) if e.queue_s > 0 or lo == ch.nodes else f"{lo}-{ch.nodes}"
    t, m, j = cfg.training, cfg.model, cfg.job
    run_dir = Path(run_dir).resolve()
    return {
        "version": PLAN_VERSION,
        "pswift_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "job_name": j.name,
        "partition": j.partition,
        "user": os.environ.get("USER") or os.environ.get("LOGNAME"),
        "run_dir": str(run_dir),
        "config_path": str(cfg.path),
        "python": python or j.python or sys.executable,
        "device": cfg.resources.device,
        "cpus_per_task": cfg.resources.cpus_per_task,
        "max_requeues": j.max_requeues,
        "time_limit_s": j.time_seconds,
        "signal_lead_s": signal_lead_s(cfg),
        "model": {
            "dir": str(cfg.base_dir),
            "entry": m.entry,
            "kwargs": m.kwargs,
            "loss": m.loss,
            "num_layers": cfg.layer_count,
            "layer_costs": list(m.layer_costs) if m.layer_costs else None,
        },
        "training": {
            "steps": t.steps,
            "global_batch_size": t.global_batch_size,
            "micro_batch_size": t.micro_batch_size,
            "data": t.data,
            "seed": t.seed,
            "optimizer": t.optimizer,
            "ds_config": t.ds_config,
            "gradient_clipping": t.gradient_clipping,
            "checkpoint_dir": str(t.checkpoint_dir or run_dir / "checkpoints"),
            "checkpoint_interval": t.checkpoint_interval,
            "keep_checkpoints": t.keep_checkpoints,
            "hang_timeout_factor": t.hang_timeout_factor,
            "hang_timeout_min_s": t.hang_timeout_min_s,
        },
        "layouts": layouts,
        "infeasible": infeasible,
        "prediction": prediction,
        "candidates": candidates,
        "nodes_request": nodes_request,
    }


def write_plan(plan: dict[str, Any], path: Path) -> None:
    Path(path).write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_plan(path: Path) -> dict[str, Any]:
    try:
        plan = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such plan file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not a valid plan.json ({e})") from None
    if plan.get("version") != PLAN_VERSION:
        raise ConfigError(f"{path}: plan version {plan.get('version')!r}, this pipeswift reads "
                          f"version {PLAN_VERSION}; re-plan with this version's `pswift sbatch`")
    return plan
