"""Slurm's answers, every version, into the planner's and the history's types.

Pure functions over Slurm's JSON (and ``scontrol -o`` text); :mod:`slurm` runs the commands.
Each layout is told apart by its keys, never by a version number, and tested on real output of
each supported version (``tests/slurm_json/<version>/``):

- data_parser v0.0.38 (Slurm 22.05): ``sinfo --json`` lists ``nodes`` with ``idle_cpus``; job
  states are strings; numbers are plain; a running job's nodes are
  ``job_resources.allocated_nodes[].nodename``; sacct's ``state`` is ``{"current": "X"}``.
- v0.0.40 and later (23.x - 25.x): ``sinfo --json`` answers node *groups* (``{"sinfo": [...]}``),
  so per-node CPUs come from ``scontrol show nodes --json``; states are lists of flags; numbers are
  ``{"set", "infinite", "number"}``; nodes are ``job_resources.nodes.allocation[].name``; sacct's
  ``state.current`` is a list and exit codes nest their numbers.
"""

from __future__ import annotations

# Imports inside functions: the time syntax, only for records that carry a time

import datetime
import json
import math
from typing import Any, NamedTuple

import hostlist

from pipeswift_slurm.errors import SlurmError

TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
    "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED",
})


class NodeState(NamedTuple):
    name: str
    state: str          # lower case; flags joined by '+', e.g. "idle+planned"
    cpus: int
    idle_cpus: int
    partitions: tuple[str, ...]


class JobInfo(NamedTuple):
    job_id: str
    name: str
    state: str
    reason: str
    partition: str
    nodes: str                       # Slurm's hostlist, e.g. "node[2-4]"
    node_names: tuple[str, ...]      # the same, expanded
    node_count: int
    restarts: int
    submit_time: int | None
    start_time: int | None
    end_time: int | None
    time_limit_min: int | None
    priority: int
    qos: str
    excluded: str = ""               # ExcNodeList, a hostlist ("" for none)
    user_id: int | None = None       # whose job it is
    preempt_time: int | None = None  # set while Slurm is preempting the job

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def holds_array_tasks(job_id: str, array_job_id: str) -> bool:
    """Whether a pending job is the job array's own record of its tasks not started yet: squeue's
    text names it ``ARRAY_[2-3%2]`` (22.05's CLI), its JSON and pyslurm by the array's id."""
    return job_id == array_job_id or job_id.startswith(f"{array_job_id}_[")


def load(text: str, what: str) -> dict[str, Any]:
    """Parse one JSON answer; a non-object or malformed answer is a SlurmError naming the command."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SlurmError(f"{what} did not print JSON ({e}); is this Slurm 21.08 or newer?") from None
    if not isinstance(doc, dict):
        raise SlurmError(f"{what} printed JSON that is not an object")
    return doc


def failed_loads(doc: dict[str, Any]) -> str | None:
    """What a JSON answer's "errors" say of the controller's data that it could not load
    (22.05: ``{"source": "slurm_load_jobs", "description": "Failed while looking for jobs"}``
    while slurmctld does not answer), or None when it loaded."""
    errs = [e for e in (doc.get("errors") or []) if isinstance(e, dict)
            and str(e.get("source") or "").startswith("slurm_load")]
    return "; ".join(f"{e.get('source')}: {e.get('description') or e.get('error')}" for e in errs) or None


def state(v: Any) -> str:
    """A state as one upper-case word: the first flag of a list (newer layouts) or the string."""
    if isinstance(v, dict):             # sacct: {"current": ..., "reason": ...}
        v = v.get("current")
    if isinstance(v, list):
        return str(v[0]).upper() if v else "UNKNOWN"
    return str(v).upper() if v else "UNKNOWN"


def number(v: Any) -> int | None:
    """A number, plain or ``{"set", "infinite", "number"}``; None when unset or infinite."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return int(v)


