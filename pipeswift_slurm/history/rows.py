"""A run directory's files (plan.json, JOB_ID, events.jsonl) into history rows.

Everything read here comes from a user's directory and is hostile to the process ingesting it
(often root): plan values are kept only as plain bounded scalars, events only through
:mod:`events`. Identity (user, job id, partition) comes from the :class:`Owner` given, which is
Slurm's own record where there is one (the jobcomp plugin, a spooled record), else the owner of
the run directory; never from what the directory says about itself. Profiles are keyed by the
model *and its user*, so one user's events cannot steer another user's plans.
"""

from __future__ import annotations

# Imports inside functions: the history package and the plan, which import this module (a cycle
# otherwise)

import hashlib
import json
import math
import os
import pwd
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from pipeswift_slurm import runfiles
from pipeswift_slurm.planning.costmodel import overheads_from_instructions
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.stats import median, quantiles

if TYPE_CHECKING:   # the ingest's modules load when a run is ingested: planning reads keys only
    from pipeswift_slurm.history import eventfold
    from pipeswift_slurm.plan import LayoutSpec, Plan
    from pipeswift_slurm.userfiles import RunFiles

_JOB_ID = re.compile(r"^[0-9]{1,20}(_[0-9]{1,10})?$")


class Owner(NamedTuple):
    """Whose job a run directory is, as Slurm (or the file system) says."""

    user: str
    uid: int
    gid: int
    job_id: str | None = None
    partition: str | None = None
    cluster: str = ""


@dataclass
class RunRows:
    job: dict[str, Any]
    attempts: list[dict[str, Any]]
    profiles: list[dict[str, Any]]
    overheads: list[dict[str, Any]]
    decisions: list[dict[str, Any]] = field(default_factory=list)   # "job" filled in on insert
    relayouts: list[dict[str, Any]] = field(default_factory=list)   # "job" filled in on insert
    skipped_events: int = 0
    dropped_events: int = 0   # valid events beyond eventfold's bounds (attempts, kept bytes)


#: a pswift attempt's end (its events' reason) as Slurm names a job's state
_SLURM_STATE = {"completed": "COMPLETED", "preempted": "PREEMPTED", "cancelled": "CANCELLED",
                "stopped": "CANCELLED", "time_limit": "TIMEOUT", "grow": "REQUEUED", "hung": "REQUEUED",
                "running": "RUNNING", "relayout": "RUNNING", "members_changed": "RUNNING"}


def slurm_records(got: RunRows) -> list[dict[str, Any]]:
    """A pswift run's attempts as Slurm's attempt records (sacct's keys, source "pswift"), from
    its own events: what every report reads of a job whose Slurm record (the jobcomp plugin,
    sacct, filetxt) has not come, and that record replaces them when it comes. Only a run Slurm
    ran (a job id): a local run has no Slurm attempt. An attempt began, for Slurm, its setup
    before the ranks' start event."""
    job = got.job
    if not job.get("job_id"):
        return []
    out = []
    for a in got.attempts:
        if a.get("start_time") is None:
            continue
        ended = a.get("ended") or "running"
        out.append({"JOBID": job["job_id"], "CLUSTER": job.get("cluster") or "", "USERNAME": job.get("user"),
                    "JOBNAME": job.get("name"), "PARTITION": job.get("partition"),
                    "JOBSTATE": _SLURM_STATE.get(ended, "FAILED"),
                    "START": a["start_time"] - (a.get("setup_s") or 0.0), "END": a.get("end_time"),
                    "SUBMIT": job.get("submit_time"), "ELIGIBLE": job.get("submit_time"),
                    "NODECNT": a.get("nodes"), "WORK_DIR": job["run_dir"],
                    "EXITCODE": "0:0" if ended == "completed" else None})
    return out


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def current_user() -> str:
    return user_name(os.getuid())


