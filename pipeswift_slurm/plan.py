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
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from pipeswift_slurm import __version__
from pipeswift_slurm.config import TrainConfig, TrainingSection
from pipeswift_slurm.planning.costmodel import Hardware
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.layouts import rule_layouts
from pipeswift_slurm.slurm.sbatch import Limits

if TYPE_CHECKING:
    from pipeswift_slurm.planning.planner import Candidate, PlanResult

PLAN_VERSION = 1


#: one node count's layout: :class:`~pipeswift_slurm.layouts.Layout` as JSON, its keys Layout's
#: fields (one home: a TypedDict here would repeat them)
LayoutSpec = dict[str, Any]


class ModelSpec(TypedDict):
    dir: str
    entry: str
    kwargs: dict[str, Any]
    loss: str | None
    num_layers: int | None
    layer_costs: list[float] | None


class TrainingSpec(TypedDict):
    """[training] as the job needs it (see config.TrainingSection for each key's meaning)."""
    steps: int
    global_batch_size: int
    micro_batch_size: int
    data: str | dict[str, Any]
    seed: int
    optimizer: dict[str, Any]
    ds_config: dict[str, Any]
    gradient_clipping: float
    precision: str
    zero_stage: int
    activation_checkpoint_interval: int
    lr_warmup_steps: int
    lr_decay: str
    lr_min_ratio: float
    checkpoint_dir: str
    #: steps between periodic checkpoints (0: none by step count; see Plan.checkpoint_auto)
    checkpoint_interval: int
    checkpoint_io_share: float
    keep_checkpoints: int
    #: where rank 0 also writes the scalars: "csv", "tensorboard" (pipeswift_launch.metrics)
    metrics: list[str]
    hang_timeout_factor: float
    hang_timeout_min_s: float


class Plan(TypedDict):
    """plan.json: the contract between the login node and the job (version PLAN_VERSION)."""
    version: int
    pswift_version: str
    created: str
    job_name: str
    #: the partition planned for: the soonest-finishing of [job] partition's list
    partition: str | None
    #: every partition the job was submitted to, that one first ([]: one partition or Slurm's default)
    partitions: list[str]
    #: the layouts of each other partition of ``partitions`` whose hardware cuts them otherwise
    #: (for_partition puts them in place when the job starts there)
    partition_layouts: dict[str, dict[str, LayoutSpec]]
    user: str | None
    run_dir: str
    config_path: str
    python: str
    device: str
    cpus_per_task: int
    max_requeues: int
    #: when `pswift sbatch` handed the job to Slurm (epoch s; None: planned, not submitted)
    submitted_at: float | None
    #: restarts of the ranks inside one allocation after a crash, per attempt
    max_restarts: int
    #: seconds between rank 0's checks whether growing to more nodes pays (0: never)
    grow_check_s: int
    #: [job] time_policy: "predicted" limits (a requeue asks for what remains) or "as_written"
    time_policy: str
    #: [job] jct_slack: growing must beat it too, or it would undo the planner's cheaper choice
    jct_slack: float
    #: whether the job may re-cut its stages in place from measured layer times
    rebalance: bool
    #: the limits asked of Slurm (pipeswift_slurm.planning.limits): --time, --time-min, the
    #: USR2 lead before the limit, why; [job] time as the TOML writes it (a requeue's cap)
    time_limit_s: int | None
    time_min_s: int | None
    signal_lead_s: int | None
    time_why: str
    time_written_s: int | None
    model: ModelSpec
    training: TrainingSpec
    layouts: dict[str, LayoutSpec]
    infeasible: dict[str, str]
    prediction: dict[str, Any] | None
    candidates: list[dict[str, Any]]
    nodes_request: str
    #: bytes per task slot the planner assumed (None: costmodel.DEFAULT_DEVICE_MEMORY)
    device_memory: float | None
    #: CPU: cores one host has and ranks placed on one host, as the planner assumed (None: unknown)
    host_cores: int | None
    ranks_per_host: int | None
    #: the links between stages the planner assumed: measured by recent launches
    #: (pipeswift_launch.probe) or the defaults; the job's re-layout and growth use them too
    p2p_latency: float
    p2p_bandwidth: float
    #: 0 as planned; each in-job re-layout rewrites the layouts from measured costs and adds 1
    revision: int
    #: the re-layouts so far, oldest first (pipeswift_launch.relayout writes them)
    relayouts: list[dict[str, Any]]
    #: checkpoint_interval = "auto": the interruption rates and the estimated checkpoint cost
    #: the launcher's Young/Daly interval starts from (pipeswift_slurm.planning.interval); else None
    checkpoint_auto: dict[str, Any] | None


