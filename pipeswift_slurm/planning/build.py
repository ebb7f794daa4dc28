"""plan.json built: from the TOML and the planner's result, the layouts for every node count the
job may get, the chosen one's prediction and time limits, the settings that travel with the job
(pipeswift_slurm.settings). What plan.json holds and how it is read is the contract,
pipeswift_slurm.plan; this is its one writer's logic, which needs the planner."""

from __future__ import annotations

import datetime as _dt
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pipeswift_slurm import __version__, runfiles
from pipeswift_slurm.config import TrainConfig, TrainingSection
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.plan import PLAN_VERSION, LayoutSpec, Plan
from pipeswift_slurm.planning import interval, limits, members
from pipeswift_slurm.planning.costmodel import Hardware, checkpoint_seconds
from pipeswift_slurm.planning.layouts import rule_layouts
from pipeswift_slurm.settings import travelling
from pipeswift_slurm.slurm.sbatch import Limits, SbatchOptions, output_pattern
from pipeswift_slurm.slurm.timespec import slurm_minutes

if TYPE_CHECKING:   # the planner's types only: a plan without its result imports none of it
    from pipeswift_slurm.planning.planner import Candidate, PlanResult


def time_limits(cfg: TrainConfig, planned: "PlanResult | None" = None) -> Limits:
    """--time, --time-min and the USR2 lead ([job] time_policy): from the chosen layout's
    prediction (a run of members: its layout at the node range's bottom; a waiting job whose
    request reaches below its count: the layout at the request's bottom), or [job] time as
    written (always without a prediction)."""
    written = cfg.job.time_seconds
    ckpt_s = checkpoint_seconds(cfg.model.layer_memory, unknown=10.0)   # the lead's: the safer one
    chosen = planned.chosen if planned is not None else None
    if chosen is not None and planned is not None and members.choose(cfg, planned)[0]:
        # a member may train on with the others gone: its limit is the run's at the range's bottom
        chosen = planned.best_per_nodes().get(cfg.resources.nodes_min, chosen)
    elif chosen is not None and planned is not None and chosen.est.queue_s > 0 \
            and planned.request_bottom(cfg.resources.nodes_min) < chosen.nodes:
        # a waiting job that may start (or be requeued) on fewer nodes: its limit covers the fewest
        chosen = planned.best_per_nodes().get(planned.request_bottom(cfg.resources.nodes_min), chosen)
    if chosen is None:
        note = "" if cfg.job.time_policy == "as_written" or written is None else \
            f"[job] time as written ({cfg.job.time}): no prediction, the TOML fixes the split"
        return limits.as_written(written, limits.lead_wanted(ckpt_s), note)
    e = chosen.est
    lead = limits.lead_wanted(ckpt_s, e.step_s)
    if cfg.job.time_policy == "as_written":
        return limits.as_written(written, lead)
    held = e.run_p90_s if e.run_p90_s is not None else e.jct_s - e.queue_s
    return limits.predicted(written, held, e.setup_s, lead, e.checkpoint_every_s)


def limits_of(plan: Plan) -> Limits:
    """The limits plan.json holds (what the batch script asks for)."""
    return Limits(plan["time_limit_s"], plan["time_min_s"], plan["signal_lead_s"], plan["time_why"])


def _chosen(cfg: TrainConfig, planned: "PlanResult") -> dict[str, Any]:
    """plan.json's layouts, rejections, prediction and node request from the planner's result."""
    best = planned.best_per_nodes()
    ch = planned.chosen
    if ch is None:
        raise ValueError("no layout was chosen: nothing to write in plan.json")
    e = ch.est
    return {
        "layouts": _layouts_of(best),
        "infeasible": {str(c.nodes): c.rejected for c in planned.candidates
                       if c.rejected and c.nodes not in best},
        "candidates": [c.to_dict() for c in planned.candidates],
        "prediction": {"nodes": ch.nodes, "step_s": e.step_s, "jct_s": e.jct_s, "queue_s": e.queue_s,
                       "train_s": e.train_s, "step_source": e.step_source, "model_step_s": e.model_step_s,
                       "jct_p10_s": e.jct_p10_s, "jct_p50_s": e.jct_p50_s, "jct_p90_s": e.jct_p90_s,
                       "node_hours": e.node_hours, "choice": planned.choice,
                       "objective": cfg.job.objective, "profile_source": planned.profile_source,
                       "checkpoint_cost_s": planned.checkpoint_cost_s},
        "nodes_request": nodes_request(cfg, ch.nodes, planned.request_bottom(cfg.resources.nodes_min)),
        "device_memory": planned.hardware.device_memory if planned.hardware else None,
        "host_cores": planned.hardware.host_cores if planned.hardware else None,
        "ranks_per_host": planned.hardware.ranks_per_host if planned.hardware else None,
        **_links(planned.hardware or Hardware()),
    }


