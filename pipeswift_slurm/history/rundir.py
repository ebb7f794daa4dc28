"""Run directories: what `pswift sbatch`/`pswift run` leave for the job and what the job leaves back.

A run directory holds ``train.toml`` (a copy), ``plan.json``, ``job.sbatch``, the job's log
(``slurm-<id>.out``), ``events.jsonl`` (one JSON object per line, written by the job) and
``checkpoints/``. It is created whole or not at all: files are written into a temporary sibling
that is renamed into place, so a failed submission leaves nothing behind.
"""

from __future__ import annotations

# Imports inside functions: the history package and stats, which import this module (a cycle
# otherwise)

import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

from pipeswift_slurm import runfiles
from pipeswift_slurm.errors import RunDirError

EVENTS = runfiles.EVENTS  # written by the launcher, read through events.py
CANCEL = runfiles.CANCEL   # written by `pswift cancel`: who cancelled the job, and when


def default_run_dir(job_name: str, base: Path | None = None) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_name)[:60] or "job"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return (base or Path.cwd() / "pswift-runs") / f"{safe}-{stamp}-{os.urandom(2).hex()}"


def state_dir() -> Path:
    """Per-user state (the job-id registry): $PSWIFT_HOME, else platformdirs' user_state_dir on
    Linux: $XDG_STATE_HOME/pswift, ~/.local/state/pswift without it (the XDG rule, not the
    library: importing platformdirs costs 13 ms of every `pswift sbatch`)."""
    env = os.environ.get("PSWIFT_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state") / "pswift"


def stage_run_dir(target: Path) -> Path:
    """A fresh temporary sibling of ``target`` to fill before :func:`commit_run_dir`."""
    target = target.resolve()
    if "\n" in str(target) or "\r" in str(target):
        raise RunDirError(f"run directory {str(target)!r} contains a newline; choose another --run-dir")
    if target.exists():
        raise RunDirError(f"run directory {target} already exists; pass a new --run-dir")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.tmp-{os.urandom(3).hex()}"
        tmp.mkdir()
    except OSError as e:
        raise RunDirError(f"cannot create run directory {target}: {e.strerror}; "
                          f"choose a writable --run-dir") from None
    return tmp


def commit_run_dir(tmp: Path, target: Path) -> None:
    try:
        os.rename(tmp, target)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunDirError(f"cannot create run directory {target}: {e.strerror}") from None


