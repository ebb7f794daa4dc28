#!/usr/bin/env python3
"""pswift jobcomp/script program: slurmctld runs it once per job attempt (preemption included)
with the job's fields in its environment (JOBID, JOBSTATE, START, END, NODES, WORK_DIR, ...).

It runs as root (or SlurmUser) on user-controlled input, and must be fast and must never fail
or hang slurmctld, so it:
1. spools Slurm's own record first (only the environment slurmctld set: identity, times, state)
   as one JSON file in a 0750 folder, written to a temp name and renamed (stdlib only, bounded);
2. then, best effort within --timeout seconds, merges it into the history database (0640) and,
   for a pswift job, reads the run directory (the job's WORK_DIR) through
   pipeswift_slurm.userfiles: in a child dropped to the job's UID/GID, never through a symlink,
   the user's regular files only, size-capped, SIGKILLed at the deadline; what the directory
   says about its user or job id is ignored (identity comes from Slurm's record).
Anything going wrong in step 2 (locked or corrupt DB, an unsafe or missing run dir, no
pipeswift_slurm on this Python) leaves the Slurm record (merged or spooled for
`pswift history ingest --spool DIR`) and logs one line to stderr. If even step 1 fails (full
disk), it logs and exits 0 all the same.

Install (see docs/admin.md, or `pswift admin install-plugins`): a wrapper that runs this file with --spool and
--db, named by JobCompType=jobcomp/script + JobCompLoc=<wrapper> in slurm.conf.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

FIELDS = ("ACCOUNT", "BATCH", "CLUSTER", "DERIVED_EC", "END", "EXITCODE", "GID", "GROUPNAME",
          "ELIGIBLE", "JOBID", "JOBNAME", "JOBSTATE", "LIMIT", "NODECNT", "NODES", "PARTITION", "PROCS", "QOS",
          "START", "STATEREASONPREV", "STDOUT", "SUBMIT", "UID", "USERNAME", "WORK_DIR",
          "ARRAYJOBID", "ARRAYTASKID", "RESERVATION")


def log(msg: str) -> None:
    try:
        print(f"pswift-jobcomp: {msg}", file=sys.stderr, flush=True)
    except Exception:
        pass


def spool(record: dict, spool_dir: str) -> str:
    os.makedirs(spool_dir, mode=0o750, exist_ok=True)
    name = f"{record.get('JOBID', 'x')}.{record.get('START', '0')}.{time.time_ns()}.json"
    tmp = os.path.join(spool_dir, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    with open(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    path = os.path.join(spool_dir, name)
    os.replace(tmp, path)
    return path


#: the folder that holds this plugin's package, and pipeswift_slurm beside it (site-packages, or
#: a checkout): the wrapper runs Python with -I, which reads no PYTHONPATH, and the install
#: checked this folder's every file is root's and writable by no one else
PACKAGES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def merge(path: str, db: str | None, deadline: float) -> None:
    if PACKAGES not in sys.path:
        sys.path.insert(0, PACKAGES)
    from pipeswift_slurm.history.store import History

    h = History(db, timeout=2.0)
    try:
        problem = h.ingest_spool_file(path, timeout=max(0.5, deadline - time.monotonic()))
    finally:
        h.close()
    if problem:
        log(problem)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spool", required=True)
    ap.add_argument("--db", default=None)
    ap.add_argument("--timeout", type=float, default=8.0)
    args = ap.parse_args(argv)
    # never hang slurmctld: give up on the merge (the spool file stays) after --timeout
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("merge timed out")))
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    deadline = time.monotonic() + args.timeout - 1.0
    record = {k: os.environ[k][:4096] for k in FIELDS if k in os.environ}
    record["recorded_at"] = time.time()
    try:
        path = spool(record, args.spool)
    except Exception as e:  # full disk, unwritable dir: nothing else we can do
        log(f"cannot spool job {record.get('JOBID')}: {e}")
        return 0
    try:
        merge(path, args.db, deadline)
    except BaseException as e:  # locked/corrupt DB, timeout, no pipeswift_slurm: keep the spool
        log(f"job {record.get('JOBID')} spooled at {path}, not merged ({type(e).__name__}: {e})")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return 0


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # pragma: no cover - last resort: never a non-zero exit
        log(f"unexpected: {type(e).__name__}: {e}")
    sys.exit(0)