def _links(hw: Hardware) -> dict[str, float]:
    return {"p2p_latency": hw.p2p_latency, "p2p_bandwidth": hw.p2p_bandwidth}


def _layouts_of(best: "dict[int, Candidate]") -> dict[str, LayoutSpec]:
    """plan.json's layouts from a planner's best candidate per node count."""
    return {str(n): c.layout._asdict() for n, c in sorted(best.items())}


def _partition_layouts(planned: "PlanResult | None") -> dict[str, dict[str, LayoutSpec]]:
    """plan.json's ``partition_layouts``: each other partition's layouts where they differ."""
    if planned is None or planned.chosen is None or not planned.other_partitions:
        return {}
    mine = _layouts_of(planned.best_per_nodes())
    theirs = {name: _layouts_of(res.best_per_nodes()) for name, res in planned.other_partitions.items() if res.chosen is not None}
    return {name: lay for name, lay in theirs.items() if lay != mine}


def nodes_request(cfg: TrainConfig, chosen: int, bottom: int) -> str:
    """sbatch's --nodes for the chosen count, from ``bottom`` (PlanResult.request_bottom: the
    range's minimum when the job starts now, so it still starts when the cluster shrank
    meanwhile; waiting, the chosen count, or fewer where Slurm requeues a preemption with this
    request). With a node range in the TOML always as a range (``4-4``): the batch script then
    asks CPUs per node rather than tasks per node, so that a requeued attempt's request can be
    changed (pipeswift_launch.grow)."""
    lo, hi = cfg.resources.nodes_min, cfg.resources.nodes_max
    if lo == hi:
        return str(chosen)
    return f"{min(max(bottom, lo), chosen)}-{chosen}"