def model_key(model: dict[str, Any], user: str) -> str:
    """Identity of a model across one user's jobs: entry point, its arguments, layer count."""
    blob = json.dumps([user, model.get("entry"), model.get("kwargs"), model.get("num_layers")],
                      sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def config_key(mkey: str, layout: LayoutSpec, schedule: str | None = None) -> str:
    """What measured step times are kept under: the model, the layout and, other than DeepSpeed's
    own 1F1B, the pipeline schedule (a ZB-H1 step is not a 1F1B one)."""
    parts = [mkey] + [str(layout.get(k)) for k in ("nodes", "tasks_per_node", "stages", "data_parallel",
                                                    "micro_batches", "micro_batch_size")]
    parts.append(",".join(map(str, layout.get("boundaries") or [])))
    if schedule not in (None, "1f1b"):
        parts.append(str(schedule))
    return "/".join(parts)


def plain(v: Any) -> Any:
    """A value fit for one SQLite cell from hostile JSON: a bounded string, an int64, a finite
    float, a bool as 0/1, or None for anything else."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if -2**63 < v < 2**63 else None
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return v[:4096]
    return None


def number(v: Any) -> int | float | None:
    """A finite int64 or float from hostile JSON, else None."""
    v = plain(v)
    return v if isinstance(v, (int, float)) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _ints(v: Any) -> str | None:
    return json.dumps(v) if isinstance(v, list) and len(v) <= 100_000 and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31 for x in v) else None


def parse_plan(blob: bytes | None) -> "Plan | None":
    """The run's plan through plan.py's reader, or None when it has none that reads."""
    from pipeswift_slurm.plan import parse_plan as read
    if blob is None:
        return None
    try:
        return read(blob)
    except ConfigError:
        return None


def rows(run: str, files: RunFiles, owner: Owner, fold: eventfold.Fold | None = None) -> RunRows | None:
    """The rows of one run directory, or None when it holds no readable plan.json. ``fold``:
    its events.jsonl already folded while it was read (else folded here from ``files``)."""
    plan = parse_plan(files.data.get(runfiles.PLAN))
    if plan is None:
        return None
    job_id = owner.job_id
    job_id_file = files.data.get(runfiles.JOB_ID)
    if job_id is None and job_id_file:
        text = job_id_file.decode("ascii", "replace").strip()
        job_id = text if _JOB_ID.match(text) else None
    if fold is None:
        from pipeswift_slurm.history import eventfold
        fold = eventfold.read_attempts(files.data.get(runfiles.EVENTS) or b"")
    mkey = model_key(_dict(plan.get("model")), owner.user)
    pred = _dict(plan.get("prediction"))
    job: dict[str, Any] = {
        "run_dir": run, "cluster": owner.cluster, "name": plain(plan.get("job_name")),
        "partition": owner.partition or plain(plan.get("partition")), "user": owner.user,
        "model_key": mkey, "steps": number(_dict(plan.get("training")).get("steps")),
        "submit_time": number(plan.get("submitted_at")), "chosen_nodes": number(pred.get("nodes")),
        "predicted_step_s": number(pred.get("step_s")), "predicted_jct_s": number(pred.get("jct_s")),
        "predicted_queue_s": number(pred.get("queue_s")), "job_id": job_id,
        "predicted_jct_p10_s": number(pred.get("jct_p10_s")),
        "predicted_jct_p50_s": number(pred.get("jct_p50_s")),
        "predicted_jct_p90_s": number(pred.get("jct_p90_s")),
    }
    out = _from_events(mkey, job, fold.attempts())
    out.decisions = _decisions(plan)
    out.skipped_events, out.dropped_events = fold.skipped, fold.dropped
    return out


def _decisions(plan: Plan) -> list[dict[str, Any]]:
    pred = _dict(plan.get("prediction"))
    cands = plan.get("candidates")
    out = []
    for rank, c in enumerate(cands[:10_000] if isinstance(cands, list) else []):
        c = _dict(c)
        e = _dict(c.get("estimate"))
        out.append({"rank": rank,
                    "chosen": int(rank == 0 and c.get("rejected") is None and c.get("nodes") == pred.get("nodes")),
                    "nodes": number(c.get("nodes")), "stages": number(c.get("stages")),
                    "data_parallel": number(c.get("data_parallel")),
                    "micro_batches": number(c.get("micro_batches")), "boundaries": _ints(c.get("boundaries")),
                    "queue_s": number(e.get("queue_s")), "step_s": number(e.get("step_s")),
                    "train_s": number(e.get("train_s")), "jct_s": number(e.get("jct_s")),
                    "step_source": plain(e.get("step_source")), "rejected": plain(c.get("rejected"))})
    return out


#: what a launch measured of its hardware (pipeswift_launch.probe), kept per attempt
HARDWARE = ("device", "p2p_latency_s", "p2p_bandwidth", "device_memory", "ranks_per_host", "host_cores")


def _start(a: dict[str, Any], ev: dict[str, Any], mkey: str) -> None:
    lay = {k: ev[k] for k in ("nodes", "stages", "data_parallel", "micro_batches",
                              "micro_batch_size", "boundaries")}
    lay["tasks_per_node"] = ev["world_size"] // max(1, ev["nodes"])
    a.update(nodes=ev["nodes"], stages=ev["stages"], data_parallel=ev["data_parallel"],
             micro_batches=ev["micro_batches"], micro_batch_size=ev["micro_batch_size"],
             boundaries=json.dumps(ev["boundaries"]), config_key=config_key(mkey, lay, ev.get("schedule")),
             start_step=ev["step"], resumed_from=ev["resumed_from"], setup_s=ev["setup_s"],
             load_s=ev["load_s"], **{k: ev[k] for k in HARDWARE})
    if ev["time"] is not None and ev["setup_s"] is not None:
        a["start_time"] = ev["time"] - ev["setup_s"]


def _profile(ev: dict[str, Any], mkey: str, profiles: list[dict[str, Any]],
             overheads: list[dict[str, Any]]) -> None:
    t = ev["time"]
    for layer, sec in ev["seconds"].items():
        w = (ev.get("weight_seconds") or {}).get(layer)
        profiles.append({"model_key": mkey, "micro_batch_size": ev["micro_batch_size"],
                         "layer": int(layer), "seconds": sec, "weight_seconds": w,
                         "weight_fraction": min(1.0, w / sec) if w is not None and sec and sec > 0 else None,
                         "param_bytes": (ev["param_bytes"] or {}).get(layer),
                         "activation_bytes": (ev["activation_bytes"] or {}).get(layer),
                         "saved_bytes": (ev["saved_bytes"] or {}).get(layer),
                         "samples": ev["samples"], "updated": t})
    bounds, m = ev["boundaries"], ev["micro_batches"]
    if ev["instructions"] and bounds and m:
        try:
            o = overheads_from_instructions(ev["instructions"], ev["seconds"], bounds, int(m))
        except (TypeError, ValueError, AttributeError, IndexError, KeyError, ZeroDivisionError):
            o = None  # a malformed record: the layer costs still count
        if o is not None:
            overheads[:] = [{"model_key": mkey, "micro_batch_size": ev["micro_batch_size"],
                             "stages": len(bounds) - 1, "micro_batches": int(m), **o, "updated": t}]


def _attempt_row(a: dict[str, Any], mkey: str, profiles: list[dict[str, Any]],
                 overheads: list[dict[str, Any]]) -> dict[str, Any]:
    """One attempt's row (eventfold.by_attempt's grouping) with its step-time statistics. After an
    in-job re-layout the row holds the last layout and that layout's steps only (the planner
    learns each configuration's own step time); setup and load add up over the launches."""
    row: dict[str, Any] = {"attempt": a["attempt"], "ended": a["ended"], "relayouts": len(a["relayouts"]),
                           "checkpoint_s": a["checkpoint_s"],
                           "restarts": a["restarts"],
                           "last_crash": a["last_crash"]["why"] if a["last_crash"] else None}
    if a["starts"]:
        _start(row, a["starts"][-1], mkey)
        first = a["starts"][0]
        row.update(start_step=first["step"], resumed_from=first["resumed_from"],
                   setup_s=_total(s["setup_s"] for s in a["starts"]),
                   load_s=_total(s["load_s"] for s in a["starts"]))
        row.pop("start_time", None)
        if first["time"] is not None and first["setup_s"] is not None:
            row["start_time"] = first["time"] - first["setup_s"]
    log = a["steps"]
    if log:
        row["end_step"], row["end_time"] = log[-1]["step"], log[-1]["time"]
    if a["end"] is not None:
        row["end_time"] = a["end"]["time"]
        if a["end"]["step"] is not None:
            row["end_step"] = a["end"]["step"]
    for ev in a["profiles"]:
        _profile(ev, mkey, profiles, overheads)
    starts_at = a["logged_at"]["starts"]
    mine = log.times_from(starts_at[-1] if starts_at else 0)   # the last launch's steps
    # the first step of a launch includes warm-up: statistics use the rest when there is one
    xs = mine[1:] if len(mine) > 1 else mine
    row["step_count"] = len(xs)
    if xs:
        mean = math.fsum(xs) / len(xs)
        var = math.fsum((x - mean) ** 2 for x in xs) / len(xs)
        p50, p95 = quantiles(xs, (0.5, 0.95), clean=True)
        row.update(step_mean=mean, step_var=var, step_p50=p50, step_p95=p95, train_s=math.fsum(log.step_time))
    return row


