"""The plan: one pipeline layout per node count the job may get, written as versioned plan.json.

plan.json is the only contract between the login node and the job: the in-job launcher reads
it, picks the layout for the node count Slurm actually allocated, and trains. Here: its types,
its one writer and reader, and the check that a job can run it (runnable); it is built from the
TOML and the planner's result by pipeswift_slurm.planning.build.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypedDict

from pipeswift_slurm import runfiles
from pipeswift_slurm.errors import ConfigError
#: [training] as the job needs it: the travelling [training] settings, a TypedDict generated from
#: the settings table (sections.py); :func:`runnable` checks each of them when a job reads plan.json
from pipeswift_slurm.sections import TrainingSpec as TrainingSpec
from pipeswift_slurm.settings import travelling

PLAN_VERSION = 1


#: one node count's layout: :class:`~pipeswift_slurm.planning.layouts.Layout` as JSON, its keys Layout's
#: fields (one home: a TypedDict here would repeat them)
LayoutSpec = dict[str, Any]


class ModelSpec(TypedDict):
    dir: str
    entry: str
    kwargs: dict[str, Any]
    loss: str | None
    num_layers: int | None
    layer_costs: list[float] | None




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
    #: [resources] members (0: one Slurm job; N: a job array of N members, one run:
    #: pipeswift_launch.members), member_nodes and member_wait_s
    members: int
    #: why members or one job (pipeswift_slurm.planning.members): `pswift sbatch --dry-run` says it
    members_why: str
    #: how many members may hold nodes at once (the array's ``%K``; pipeswift_slurm.planning.members
    #: .at_once); the run raises it where growing pays. Read through :func:`members_at_once`
    members_at_once: int
    member_nodes: int
    member_wait_s: int
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
    #: [pipeline] schedule: "1f1b" or "zb-h1" (pipeswift_launch.zerobubble); "auto" is resolved
    #: by the planner before plan.json is written
    schedule: str
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


def members_at_once(plan: Plan) -> int:
    """How many members the run starts with (a plan.json written before the throttle: all)."""
    return int(plan.get("members_at_once") or plan["members"])


def for_partition(plan: Plan, started_in: str | None) -> Plan:
    """``plan`` for the partition Slurm started the job in (SLURM_JOB_PARTITION), one of
    ``partitions``: that partition named, and its own layouts where plan.json keeps them."""
    if not started_in or started_in == plan["partition"] or started_in not in plan["partitions"]:
        return plan
    layouts = plan["partition_layouts"].get(started_in, plan["layouts"])
    return {**plan, "partition": started_in, "layouts": layouts}


def plan_bytes(plan: Plan) -> bytes:
    """plan.json's content (compact: at the config caps an indented plan.json outgrew the 4 MiB
    the history reads)."""
    return (json.dumps(plan, separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")


def write_plan(plan: Plan, path: Path) -> None:
    """plan.json written whole or not at all (a job may rewrite it while peers read it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(plan_bytes(plan))
    os.replace(tmp, path)


def relaid_out(plan: Plan, cuts: dict[str, list[int]], record: dict[str, Any]) -> Plan:
    """``plan`` after an in-job re-layout: each node count in ``cuts`` gets those boundaries
    (partition "measured"), the revision goes up by one and ``record`` joins ``relayouts``; later
    attempts, on any node count, start from the measured cut."""
    layouts = {n: ({**lay, "boundaries": list(cuts[n]), "partition": "measured"} if n in cuts else lay)
               for n, lay in plan["layouts"].items()}
    return {**plan, "layouts": layouts, "revision": int(plan.get("revision") or 0) + 1,
            "relayouts": [*(plan.get("relayouts") or []), record]}


def parse_plan(blob: bytes, where: str = runfiles.PLAN) -> Plan:
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


def runnable(plan: Plan, where: str = runfiles.PLAN) -> Plan:
    """``plan`` when it has every key a job reads, each of its type: the launcher's one check,
    after which it reads plan data without defaults (one line when something is wrong)."""
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


def predicted_steps(plan: Plan) -> dict[int, float]:
    """Seconds a step per node count, as the planner estimated plan.json's layouts."""
    out: dict[int, float] = {}
    for n, lay in plan["layouts"].items():
        for c in plan["candidates"]:
            e = c.get("estimate") or {}
            same = all(c.get(k) == lay.get(k) for k in ("nodes", "stages", "data_parallel", "micro_batch_size"))
            if same and c.get("rejected") is None and e.get("step_s"):
                out[int(n)] = float(e["step_s"])
                break
    return out