def _sections(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
    """plan.json's model and training sections: what the job needs of the TOML."""
    t, m = cfg.training, cfg.model
    return {
        "model": {"dir": str(cfg.base_dir), "entry": m.entry, "kwargs": m.kwargs, "loss": m.loss,
                  "num_layers": cfg.layer_count,
                  "layer_costs": list(m.layer_costs) if m.layer_costs else None},
        "training": _training_section(t, run_dir),
    }


def _training_section(t: TrainingSection, run_dir: Path) -> dict[str, Any]:
    """plan.json's training section: the travelling settings (pipeswift_slurm.settings), with the
    checkpoint folder made absolute and "auto"'s interval left to checkpoint_auto."""
    section = {s.key: getattr(t, s.key) for s in travelling("training")}
    section["checkpoint_dir"] = str(t.checkpoint_dir or run_dir / runfiles.CHECKPOINTS)
    section["checkpoint_interval"] = t.checkpoint_interval if isinstance(t.checkpoint_interval, int) else 0
    return section


def build_plan(cfg: TrainConfig, run_dir: Path, python: str | None = None,
               planned: "PlanResult | None" = None) -> Plan:
    """Layouts for every node count of the range: the planner's best per count when it ran
    (``planned``), else the TOML's rule. ConfigError if none is feasible."""
    layouts, infeasible = rule_layouts(cfg)
    chosen: dict[str, Any] = {"layouts": {n: lay._asdict() for n, lay in layouts.items()},
                              "infeasible": infeasible, "prediction": None, "candidates": [],
                              "nodes_request": cfg.resources.nodes_spec, "device_memory": None,
                              "host_cores": None, "ranks_per_host": None, **_links(Hardware())}
    if planned is not None and planned.fits_nowhere():  # e.g. every layout would run out of memory
        reasons = sorted({c.rejected for c in planned.candidates if c.rejected})
        raise ConfigError(f"no layout fits: {'; '.join(reasons)}")
    if planned is not None and planned.chosen is not None:
        chosen = _chosen(cfg, planned)
    j = cfg.job
    run_dir = Path(run_dir).resolve()
    doc: dict[str, Any] = {
        "version": PLAN_VERSION,
        "pswift_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "job_name": j.name,
        "partition": j.partition,
        "partitions": list(j.partitions) if len(j.partitions) > 1 else [],
        "partition_layouts": _partition_layouts(planned),
        "user": os.environ.get("USER") or os.environ.get("LOGNAME"),
        "run_dir": str(run_dir),
        "config_path": str(cfg.path),
        "python": python or j.python or sys.executable,
        "device": cfg.resources.device,
        "cpus_per_task": cfg.resources.cpus_per_task,
        **_members(cfg, planned),
        "member_nodes": cfg.resources.member_nodes,
        "member_wait_s": cfg.resources.member_wait_s,
        "max_requeues": j.max_requeues,
        "max_restarts": j.max_restarts,
        "grow_check_s": j.grow_check_s,
        "jct_slack": j.jct_slack,
        "time_policy": j.time_policy,
        "rebalance": cfg.pipeline.rebalance,
        "schedule": _schedule(cfg, planned),
        **_limits_section(time_limits(cfg, planned), j.time_seconds),
        **_sections(cfg, run_dir),
        **chosen,
        "revision": 0,
        "submitted_at": None,
        "relayouts": [],
        "checkpoint_auto": _checkpoint_auto(cfg, planned),
    }
    return cast(Plan, doc)   # its keys: tests/test_settings.py and runnable()


def _schedule(cfg: TrainConfig, planned: "PlanResult | None") -> str:
    """The schedule the job runs: the chosen candidate's ("auto" resolved by the planner), or
    1F1B for "auto" without one."""
    if planned is not None and planned.chosen is not None:
        return planned.chosen.schedule
    return "1f1b" if cfg.pipeline.schedule == "auto" else cfg.pipeline.schedule


def _limits_section(lim: Limits, written_s: int | None) -> dict[str, Any]:
    return {"time_limit_s": lim.time_s, "time_min_s": lim.time_min_s, "signal_lead_s": lim.signal_lead_s,
            "time_why": lim.why, "time_written_s": written_s}


def _members(cfg: TrainConfig, planned: "PlanResult | None") -> dict[str, Any]:
    """plan.json's ``members`` (0: one job) and why (pipeswift_slurm.planning.members)."""
    n, why = members.choose(cfg, planned)
    return {"members": n, "members_why": why, "members_at_once": members.at_once(cfg, planned, n)}


def _checkpoint_auto(cfg: TrainConfig, planned: "PlanResult | None") -> dict[str, Any] | None:
    """plan.json's ``checkpoint_auto``: what the launcher's interval starts from."""
    if cfg.training.checkpoint_interval != "auto":
        return None
    if planned is None or planned.chosen is None:
        return {**interval.Interruptions().record(), "cost_s": checkpoint_seconds(None)}
    every = {str(n): (None if math.isinf(c.est.checkpoint_every_s) else round(c.est.checkpoint_every_s, 3))
             for n, c in sorted(planned.best_per_nodes().items())}
    return {**planned.interruptions.record(), "cost_s": planned.checkpoint_cost_s, "every_s": every}


def _array(members: int, at_once: int) -> str | None:
    """sbatch's --array for a run of members: one task a member, ``%K`` where fewer run at once."""
    if not members:
        return None
    return f"0-{members - 1}" + (f"%{at_once}" if 0 < at_once < members else "")


def options_for(cfg: TrainConfig, run_dir: str, limits: Limits,
                nodes: str | None = None, members: int = 0, at_once: int = 0) -> SbatchOptions:
    """The batch script's options: the TOML's, with the node request, the members (plan.json's:
    0, one job; ``at_once``: how many may run at once, the array's throttle) and the time limits
    planned."""
    r, j = cfg.resources, cfg.job
    lead = limits.signal_lead_s
    # the TOML's own spelling when the limit is the one it wrote, else whole minutes
    time = j.time if limits.time_s == j.time_seconds else None if limits.time_s is None else slurm_minutes(limits.time_s)
    return SbatchOptions(
        job_name=j.name, nodes=str(r.member_nodes) if members else nodes or r.nodes_spec,
        ntasks_per_node=r.tasks_per_node, array=_array(members, at_once),
        cpus_per_task=r.cpus_per_task, output=output_pattern(run_dir),
        partition=",".join(j.partitions) if len(j.partitions) > 1 else j.partition,   # Slurm's list
        time=time,
        time_min=None if limits.time_min_s is None else slurm_minutes(limits.time_min_s),
        account=j.account, qos=j.qos, gpus_per_node=r.gpus_per_node,
        # USR2 (not USR1, which NCCL may catch) to the step tasks before the time limit
        signal=f"USR2@{lead}" if lead else None,
        extra=j.sbatch_options,
    )
