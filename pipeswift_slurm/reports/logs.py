"""`pswift logs JOB [-f]`: a job's log, ``RUN_DIR/slurm-JOBID.out``. Every attempt of a requeued
job appends to that one file (``--open-mode=append``), so following it follows the job across
requeues until Slurm says it ended.

The log is the job's user's file, read by whoever asks (an admin too): by root only after
dropping to the run directory's owner (userfiles.become_owner), opened without following a link
and without blocking (a FIFO cannot hang the reader), a regular file of that owner only, and
only its last MAX_SHOWN bytes shown at first.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Callable

from pipeswift_slurm import runfiles
from pipeswift_slurm.errors import RunDirError

MAX_SHOWN = 4 << 20
POLL_S = (0.5, 5.0)      # the first and the longest wait between two looks at a quiet log


def log_path(run_dir: Path, job_id: str) -> Path:
    return Path(run_dir) / runfiles.slurm_log(job_id)


def _open(path: Path, owner: int | None) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RunDirError(f"{path}: {e.strerror} (links are not followed)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (owner is not None and st.st_uid != owner):
        os.close(fd)
        raise RunDirError(f"{path} is not a regular file of the run directory's owner")
    return fd


def show(path: Path, write: Callable[[str], None], lines: int | None = None, follow: bool = False,
         ended: Callable[[], bool] = lambda: True, owner: int | None = None) -> bool:
    """Write the log (its last ``lines`` lines, else its last MAX_SHOWN bytes); with ``follow``,
    then what is appended, until ``ended()`` and nothing more comes. False when there is no log
    (and, following, the job ended before writing one). ``owner``: the UID the log must belong to."""
    wait = POLL_S[0]
    fd = _open(path, owner)
    while fd is None:
        if not follow or ended():
            return False
        time.sleep(wait)
        wait = min(POLL_S[1], wait * 2)
        fd = _open(path, owner)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - MAX_SHOWN)
        os.lseek(fd, start, os.SEEK_SET)
        head = os.read(fd, size - start + 1) if size > start else b""
        text = head.decode("utf-8", "replace")
        if lines is not None:
            text = "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else ""
        write(text)
        wait = POLL_S[0]
        while follow:
            chunk = os.read(fd, 1 << 20)
            if chunk:
                write(chunk.decode("utf-8", "replace"))
                wait = POLL_S[0]
                continue
            if ended():
                rest = os.read(fd, MAX_SHOWN)
                while rest:
                    write(rest.decode("utf-8", "replace"))
                    rest = os.read(fd, MAX_SHOWN)
                break
            time.sleep(wait)
            wait = min(POLL_S[1], wait * 1.5)
    finally:
        os.close(fd)
    return True