#: what a job cannot run without besides the travelling settings (pipeswift_slurm.settings):
#: a plan.json lacking one is refused when read, in one line
_NONE = type(None)
_NEEDED: dict[str, tuple[type, ...]] = {
    "run_dir": (str,), "python": (str,), "model": (dict,), "training": (dict,), "layouts": (dict,),
    "infeasible": (dict,), "candidates": (list,), "partition": (str, _NONE), "partitions": (list,),
    "partition_layouts": (dict,), "nodes_request": (str,),
    "revision": (int,), "relayouts": (list,), "checkpoint_auto": (dict, _NONE),
    "device_memory": (int, float, _NONE), "host_cores": (int, _NONE), "ranks_per_host": (int, _NONE),
    "p2p_latency": (int, float), "p2p_bandwidth": (int, float),
    "time_limit_s": (int, _NONE), "time_min_s": (int, _NONE), "signal_lead_s": (int, _NONE),
    "time_written_s": (int, _NONE)}


def time_limits(cfg: TrainConfig, planned: "PlanResult | None" = None) -> Limits:
    """--time, --time-min and the USR2 lead ([job] time_policy): from the chosen layout's
    prediction, or [job] time as written (always without a prediction)."""
    from pipeswift_slurm.planning import limits
    from pipeswift_slurm.planning.costmodel import checkpoint_seconds
    written = cfg.job.time_seconds
    ckpt_s = checkpoint_seconds(cfg.model.layer_memory, unknown=10.0)   # the lead's: the safer one
    chosen = planned.chosen if planned is not None else None
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
                       "train_s": e.train_s, "step_source": e.step_source,
                       "jct_p10_s": e.jct_p10_s, "jct_p50_s": e.jct_p50_s, "jct_p90_s": e.jct_p90_s,
                       "node_hours": e.node_hours, "choice": planned.choice,
                       "objective": cfg.job.objective, "profile_source": planned.profile_source,
                       "checkpoint_cost_s": planned.checkpoint_cost_s},
        "nodes_request": nodes_request(cfg, ch.nodes, e.queue_s > 0),
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


def for_partition(plan: Plan, started_in: str | None) -> Plan:
    """``plan`` for the partition Slurm started the job in (SLURM_JOB_PARTITION), one of
    ``partitions``: that partition named, and its own layouts where plan.json keeps them."""
    if not started_in or started_in == plan["partition"] or started_in not in plan["partitions"]:
        return plan
    layouts = plan["partition_layouts"].get(started_in, plan["layouts"])
    return {**plan, "partition": started_in, "layouts": layouts}


def nodes_request(cfg: TrainConfig, chosen: int, waiting: bool) -> str:
    """sbatch's --nodes for the chosen count: starting now, ``min-chosen`` (the job still starts
    when the cluster shrank meanwhile); waiting, exactly the chosen count. With a node range in
    the TOML always as a range (``4-4``): the batch script then asks CPUs per node rather than
    tasks per node, so that a requeued attempt's request can be changed (pipeswift_launch.grow)."""
    lo, hi = cfg.resources.nodes_min, cfg.resources.nodes_max
    if lo == hi:
        return str(chosen)
    return f"{chosen}-{chosen}" if waiting or lo == chosen else f"{lo}-{chosen}"


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
    from pipeswift_slurm.settings import travelling
    section = {s.key: getattr(t, s.key) for s in travelling("training")}
    section["checkpoint_dir"] = str(t.checkpoint_dir or run_dir / "checkpoints")
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
        "max_requeues": j.max_requeues,
        "max_restarts": j.max_restarts,
        "grow_check_s": j.grow_check_s,
        "jct_slack": j.jct_slack,
        "time_policy": j.time_policy,
        "rebalance": cfg.pipeline.rebalance,
        **_limits_section(time_limits(cfg, planned), j.time_seconds),
        **_sections(cfg, run_dir),
        **chosen,
        "revision": 0,
        "submitted_at": None,
        "relayouts": [],
        "checkpoint_auto": _checkpoint_auto(cfg, planned),
    }
    return cast(Plan, doc)   # its keys: tests/test_settings.py and runnable()