def discard(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def register_job(job_id: str, run_dir: Path) -> None:
    """Remember which run directory a job id belongs to (for `pswift status JOBID`)."""
    d = state_dir() / "jobs"
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{job_id}.{os.urandom(3).hex()}"
        tmp.write_text(json.dumps({"job_id": job_id, "run_dir": str(run_dir)}) + "\n")
        os.replace(tmp, d / f"{job_id}.json")
    except OSError as e:
        raise RunDirError(f"job {job_id} was submitted (run dir {run_dir}) but the registry "
                          f"{d} is not writable ({e.strerror}); set PSWIFT_HOME") from None


def registered_jobs(limit: int | None = None) -> list[tuple[str, Path]]:
    """This user's registered jobs, newest (highest id) first: (job id, run directory)."""
    d = state_dir() / "jobs"
    try:
        ids = [p.name[:-5] for p in d.iterdir() if p.name.endswith(".json") and p.name[:-5].isdigit()]
    except OSError:
        return []
    out = []
    for job_id in sorted(ids, key=int, reverse=True)[:limit]:
        run = lookup_job(job_id)
        if run is not None:
            out.append((job_id, run))
    return out


def lookup_job(job_id: str) -> Path | None:
    f = state_dir() / "jobs" / f"{job_id}.json"
    try:
        return Path(json.loads(f.read_text())["run_dir"])
    except (OSError, ValueError, KeyError):
        return None


def summarize(run_dir: Path) -> dict[str, Any]:
    """Attempts, steps, last loss from the run's events."""
    from pipeswift_slurm import events
    from pipeswift_slurm.history import eventfold
    from pipeswift_slurm.stats import median

    from pipeswift_slurm import userfiles
    fold = eventfold.Fold()   # events.jsonl folded as it is read, never held whole
    try:   # a user's file, read by anyone (root too): no link followed, no FIFO waited on, bounded
        files = (userfiles.read_for_command(str(run_dir), (events.FILE, runfiles.PLAN, CANCEL), events_sink=fold.feed)
                 if os.path.lexists(run_dir) else {})
    except userfiles.UnsafeFile as e:
        raise RunDirError(f"run directory not read: {e}") from None
    attempts = fold.attempts()
    out = []
    for a in attempts:
        start, end = a["start"] or {}, a["end"] or {}
        now = a["starts"][-1] if a["starts"] else {}   # the layout after any in-job re-layout
        last = a["steps"][-1] if a["steps"] else {}
        out.append({
            "attempt": a["attempt"], "nodes": now.get("nodes"), "stages": now.get("stages"),
            "data_parallel": now.get("data_parallel"), "boundaries": now.get("boundaries"),
            "start_step": start.get("step"), "relayouts": eventfold.relayout_outcomes(a),
            "crashes": [{k: c[k] for k in ("step", "rank", "node", "how", "error", "action", "restart", "why")}
                        for c in a["crashes"]],
            "end_step": end["step"] if end.get("step") is not None else last.get("step"),
            "resumed_from": start.get("resumed_from"), "ended": a["ended"],
            "last_loss": last.get("loss"),
            "median_step_s": median(a["steps"].step_time),
        })
    logs = [a["steps"] for a in attempts if a["steps"]]
    return {
        "run_dir": str(run_dir),
        "step": logs[-1][-1]["step"] if logs else None,
        "steps_total": _planned_steps(files.get(runfiles.PLAN, b"")),
        "job_name": _job_name(files.get(runfiles.PLAN, b"")),
        "cancelled": _cancel_record(files.get(CANCEL, b"")),
        "first_loss": logs[0][0]["loss"] if logs else None,
        "last_loss": logs[-1][-1]["loss"] if logs else None,
        "growths": eventfold.growth_outcomes(attempts),
        "attempts": out,
    }


def job_name_of(run_dir: Path, timeout: float = 5.0) -> str | None:
    """The job name in ``run_dir``'s plan.json (read alone: bounded, no link, as its owner when
    root asks, within ``timeout`` seconds); None where it is not a run directory this process can
    read. What a listing of other users' jobs asks first, before it folds any events."""
    from pipeswift_slurm import userfiles
    try:
        files = (userfiles.read_for_command(str(run_dir), (runfiles.PLAN,), timeout=timeout)
                 if os.path.lexists(run_dir) else {})
    except (userfiles.UnsafeFile, OSError):
        return None
    return _job_name(files.get(runfiles.PLAN, b""))


def _job_name(plan_json: bytes) -> str | None:
    """The run's job name (plan.json's job_name); None where it says none."""
    try:
        name = json.loads(plan_json)["job_name"]
    except (ValueError, KeyError, TypeError):
        return None
    return name if isinstance(name, str) else None


def _planned_steps(plan_json: bytes) -> int | None:
    """The run's planned steps (plan.json's training.steps); None where it says none."""
    try:
        steps = json.loads(plan_json)["training"]["steps"]
    except (ValueError, KeyError, TypeError):
        return None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and 0 < steps <= 10**13 else None


def record_cancel(run_dir: Path, job_id: str, user: str, when: float) -> None:
    """Keep who cancelled the job with `pswift cancel`, and when (status shows it), written as
    the run directory's owner (userfiles.write_for_command); a run directory that cannot be
    written loses only the note."""
    from pipeswift_slurm import userfiles
    blob = (json.dumps({"job_id": job_id, "user": user, "time": when}) + "\n").encode()
    try:
        userfiles.write_for_command(str(run_dir), CANCEL, blob)
    except (userfiles.UnsafeFile, OSError):
        pass


def _cancel_record(blob: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(blob)
    except ValueError:
        return None
    ok = (isinstance(rec, dict) and isinstance(rec.get("user"), str) and len(rec["user"]) < 256
          and isinstance(rec.get("time"), (int, float)) and 0 <= rec["time"] < 1e11)
    return {"user": rec["user"], "time": float(rec["time"])} if ok else None