def epoch(v: Any) -> int | None:
    """A time in epoch seconds, from any of Slurm's forms: a number (plain or ``{"set",
    "number"}``), its digits (a jobcomp environment), or ISO ``YYYY-MM-DDTHH:MM:SS`` in local
    time (sacct's and filetxt's text); 0, unset and anything else ("Unknown", "None") mean unknown."""
    if isinstance(v, str):
        text = v.strip()
        if text.isdigit():
            return (int(text) or None) if len(text) <= 15 else None   # 15 digits: inside SQLite's int64
        try:
            return int(datetime.datetime.fromisoformat(text).timestamp()) or None
        except (ValueError, OverflowError, OSError):
            return None
    n = number(v)
    return n if n else None


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's host list as ``scontrol show hostnames`` expands it: ``node[1-3,5],gpu07`` ->
    ('node1', 'node2', 'node3', 'node5', 'gpu07'); zero padding kept; every bracket of a name
    expanded (``rack[1-2]-n[1-2]``: four names, the first bracket varying slowest). python-hostlist
    does the reading, bounded by its own limit on the names one list may expand to."""
    try:
        names = hostlist.expand_hostlist(text or "", allow_duplicates=True)
    except hostlist.BadHostlist as e:
        raise SlurmError(f"cannot read Slurm host list {text[:80]!r}: {e}") from None
    return tuple(x for x in names if x)


def _flags(v: Any) -> str:
    if isinstance(v, list):
        return "+".join(str(x).lower() for x in v) or "unknown"
    return str(v or "unknown").lower()


def nodes(doc: dict[str, Any]) -> list[NodeState]:
    """Per-node state from ``sinfo --json`` (v0.0.38) or ``scontrol show nodes --json`` (newer)."""
    if "sinfo" in doc and "nodes" not in doc:
        raise SlurmError("sinfo --json of this Slurm gives node groups, not nodes; "
                         "ask `scontrol show nodes --json` instead")
    out = []
    for n in doc.get("nodes") or []:
        cpus = number(n.get("cpus")) or 0
        if "idle_cpus" in n:
            idle = number(n.get("idle_cpus")) or 0
        else:
            idle = max(0, cpus - (number(n.get("alloc_cpus")) or 0))
        out.append(NodeState(name=str(n.get("name")), state=_flags(n.get("state")), cpus=cpus,
                             idle_cpus=idle, partitions=tuple(str(p) for p in n.get("partitions") or ())))
    return out


def _job_node_names(j: dict[str, Any]) -> tuple[str, ...]:
    res = j.get("job_resources") or {}
    alloc = res.get("allocated_nodes")                                   # v0.0.38
    if alloc is None and isinstance(res.get("nodes"), dict):
        alloc = res["nodes"].get("allocation")                           # v0.0.40+
    names = tuple(str(a.get("nodename") or a.get("name")) for a in alloc or () if isinstance(a, dict))
    return names or expand_hostlist(str(j.get("nodes") or ""))


def jobs(doc: dict[str, Any]) -> list[JobInfo]:
    """Jobs from ``squeue --json`` (every layout)."""
    out = []
    for j in doc.get("jobs") or []:
        st = state(j.get("job_state"))
        names = _job_node_names(j) if st not in ("PENDING",) else ()
        out.append(JobInfo(
            job_id=str(j.get("job_id")), name=str(j.get("name") or ""), state=st,
            reason=str(j.get("state_reason") or ""), partition=str(j.get("partition") or ""),
            nodes=str(j.get("nodes") or ""), node_names=names,
            node_count=number(j.get("node_count")) or 0, restarts=number(j.get("restart_cnt")) or 0,
            submit_time=epoch(j.get("submit_time")), start_time=epoch(j.get("start_time")),
            end_time=epoch(j.get("end_time")), time_limit_min=number(j.get("time_limit")),
            priority=number(j.get("priority")) or 0, qos=str(j.get("qos") or ""),
            excluded=str(j.get("excluded_nodes") or ""), preempt_time=epoch(j.get("preempt_time")),
            user_id=number(j.get("user_id"))))
    return out


#: ``squeue --format`` of :func:`squeue_active`: the fields the planner reads, "|"-separated
ACTIVE_FORMAT = "%i|%T|%Q|%P|%D|%l|%e|%N|%U|%S"
#: squeue's job id, user, state and working directory (a pswift job's is its run directory),
#: each record ended by ``|END`` and a random word of the query's own (:func:`workdir_format`)
WORKDIR_FORMAT = "%i|%u|%T|%Z|END{end}"


def workdir_format(end: str) -> str:
    """WORKDIR_FORMAT with ``end``, a word the query draws at random: a work directory (a user
    chooses it, newlines included) cannot hold a word that did not exist when it was chosen."""
    return WORKDIR_FORMAT.format(end=end)


class HeldJob(NamedTuple):
    """A job Slurm holds (pending, running, completing) and where it was submitted from."""
    job_id: str
    user: str
    state: str
    work_dir: str


def squeue_work_dirs(text: str, end: str) -> list[HeldJob]:
    """``squeue --noheader --format=workdir_format(end)``'s records, each ended by ``|END``,
    ``end`` and a newline, never by a newline alone: a directory holding a newline and a line
    like another user's job stays that one directory. A ``|`` in a directory keeps it whole
    (the last field takes the rest)."""
    out = []
    for record in text.split(f"|END{end}\n")[:-1]:
        f = record.split("|", 3)
        if len(f) == 4 and f[0].strip().replace("_", "").isdigit():
            out.append(HeldJob(f[0].strip(), f[1], state(f[2]), f[3]))
    return out


def squeue_active(text: str) -> list[JobInfo]:
    """Pending and running jobs from ``squeue --noheader --states=PENDING,RUNNING
    --format=ACTIVE_FORMAT`` with SLURM_TIME_FORMAT=standard. Used for the planner's cluster
    view: ``squeue --json`` lists every finished job still in memory too (22.05 ignores
    --states with --json), megabytes on a busy cluster. A running job's start and every job's
    user id are what the queue estimate reads to end it early (queue.expected_ends)."""
    from pipeswift_slurm.slurm.timespec import slurm_time_seconds
    out = []
    for line in text.splitlines():
        f = line.split("|")
        if len(f) != 10:
            continue
        job_id, st, prio, part, count, limit, end, nodes, uid, start = f
        try:
            limit_min = None if limit in ("UNLIMITED", "NOT_SET", "INVALID", "") else slurm_time_seconds(limit) // 60
        except ValueError:
            limit_min = None
        out.append(JobInfo(
            job_id=job_id, name="", state=state(st), reason="", partition=part, nodes=nodes,
            node_names=expand_hostlist(nodes) if st == "RUNNING" and nodes else (),
            node_count=int(count) if count.isdigit() else 0, restarts=0, submit_time=None,
            start_time=epoch(start) if st == "RUNNING" else None, end_time=epoch(end), time_limit_min=limit_min,
            priority=int(prio) if prio.isdigit() else 0, qos="", user_id=int(uid) if uid.isdigit() else None))
    return out


def _exit_code(v: Any) -> str | None:
    """sacct's exit code as "RC" or "RC:SIGNAL"; v0.0.38 gives plain numbers, newer nest them."""
    if not isinstance(v, dict):
        return None
    rc = number(v.get("return_code"))
    sig = v.get("signal") or {}
    signo = number(sig.get("id") if isinstance(sig, dict) else None)
    if rc is None and signo is None:
        return None
    return f"{rc or 0}:{signo or 0}"