def _total(xs: Any) -> float | None:
    got = [float(x) for x in xs if x is not None]
    return sum(got) if got else None


def _relayout_rows(grouped: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The relayouts table's rows: each in-job re-layout and each growth."""
    from pipeswift_slurm.history import eventfold
    rows = [{"attempt": a["attempt"], "kind": "relayout",
             **{k: v for k, v in r.items() if k not in ("from", "to")},
             "boundaries_from": json.dumps(r["from"]), "boundaries_to": json.dumps(r["to"])}
            for a in grouped for r in eventfold.relayout_outcomes(a)]
    return rows + [{"kind": "grow", **g} for g in eventfold.growth_outcomes(grouped)]


def _newest(ordered: list[dict[str, Any]]) -> dict[str, Any]:
    """The attempt that ended last, one still running before any: a job's last attempt; in a run
    of members, whose member jobs' attempts interleave in time, not always the last to begin (a
    member requeued once may hold rank 0 of an epoch before the run's last)."""
    return max(ordered, key=lambda a: (a.get("ended") == "running", a.get("end_time") or 0.0))


def _from_events(mkey: str, job: dict[str, Any], grouped: list[dict[str, Any]]) -> RunRows:
    profiles: list[dict[str, Any]] = []
    overheads: list[dict[str, Any]] = []
    ordered = [_attempt_row(a, mkey, profiles, overheads) for a in grouped]
    if ordered:
        newest = _newest(ordered)
        job["start_time"] = ordered[0].get("start_time")
        job["end_time"] = newest.get("end_time")
        job["state"] = newest.get("ended")
        job["actual_step_s"] = median(x for a in grouped for x in a["steps"].step_time[1:])
        if job["state"] == "completed" and job.get("submit_time") and job.get("end_time"):
            job["actual_jct_s"] = job["end_time"] - job["submit_time"]
    return RunRows(job, ordered, profiles, overheads, relayouts=_relayout_rows(grouped))
