"""Slurm's accounting records (a jobcomp plugin's environment, a jobcomp/filetxt line, sacct's
JSON) as one row each for the history: Slurm's time and limit forms read here, with the one
epoch reader (:func:`pipeswift_slurm.slurm.records.epoch`) and the one duration reader
(:func:`pipeswift_slurm.config.slurm_time_seconds`, train.toml's ``time`` being Slurm's form)."""

from __future__ import annotations

from typing import Any

from pipeswift_slurm.slurm.timespec import slurm_time_seconds
from pipeswift_slurm.slurm.records import epoch


#: how long after a job's end slurmdbd may still be filling in its record
SACCT_SETTLE_S = 300.0


def sacct_read_mark(records: list[dict[str, Any]], now: float) -> float | None:
    """Where the next sacct read starts: the newest end among ``records``, but never past the
    end of a record slurmdbd has not finished (22.05 shows a job COMPLETED with no QOS for
    about 2 s after it ends); such a record is read again next time, filling what is missing,
    unless it ended over SACCT_SETTLE_S ago (then it stays as it is). None: no ended record."""
    ends = [(e, r) for e, r in ((epoch(r.get("END")), r) for r in records) if e is not None]
    if not ends:
        return None
    unfinished = [e for e, r in ends if not r.get("QOS") and now - e < SACCT_SETTLE_S]
    newest = max(e for e, _ in ends)
    return min(newest, *unfinished) if unfinished else newest


def _int(v: Any) -> int | None:
    """A count Slurm gives (digits, at most 15 of them: inside SQLite's int64), else None."""
    text = str(v if v is not None else "").strip()
    return int(text) if text.isdigit() and len(text) <= 15 else None


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x == x and x >= 0 else None


def limit_seconds(v: Any) -> float | None:
    """A time limit in seconds: sacct's minutes (a number), or Slurm's text ``[D-]HH:MM:SS``,
    ``MM:SS``, ``MM`` (jobcomp, filetxt); None for UNLIMITED and anything unreadable."""
    if isinstance(v, (int, float)):
        return float(v) * 60 if v > 0 else None
    try:
        return float(slurm_time_seconds(str(v or ""))) or None
    except ValueError:
        return None


def normalise_record(r: dict[str, Any], source: str) -> dict[str, Any] | None:
    """One Slurm attempt from a jobcomp env record, a filetxt line or sacct JSON (keys upper).
    A field the source does not carry is None (unknown), never 0."""
    jid = r.get("JOBID")
    start = epoch(r.get("START"))
    if not jid or start is None:
        return None
    ec, dec = r.get("EXITCODE"), r.get("DERIVED_EC")
    state = (r.get("JOBSTATE") or "").upper() or None
    if state == "PENDING" and epoch(r.get("END")) is not None:
        state = "REQUEUED"   # an attempt that ended back in the queue (22.05's plugin after `scontrol requeue`)
    return {"cluster": r.get("CLUSTER") or "", "job_id": str(jid), "start": start,
            "name": r.get("JOBNAME"), "user": r.get("USERNAME"), "partition": r.get("PARTITION"),
            "state": state,
            "node_count": _int(r.get("NODECNT")),
            "nodes": r.get("NODES"), "submit": epoch(r.get("SUBMIT")), "end": epoch(r.get("END")),
            "exit_code": None if ec is None else str(ec), "work_dir": r.get("WORK_DIR"),
            "time_limit": None if r.get("LIMIT") is None else str(r.get("LIMIT")),
            "procs": _int(r.get("PROCS")), "source": source,
            "account": r.get("ACCOUNT") or None, "qos": r.get("QOS") or None,
            "derived_exit_code": None if dec is None else str(dec),
            "limit_s": limit_seconds(r.get("LIMIT")), "gpus": _int(r.get("ALLOC_GPUS")),
            "mem_mb": _num(r.get("ALLOC_MEM_MB")), "req_mem_mb": _num(r.get("REQ_MEM_MB")),
            "cpu_time_s": _num(r.get("CPU_TIME_S")), "max_rss_mb": _num(r.get("MAX_RSS_MB")),
            "eligible": epoch(r.get("ELIGIBLE")), **array_task(r)}


#: Slurm's NO_VAL: the task index of a job that is not an array's task
_NO_TASK = 0xfffffffe


def array_task(r: dict[str, Any]) -> dict[str, Any]:
    """A job array's task: the array's job id and the task's index, from ARRAYJOBID and
    ARRAYTASKID (the jobcomp environment's names; filetxt and sacct are read into them); both
    None for a job that is no array's task (Slurm gives it array job id 0)."""
    array, task = _int(r.get("ARRAYJOBID")), _int(r.get("ARRAYTASKID"))
    if not array or task is None or not 0 <= task < _NO_TASK:
        return {"array_job_id": None, "array_task_id": None}
    return {"array_job_id": str(array), "array_task_id": task}