def _limits_section(lim: Limits, written_s: int | None) -> dict[str, Any]:
    return {"time_limit_s": lim.time_s, "time_min_s": lim.time_min_s, "signal_lead_s": lim.signal_lead_s,
            "time_why": lim.why, "time_written_s": written_s}


def _checkpoint_auto(cfg: TrainConfig, planned: "PlanResult | None") -> dict[str, Any] | None:
    """plan.json's ``checkpoint_auto``: what the launcher's interval starts from."""
    if cfg.training.checkpoint_interval != "auto":
        return None
    from pipeswift_slurm.planning import interval
    from pipeswift_slurm.planning.costmodel import checkpoint_seconds
    if planned is None or planned.chosen is None:
        return {**interval.Interruptions().record(), "cost_s": checkpoint_seconds(None)}
    every = {str(n): (None if math.isinf(c.est.checkpoint_every_s) else round(c.est.checkpoint_every_s, 3))
             for n, c in sorted(planned.best_per_nodes().items())}
    return {**planned.interruptions.record(), "cost_s": planned.checkpoint_cost_s, "every_s": every}


def write_plan(plan: Plan, path: Path) -> None:
    """plan.json written whole or not at all (a job may rewrite it while peers read it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # compact: at the config caps an indented plan.json outgrew the 4 MiB the history reads
    tmp.write_text(json.dumps(plan, separators=(",", ":"), sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def relaid_out(plan: Plan, cuts: dict[str, list[int]], record: dict[str, Any]) -> Plan:
    """``plan`` after an in-job re-layout: each node count in ``cuts`` gets those boundaries
    (partition "measured"), the revision goes up by one and ``record`` joins ``relayouts``; later
    attempts, on any node count, start from the measured cut."""
    layouts = {n: ({**lay, "boundaries": list(cuts[n]), "partition": "measured"} if n in cuts else lay)
               for n, lay in plan["layouts"].items()}
    return {**plan, "layouts": layouts, "revision": int(plan.get("revision") or 0) + 1,
            "relayouts": [*(plan.get("relayouts") or []), record]}


def parse_plan(blob: bytes, where: str = "plan.json") -> Plan:
    """plan.json's content, version checked: the one reader of the file (the launcher, doctor
    and the history all read it here); ConfigError says what is wrong."""
    try:
        plan = json.loads(blob.decode("utf-8"))
    except (ValueError, RecursionError) as e:   # bad UTF-8, bad JSON, absurd nesting
        raise ConfigError(f"{where}: not a valid plan.json ({str(e)[:200]})") from None
    if not isinstance(plan, dict):
        raise ConfigError(f"{where}: not a valid plan.json (not a JSON object)")
    if plan.get("version") != PLAN_VERSION:
        raise ConfigError(f"{where}: plan version {plan.get('version')!r}, this pipeswift reads "
                          f"version {PLAN_VERSION}; re-plan with this version's `pswift sbatch`")
    return plan  # type: ignore[return-value]  # JSON: the version says which contract


_JSON_NAMES = {int: "an integer", float: "a number", str: "a string", dict: "an object", list: "an array",
               bool: "true or false", _NONE: "null"}


def runnable(plan: Plan, where: str = "plan.json") -> Plan:
    """``plan`` when it has every key a job reads, each of its type: the launcher's one check,
    after which it reads plan data without defaults (one line when something is wrong)."""
    from pipeswift_slurm.settings import travelling
    needed: list[tuple[Any, str, tuple[type, ...]]] = [(plan, key, kinds) for key, kinds in _NEEDED.items()]
    needed += [(plan, s.key, s.plan_types()) for s in travelling("top")]
    training = plan.get("training")
    needed += [(training, s.key, s.plan_types()) for s in travelling("training")]
    for section, key, kinds in needed:
        value = section.get(key, _MISSING) if isinstance(section, dict) else _MISSING
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            name = key if section is plan else f"training.{key}"
            what = " or ".join(_JSON_NAMES[k] for k in kinds if not (k is int and float in kinds))
            raise ConfigError(f"{where}: {name} is missing or not {what}; re-plan "
                              f"with `pswift sbatch` rather than editing plan.json")
    return plan


_MISSING = object()


def read_plan(path: Path | str) -> Plan:
    try:
        blob = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such plan file") from None
    return parse_plan(blob, str(path))