def sacct_records(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """``sacct --json`` jobs as history records (keys as the jobcomp plugin's environment)."""
    out = []
    for j in doc.get("jobs") or []:
        if not isinstance(j, dict):
            continue
        t: dict[str, Any] = j["time"] if isinstance(j.get("time"), dict) else {}
        out.append({"JOBID": j.get("job_id"), "JOBNAME": j.get("name"), "USERNAME": j.get("user"),
                    "PARTITION": j.get("partition"), "CLUSTER": j.get("cluster"),
                    "ACCOUNT": j.get("account"), "QOS": j.get("qos"),
                    "JOBSTATE": state(j.get("state")),
                    "SUBMIT": epoch(t.get("submission")), "START": epoch(t.get("start")),
                    "END": epoch(t.get("end")), "LIMIT": number(t.get("limit")),
                    "NODES": j.get("nodes"), "NODECNT": number(j.get("allocation_nodes")),
                    "WORK_DIR": j.get("working_directory"),
                    "EXITCODE": _exit_code(j.get("exit_code")),
                    "DERIVED_EC": _exit_code(j.get("derived_exit_code")),
                    "ELIGIBLE": epoch(t.get("eligible")), **_array(j.get("array")), **_usage(j, t)})
    return out


def _array(a: Any) -> dict[str, Any]:
    """sacct's ``array`` object (its ``job_id`` 0 and ``task_id`` unset: no array's task) as the
    jobcomp environment's ARRAYJOBID and ARRAYTASKID."""
    a = a if isinstance(a, dict) else {}
    return {"ARRAYJOBID": number(a.get("job_id")), "ARRAYTASKID": number(a.get("task_id"))}


def _tres(entries: Any) -> dict[str, float]:
    """A TRES list (``[{"type": "cpu", "name": "", "count": 2}, ...]``) as {"cpu": 2, "gres/gpu": 1};
    counts Slurm marks unset (negative, None) are left out."""
    out: dict[str, float] = {}
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and isinstance(e.get("count"), (int, float)) and e["count"] >= 0:
            key = e.get("type") or ""
            out[f"{key}/{e['name']}" if e.get("name") else key] = e["count"]
    return out


def _seconds(v: Any) -> float | None:
    """sacct's ``{"seconds": S, "microseconds": U}`` as seconds (U may exceed a million)."""
    if not isinstance(v, dict) or not isinstance(v.get("seconds"), (int, float)):
        return None
    return float(v["seconds"] + (v.get("microseconds") or 0) / 1e6)


def _usage(job: dict[str, Any], t: dict[str, Any]) -> dict[str, Any]:
    """Allocated CPUs, GPUs and memory (MB), requested memory, CPU time used (user + system,
    every step) and MaxRSS (the largest step's, MB) of one sacct job; None where sacct has none
    (MaxRSS needs a jobacct_gather plugin)."""
    tres: dict[str, Any] = job["tres"] if isinstance(job.get("tres"), dict) else {}
    alloc, req = _tres(tres.get("allocated")), _tres(tres.get("requested"))
    steps = [s for s in job.get("steps") or [] if isinstance(s, dict)]
    # the job's own total is 0 in 22.05 (its steps hold it); from 23.02 it is their sum
    times = [x for x in (_seconds(t.get("total")), sum(_seconds((s.get("time") or {}).get("total")) or 0.0
                                                        for s in steps)) if x is not None]
    cpu_time = max(times) if times else None
    rss = []
    for step in steps:
        used = (step.get("tres") or {}).get("requested") or {}
        mem = _tres(used.get("max") if isinstance(used, dict) else None).get("mem")
        if mem:
            rss.append(mem / 2**20)   # bytes
    return {"PROCS": alloc.get("cpu"), "ALLOC_GPUS": alloc.get("gres/gpu"),
            "ALLOC_MEM_MB": alloc.get("mem"), "REQ_MEM_MB": req.get("mem"),
            "CPU_TIME_S": cpu_time, "MAX_RSS_MB": max(rss) if rss else None}


def version(doc: dict[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of the Slurm that answered, from the answer's meta block."""
    meta = doc.get("meta") or {}
    v = (meta.get("slurm") or meta.get("Slurm") or {}).get("version") or {}
    try:
        return int(v["major"]), int(v["minor"])
    except (KeyError, TypeError, ValueError):
        return None
