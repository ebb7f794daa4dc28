"""The jobcomp plugin's spool, file by file: a folder that is safe to read (:func:`unsafe_folder`),
one record read bounded and without following a link (:func:`read_record`), whose job it is by
Slurm's own fields (:func:`record_owner`), a merge bounded in time (:func:`deadline`), and a file
that could not be merged set aside with its reason (:func:`set_aside`), never lost. The history
store merges what these read (:meth:`History.ingest_spool`)."""

from __future__ import annotations

# Imports inside functions: signal and threading, only for a merge's deadline; userfiles, only
# when a record is read (the plugin imports this module at every job's end)

import contextlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Iterator

from pipeswift_slurm.errors import HistoryError, IngestRefused
from pipeswift_slurm.history.rows import Owner, user_name
from pipeswift_slurm.slurm.accounting import array_task


class Overtime(IngestRefused):
    """One spool file's merge ran past its deadline (it is set aside; the others go on)."""


@contextlib.contextmanager
def deadline(seconds: float, why: str) -> Iterator[None]:
    """Raise Overtime(why) in the block after ``seconds`` of wall time (a real-time timer: the
    main thread only; elsewhere the block runs unbounded, as userfiles' reader is still killed
    at its own deadline)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(*_: Any) -> None:
        raise Overtime(why)
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def unsafe_folder(d: Path) -> str | None:
    """Why the spool folder is not read, or None: it must be a real folder (not a link) of the
    reading user (root for the plugin's) that no other user may write into; the jobcomp plugin
    makes it so (0750)."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"spool {d} is not a directory (a link is not followed): nothing merged"
    if st.st_uid != os.geteuid():
        return f"spool {d} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}): nothing merged"
    if st.st_mode & 0o022:
        return (f"spool {d} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): nothing merged; "
                f"chmod go-w {d}")
    return None


def set_aside(spool: Path, f: Path, why: BaseException) -> str:
    """Move a spool file that could not be merged to ``bad/`` with a ``.why`` beside it; a
    ``bad`` that is a link or not a directory is never followed (the file then stays)."""
    bad = spool / "bad"
    text = f"{type(why).__name__}: {why}" if not isinstance(why, (IngestRefused, HistoryError)) else str(why)
    text = " ".join(text.split())[:500]
    try:
        os.mkdir(bad, 0o750)
    except FileExistsError:
        pass
    except OSError as e:
        return f"{f.name}: {text}; left in place ({bad}: {e.strerror})"
    st = os.lstat(bad)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return f"{f.name}: {text}; left in place ({bad} is not a directory of this user's)"
    os.replace(f, bad / f.name)
    fd = os.open(bad / f"{f.name}.why", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "w") as w:
        w.write(text + "\n")
    return f"{f.name}: {text}; moved to {bad}"


RECORD_MAX = 64 << 10
_RECORD_KEY = re.compile(r"^[A-Z_]{1,32}$|^recorded_at$")


def read_record(path: Path) -> dict[str, Any]:
    """One spool record, read without following a symlink or blocking on a FIFO, bounded."""
    from pipeswift_slurm import userfiles
    try:
        files = userfiles.read_one(str(path), RECORD_MAX)
    except userfiles.UnsafeFile as e:
        raise IngestRefused(str(e)) from None
    try:
        rec = json.loads(files.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise IngestRefused(f"{path.name} is not a JSON record ({type(e).__name__})") from None
    if not isinstance(rec, dict):
        raise IngestRefused(f"{path.name} is not a JSON object")
    return {k: v for k, v in rec.items() if isinstance(k, str) and _RECORD_KEY.match(k)
            and (isinstance(v, str) and len(v) <= 4096 or isinstance(v, (int, float)) and not isinstance(v, bool))}


def record_owner(rec: dict[str, Any]) -> Owner | None:
    """Whose job the record is, from Slurm's own fields (UID, GID, USERNAME, JOBID, PARTITION,
    CLUSTER). A job array's task is its array's job (ARRAYJOBID): a pswift run of members is one
    array, each member's end ingests the same run."""
    try:
        uid, gid = int(str(rec["UID"])), int(str(rec["GID"]))
    except (KeyError, ValueError):
        return None
    if not (0 <= uid < 2**32 and 0 <= gid < 2**32):
        return None
    job_id = array_task(rec)["array_job_id"] or (str(rec["JOBID"]) if rec.get("JOBID") else None)
    return Owner(str(rec.get("USERNAME") or user_name(uid)), uid, gid, job_id=job_id,
                 partition=str(rec["PARTITION"]) if rec.get("PARTITION") else None,
                 cluster=str(rec.get("CLUSTER") or ""))


def regular_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
