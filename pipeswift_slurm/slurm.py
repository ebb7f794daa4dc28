"""The one module that talks to Slurm (through its CLI: sbatch, squeue, scontrol, sacct).

Every call goes through :func:`_run`, which turns any failure into a :class:`SlurmError` that
carries the command, its exit code and Slurm's own words on one line. pyslurm is not usable with
Debian's Slurm 22.05 (PyPI's pyslurm needs 25.11), so the CLI is the backend here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from .queue import ClusterState

from .errors import SlurmError

TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
    "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED",
})


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run(cmd: Sequence[str], timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    """Run a Slurm command; on failure raise SlurmError with command, exit code, stdout, stderr."""
    exe = cmd[0]
    if shutil.which(exe) is None:
        raise SlurmError(f"{exe}: command not found; install Slurm's client tools (slurm-client) or "
                         f"start the dev cluster with scripts/slurm-dev-cluster start")
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(cmd)}` did not answer within {timeout:.0f} s; "
                         f"is slurmctld running (scontrol ping)?") from None
    if check and proc.returncode != 0:
        said = _one_line(proc.stderr or proc.stdout or "no output")
        raise SlurmError(f"`{shlex.join(cmd)}` failed (exit {proc.returncode}): {said}")
    return proc


def submit(script: str, extra_args: Sequence[str] = (), cwd: str | None = None) -> str:
    """``sbatch --parsable [extra_args] script``; returns the job id."""
    cmd = ["sbatch", "--parsable", *extra_args, script]
    if cwd is not None:
        cmd[1:1] = [f"--chdir={cwd}"]
    out = _run(cmd).stdout.strip()
    job_id = out.split(";")[0].strip()
    if not job_id.isdigit():
        raise SlurmError(f"`{shlex.join(cmd)}` printed {out!r}, not a job id")
    return job_id


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    state: str
    reason: str
    partition: str
    nodes: str
    node_count: int
    restarts: int
    submit_time: int | None
    start_time: int | None
    end_time: int | None
    time_limit_min: int | None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def _state(v: Any) -> str:
    if isinstance(v, list):  # openapi >= 0.0.40 gives a list of flags
        return str(v[0]) if v else "UNKNOWN"
    return str(v or "UNKNOWN")


def _num(v: Any) -> int | None:
    if isinstance(v, dict):  # newer openapi: {"set": bool, "infinite": bool, "number": N}
        return int(v["number"]) if v.get("set") and not v.get("infinite") else None
    return int(v) if isinstance(v, (int, float)) else None


def parse_squeue_json(text: str) -> list[JobInfo]:
    """Jobs from ``squeue --json`` (openapi v0.0.38 as in Slurm 22.05, and later layouts)."""
    data = json.loads(text)
    jobs = []
    for j in data.get("jobs", []):
        jobs.append(JobInfo(
            job_id=str(j.get("job_id")), name=str(j.get("name", "")), state=_state(j.get("job_state")),
            reason=str(j.get("state_reason", "")), partition=str(j.get("partition", "")),
            nodes=str(j.get("nodes", "")), node_count=_num(j.get("node_count")) or 0,
            restarts=_num(j.get("restart_cnt")) or 0, submit_time=_num(j.get("submit_time")),
            start_time=_num(j.get("start_time")), end_time=_num(j.get("end_time")),
            time_limit_min=_num(j.get("time_limit")),
        ))
    return jobs


def job_info(job_id: str) -> JobInfo | None:
    """The job as squeue sees it (including recently finished jobs), or None once purged."""
    proc = _run(["squeue", "--json", "--states=all", "--jobs", str(job_id)], check=False)
    if proc.returncode != 0:
        if "Invalid job id" in (proc.stderr + proc.stdout):
            return None
        raise SlurmError(f"`squeue --json --jobs {job_id}` failed (exit {proc.returncode}): "
                         f"{_one_line(proc.stderr or proc.stdout or 'no output')}")
    for j in parse_squeue_json(proc.stdout):
        if j.job_id == str(job_id):
            return j
    return None


def show_job(job_id: str) -> dict[str, str]:
    """``scontrol show job -o JOBID`` as a dict (values may hold spaces)."""
    out = _run(["scontrol", "show", "job", "-o", str(job_id)]).stdout.strip()
    fields: dict[str, str] = {}
    for part in re.split(r" (?=[A-Za-z][A-Za-z:/_]*=)", out):
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    return fields


def being_preempted(job_id: str) -> bool:
    """True while Slurm is preempting the job (PreemptTime is set; a plain scancel leaves it None).

    A job whose tasks stop during GraceTime ends COMPLETED or FAILED instead of being requeued,
    so the job must requeue itself after its checkpoint."""
    value = show_job(job_id).get("PreemptTime", "None")
    return value not in ("None", "Unknown", "")


def cluster_state(now: float | None = None) -> "ClusterState":
    """Nodes (``sinfo --json``) and running/pending jobs (``squeue --json``) for the planner."""
    import time as _time

    from .queue import ClusterState, NodeState, PendingJob, RunningJob

    nodes_doc = json.loads(_run(["sinfo", "--json"]).stdout)
    nodes = [NodeState(name=str(n["name"]), state=_state(n.get("state")).lower(),
                       cpus=int(n.get("cpus") or 0), idle_cpus=int(n.get("idle_cpus") or 0),
                       partitions=tuple(n.get("partitions") or ()))
             for n in nodes_doc.get("nodes", [])]
    jobs_doc = json.loads(_run(["squeue", "--json"]).stdout)
    running, pending = [], []
    for j in sorted(jobs_doc.get("jobs", []), key=lambda j: -(_num(j.get("priority")) or 0)):
        state = _state(j.get("job_state"))
        if state == "RUNNING":
            alloc = (j.get("job_resources") or {}).get("allocated_nodes") or []
            names = tuple(str(a.get("nodename")) for a in alloc if isinstance(a, dict))
            end = _num(j.get("end_time"))
            running.append(RunningJob(str(j.get("job_id")), names, float(end) if end else float("inf")))
        elif state == "PENDING":
            limit = _num(j.get("time_limit"))
            pending.append(PendingJob(str(j.get("job_id")), str(j.get("partition", "")),
                                      _num(j.get("node_count")) or 1,
                                      float(limit) * 60 if limit else float("inf")))
    return ClusterState(now=now if now is not None else _time.time(), nodes=nodes,
                        running=running, pending=pending)


def accounting_records(jobcomp_file: str | None = None) -> tuple[str, str] | None:
    """(source, text) of finished-job records: ``sacct --json`` where slurmdbd exists, else the
    jobcomp/filetxt file (``sacct -c`` reads the same; its ``--json`` fails), else None."""
    if shutil.which("sacct") is not None:
        proc = _run(["sacct", "--json", "--allusers", "--starttime=1970-01-01"], check=False)
        if proc.returncode == 0 and proc.stdout.lstrip().startswith("{"):
            return "sacct", proc.stdout
    if jobcomp_file:
        try:
            with open(jobcomp_file, encoding="utf-8", errors="replace") as f:
                return "filetxt", f.read()
        except OSError:
            return None
    return None


def test_only_start(nodes: int, cpus_per_node: int, partition: str | None, time_limit: str | None,
                    now: float | None = None) -> float | None:
    """Slurm's own estimate (``sbatch --test-only``) of when a job of this shape would start,
    as epoch seconds; None when Slurm says it cannot. It consumes a job id per call."""
    import datetime as _dt
    import re as _re
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write("#!/bin/bash\ntrue\n")
        script = f.name
    try:
        cmd = ["sbatch", "--test-only", f"--nodes={nodes}", f"--mincpus={cpus_per_node}"]
        if partition:
            cmd.append(f"--partition={partition}")
        if time_limit:
            cmd.append(f"--time={time_limit}")
        proc = _run([*cmd, script], check=False)
    finally:
        os.unlink(script)
    m = _re.search(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", proc.stderr + proc.stdout)
    if proc.returncode != 0 or m is None:
        return None
    return _dt.datetime.fromisoformat(m.group(1)).timestamp()


def requeue(job_id: str) -> None:
    _run(["scontrol", "requeue", str(job_id)])


def cancel(job_id: str) -> None:
    _run(["scancel", str(job_id)])
