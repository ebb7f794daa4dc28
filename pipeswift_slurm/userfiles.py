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
from typing import Callable, NamedTuple

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
                  owner: int | None = None, tail: bool = False) -> tuple[bytes, os.stat_result] | None:
    """A regular file (of ``owner``, when given) not opened through a symlink, at most
    ``limit`` bytes (``tail``: a longer file gives its last ``limit`` bytes), with its stat;
    None when it does not exist."""
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
            if not tail:
                raise UnsafeFile(f"{shown} is larger than {limit} bytes")
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        if tail:   # a log may grow while it is read: its first ``limit`` bytes from there
            chunks, total = [], 0
            while total < limit and (chunk := os.read(fd, min(1 << 20, limit - total))):
                chunks.append(chunk)
                total += len(chunk)
            return b"".join(chunks), st
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


def read_tail(path: str, limit: int) -> bytes | None:
    """A file's last ``limit`` bytes: not through a symlink, regular; None when absent."""
    got = _read_checked(path, path, limit, tail=True)
    return None if got is None else got[0]


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
    return _decode(_as_user(uid, gid, timeout, path, sum(LIMITS.values()) + 4096,
                            lambda: _encode(read_run_files(path, uid))))


def _as_user(uid: int, gid: int, timeout: float, path: str, cap: int, produce: Callable[[], bytes]) -> bytes:
    """``produce()`` run in a forked child dropped to ``uid``/``gid``, SIGKILLed after
    ``timeout`` seconds; its bytes (at most ``cap``), or its UnsafeFile raised here."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 0
        try:
            os.close(rfd)
            _drop_to(uid, gid)
            try:
                payload = b"K" + produce()
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
        blob = _collect(rfd, pid, time.monotonic() + timeout, path, cap)
    finally:
        os.close(rfd)
        _reap(pid)
    if blob[:1] == b"E":
        raise UnsafeFile(blob[1:].decode("utf-8", "replace"))
    if blob[:1] != b"K":
        raise UnsafeFile(f"the reader of {path} failed")
    return blob[1:]


#: what an admin command reads of a run directory (`pswift status`, `pswift doctor`): names or
#: shell patterns, each with the most read of it (a log: its last that many bytes)
ADMIN_READS = {"plan.json": 4 << 20, "events.jsonl": 256 << 20, "slurm-*.out": 4 << 20}


def read_for_command(path: str, names: tuple[str, ...], timeout: float = 30.0) -> dict[str, bytes]:
    """Files of the run directory ``path`` for a command that anyone may run, root included
    (``names``: keys of ADMIN_READS): the directory and each file opened without following a
    link and without blocking, regular files of the directory's owner only, each bounded (logs
    read from their end); as that owner, in a child SIGKILLed after ``timeout`` seconds, when
    this process is root and the owner is not. Absent files are left out; a refused file
    raises UnsafeFile saying why."""
    dfd, owner = _open_dir(path, None)
    os.close(dfd)
    if os.geteuid() != 0 or owner == 0:
        return _read_named(path, names, owner)
    import pwd
    try:
        gid = pwd.getpwuid(owner).pw_gid
    except KeyError:
        gid = os.stat(path, follow_symlinks=False).st_gid
    cap = sum(ADMIN_READS[n] for n in names) * 2 + 4096
    return _unpack(_as_user(owner, gid, timeout, path, cap, lambda: _pack(_read_named(path, names, owner))))


def _read_named(path: str, names: tuple[str, ...], owner: int) -> dict[str, bytes]:
    import fnmatch
    dfd, _ = _open_dir(path, owner)
    out: dict[str, bytes] = {}
    try:
        present = sorted(os.listdir(dfd))
        for pattern in names:
            limit = ADMIN_READS[pattern]
            for name in (n for n in present if fnmatch.fnmatchcase(n, pattern)):
                got = _read_checked(f"{path}/{name}", name, limit, dir_fd=dfd, owner=owner,
                                    tail="*" in pattern)
                if got is not None:
                    out[name] = got[0]
    finally:
        os.close(dfd)
    return out


def _pack(files: dict[str, bytes]) -> bytes:
    out = []
    for name, blob in files.items():
        raw = name.encode("utf-8", "surrogateescape")
        out.append(struct.pack("<qq", len(raw), len(blob)) + raw + blob)
    return b"".join(out)


def _unpack(blob: bytes) -> dict[str, bytes]:
    out, pos = {}, 0
    while pos < len(blob):
        if pos + 16 > len(blob):
            raise UnsafeFile("the reader sent a malformed answer")
        n, m = struct.unpack_from("<qq", blob, pos)
        pos += 16
        if n < 0 or m < 0 or n > 4096 or pos + n + m > len(blob):
            raise UnsafeFile("the reader sent a malformed answer")
        out[blob[pos:pos + n].decode("utf-8", "surrogateescape")] = blob[pos + n:pos + n + m]
        pos += n + m
    return out


def _collect(rfd: int, pid: int, deadline: float, path: str, cap: int) -> bytes:
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
