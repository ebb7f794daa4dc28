"""Reading a user's run directory from a privileged process (the jobcomp plugin runs as root;
an admin's `pswift history ingest --spool` too): the one fence around user-controlled files.

- The directory and each file are opened without following a symlink in the last component
  (``O_NOFOLLOW``; files relative to the directory's descriptor, so nothing can be swapped in
  between), without blocking (``O_NONBLOCK``: a FIFO cannot hang the reader), and accepted only
  when they are regular files owned by the expected user; each read is capped in size.
- Where the reader is root and the files belong to someone else, the reading happens in a forked
  child that first drops to that user's UID/GID (so it can read nothing the user could not), and
  is SIGKILLed at a hard deadline; the parent gets only bytes back, and parses them itself as
  hostile input (the user can tamper with a process running as them).
"""

from __future__ import annotations

import os
import select
import signal
import stat
import struct
import time
from typing import NamedTuple

#: what a run directory may hold for the history, and the most of each that is read
LIMITS = {"plan.json": 4 << 20, "JOB_ID": 64, "events.jsonl": 256 << 20}


class UnsafeFile(Exception):
    """A user file that is not read: a symlink, not a regular file, not the user's, too big,
    or not read in time. ``str()`` says which and why."""


class RunFiles(NamedTuple):
    owner: int                     # UID owning the run directory
    data: dict[str, bytes | None]  # name -> content (None: absent)
    events_size: int
    events_mtime: float


def _read_capped(fd: int, limit: int, name: str) -> bytes:
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise UnsafeFile(f"{name} is larger than {limit} bytes")


def _open_dir(path: str, uid: int | None) -> tuple[int, int]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise UnsafeFile(f"{path}: {e.strerror or e} (symlinks are not followed)") from None
    owner = os.fstat(fd).st_uid
    if uid is not None and owner != uid:
        os.close(fd)
        raise UnsafeFile(f"{path} belongs to uid {owner}, not the job's uid {uid}")
    return fd, owner


_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _read_checked(shown: str, name: str, limit: int, dir_fd: int | None = None,
                  owner: int | None = None) -> tuple[bytes, os.stat_result] | None:
    """A regular file (of ``owner``, when given) not opened through a symlink, at most
    ``limit`` bytes, with its stat; None when it does not exist."""
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnsafeFile(f"{shown}: {e.strerror or e} (symlinks are not followed)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{shown} is not a regular file")
        if owner is not None and st.st_uid != owner:
            raise UnsafeFile(f"{shown} belongs to uid {st.st_uid}, not the run directory's owner {owner}")
        if st.st_size > limit:
            raise UnsafeFile(f"{shown} is larger than {limit} bytes")
        return _read_capped(fd, limit, shown), st
    finally:
        os.close(fd)


def read_run_files(path: str, uid: int | None = None) -> RunFiles:
    """Read the run directory's files in this process, with every check but the privilege drop.
    ``uid``: the user the directory and files must belong to (None: whoever owns the directory)."""
    dfd, owner = _open_dir(path, uid)
    data: dict[str, bytes | None] = {}
    size, mtime = 0, 0.0
    try:
        for name, limit in LIMITS.items():
            got = _read_checked(f"{path}/{name}", name, limit, dir_fd=dfd, owner=owner)
            data[name] = None if got is None else got[0]
            if got is not None and name == "events.jsonl":
                size, mtime = got[1].st_size, got[1].st_mtime
    finally:
        os.close(dfd)
    return RunFiles(owner, data, size, mtime)


def read_one(path: str, limit: int) -> bytes:
    """One file (e.g. a spool record): not through a symlink, regular, at most ``limit`` bytes."""
    got = _read_checked(path, path, limit)
    if got is None:
        raise UnsafeFile(f"{path}: no such file")
    return got[0]


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:  # pragma: no cover - the kernel said yes
        raise OSError("privileges were not dropped")


def _encode(files: RunFiles) -> bytes:
    out = [struct.pack("<qqd", files.owner, files.events_size, files.events_mtime)]
    for name in LIMITS:
        v = files.data[name]
        out.append(struct.pack("<q", -1 if v is None else len(v)) + (v or b""))
    return b"".join(out)


def _decode(blob: bytes) -> RunFiles:
    owner, size, mtime = struct.unpack_from("<qqd", blob, 0)
    pos, data = 24, {}
    for name, limit in LIMITS.items():
        (n,) = struct.unpack_from("<q", blob, pos)
        pos += 8
        if n > limit or pos + max(n, 0) > len(blob):
            raise UnsafeFile(f"the reader sent a malformed answer for {name}")
        data[name] = None if n < 0 else blob[pos:pos + n]
        pos += max(n, 0)
    return RunFiles(owner, data, size, mtime)


def read_run_files_as(path: str, uid: int, gid: int, timeout: float) -> RunFiles:
    """:func:`read_run_files` for the user ``uid``: in a child dropped to ``uid``/``gid`` when
    this process is root and ``uid`` is not, SIGKILLed after ``timeout`` seconds."""
    if os.geteuid() != 0 or uid == 0:
        return read_run_files(path, uid)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 0
        try:
            os.close(rfd)
            _drop_to(uid, gid)
            try:
                payload = b"K" + _encode(read_run_files(path, uid))
            except UnsafeFile as e:
                payload = b"E" + str(e).encode("utf-8", "replace")[:4000]
            view = memoryview(payload)
            while view:
                view = view[os.write(wfd, view):]
        except BaseException:
            code = 1
        os._exit(code)
    os.close(wfd)
    try:
        blob = _collect(rfd, pid, time.monotonic() + timeout, path)
    finally:
        os.close(rfd)
        _reap(pid)
    if blob[:1] == b"E":
        raise UnsafeFile(blob[1:].decode("utf-8", "replace"))
    if blob[:1] != b"K":
        raise UnsafeFile(f"the reader of {path} failed")
    return _decode(blob[1:])


def _collect(rfd: int, pid: int, deadline: float, path: str) -> bytes:
    cap = sum(LIMITS.values()) + 4096
    chunks, total = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([rfd], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            raise UnsafeFile(f"reading {path} took longer than the deadline; killed the reader")
        chunk = os.read(rfd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > cap:
            os.kill(pid, signal.SIGKILL)
            raise UnsafeFile(f"the reader of {path} sent more than {cap} bytes")
        chunks.append(chunk)


def _reap(pid: int) -> None:
    """Collect the child; one still running after its answer (or its deadline) is killed."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:
        pass
