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

# Imports inside functions: pwd, only where root reads another user's files (their group, to
# drop to)

import contextlib
import fnmatch
import os
import select
import signal
import stat
import struct
import tempfile
import time
from typing import BinaryIO, Callable, NamedTuple

from pipeswift_slurm import runfiles
from pipeswift_slurm.errors import OutputRefused

#: what a run directory may hold for the history, and the most of each that is read
LIMITS = {runfiles.PLAN: 4 << 20, runfiles.JOB_ID: 64, runfiles.EVENTS: 256 << 20}


class UnsafeFile(Exception):
    """A user file that is not read: a symlink, not a regular file, not the user's, too big,
    or not read in time. ``str()`` says which and why."""


class RunFiles(NamedTuple):
    owner: int                     # UID owning the run directory
    data: dict[str, bytes | None]  # name -> content (None: absent)
    events_size: int
    events_mtime: float


def _read_capped(fd: int, limit: int, name: str, sink: Callable[[bytes], None] | None = None) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise UnsafeFile(f"{name} is larger than {limit} bytes")
        if sink is None:
            chunks.append(chunk)
        else:
            sink(chunk)


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
                  owner: int | None = None, tail: bool = False,
                  sink: Callable[[bytes], None] | None = None) -> tuple[bytes, os.stat_result] | None:
    """A regular file (of ``owner``, when given) not opened through a symlink, at most
    ``limit`` bytes (``tail``: a longer file gives its last ``limit`` bytes), with its stat;
    None when it does not exist. ``sink``: given the content in chunks of 1 MiB as it is read
    (the bytes returned are then empty)."""
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
        return _read_capped(fd, limit, shown, sink), st
    finally:
        os.close(fd)


def read_run_files(path: str, uid: int | None = None,
                   events_sink: Callable[[bytes], None] | None = None) -> RunFiles:
    """Read the run directory's files in this process, with every check but the privilege drop.
    ``uid``: the user the directory and files must belong to (None: whoever owns the directory).
    ``events_sink``: given events.jsonl in chunks as it is read, never held whole (its entry in
    ``data`` is then empty)."""
    dfd, owner = _open_dir(path, uid)
    data: dict[str, bytes | None] = {}
    size, mtime = 0, 0.0
    try:
        for name, limit in LIMITS.items():
            got = _read_checked(f"{path}/{name}", name, limit, dir_fd=dfd, owner=owner,
                                sink=events_sink if name == runfiles.EVENTS else None)
            data[name] = None if got is None else got[0]
            if got is not None and name == runfiles.EVENTS:
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


def read_run_files_as(path: str, uid: int, gid: int, timeout: float,
                      events_sink: Callable[[bytes], None] | None = None) -> RunFiles:
    """:func:`read_run_files` for the user ``uid``: in a child dropped to ``uid``/``gid`` when
    this process is root and ``uid`` is not, SIGKILLed after ``timeout`` seconds (the
    ``events_sink``'s work included: the child waits on it)."""
    if os.geteuid() != 0 or uid == 0:
        return read_run_files(path, uid, events_sink)
    return _decode(_as_user(
        uid, gid, timeout, path, sum(LIMITS.values()) + 4096,
        lambda emit: _encode(read_run_files(path, uid, None if events_sink is None else emit)),
        events_sink))


_FRAME = struct.Struct("<cI")


def _as_user(uid: int, gid: int, timeout: float, path: str, cap: int,
             produce: Callable[[Callable[[bytes], None]], bytes],
             on_data: Callable[[bytes], None] | None = None) -> bytes:
    """``produce(emit)`` run in a forked child dropped to ``uid``/``gid``, SIGKILLed after
    ``timeout`` seconds; the bytes it returns, or its UnsafeFile raised here. Whatever it
    ``emit``s on the way goes to ``on_data`` as it arrives. All of it at most ``cap`` bytes.
    The child writes frames (a kind: D data, K the answer, E an UnsafeFile; a length; the bytes)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 0
        try:
            os.close(rfd)
            _drop_to(uid, gid)
            try:
                _write_frame(wfd, b"K", produce(lambda chunk: _write_frame(wfd, b"D", chunk)))
            except UnsafeFile as e:
                _write_frame(wfd, b"E", str(e).encode("utf-8", "replace")[:4000])
        except BaseException:
            code = 1
        os._exit(code)
    os.close(wfd)
    try:
        kind, blob = _collect(rfd, pid, time.monotonic() + timeout, path, cap, on_data)
    finally:
        os.close(rfd)
        _reap(pid)
    if kind == b"E":
        raise UnsafeFile(blob.decode("utf-8", "replace"))
    return blob


def _write_frame(fd: int, kind: bytes, payload: bytes) -> None:
    view = memoryview(_FRAME.pack(kind, len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


#: what an admin command reads of a run directory (`pswift status`, `pswift doctor`): names or
#: shell patterns, each with the most read of it (a log: its last that many bytes)
ADMIN_READS = {runfiles.PLAN: 4 << 20, runfiles.EVENTS: 256 << 20, runfiles.SLURM_LOGS: 4 << 20, runfiles.CANCEL: 4096,
               runfiles.JOB_ID: 64}


def read_for_command(path: str, names: tuple[str, ...], timeout: float = 30.0,
                     events_sink: Callable[[bytes], None] | None = None) -> dict[str, bytes]:
    """Files of the run directory ``path`` for a command that anyone may run, root included
    (``names``: keys of ADMIN_READS): the directory and each file opened without following a
    link and without blocking, regular files of the directory's owner only, each bounded (logs
    read from their end); as that owner, in a child SIGKILLed after ``timeout`` seconds, when
    this process is root and the owner is not. Absent files are left out; a refused file
    raises UnsafeFile saying why. ``events_sink``: given events.jsonl in chunks as it is read,
    never held whole (its entry is then empty)."""
    return read_owned(path, names, timeout, events_sink)[1]


def read_owned(path: str, names: tuple[str, ...], timeout: float = 30.0,
               events_sink: Callable[[bytes], None] | None = None) -> tuple[int, dict[str, bytes]]:
    """:func:`read_for_command`, with the UID owning the directory the files were read from: the
    directory is opened once for its owner, and reopened for the reads only as that owner's (a
    folder swapped in between is refused), so the owner is the files' own, never a second
    lookup's."""
    owner = dir_owner(path)
    if os.geteuid() != 0 or owner == 0:
        return owner, _read_named(path, names, owner, events_sink)
    import pwd
    try:
        gid = pwd.getpwuid(owner).pw_gid
    except KeyError:
        gid = os.stat(path, follow_symlinks=False).st_gid
    cap = sum(ADMIN_READS[n] for n in names) * 2 + 4096
    return owner, _unpack(_as_user(owner, gid, timeout, path, cap,
                                   lambda emit: _pack(_read_named(path, names, owner,
                                                                  None if events_sink is None else emit)),
                                   events_sink))


def dir_owner(path: str) -> int:
    """The UID owning the folder ``path``, from the folder opened once (no link followed)."""
    dfd, owner = _open_dir(path, None)
    os.close(dfd)
    return owner


def become_owner(path: str) -> int:
    """The UID owning the run directory ``path`` (opened without following a link); when this
    process is root and the owner is not, this process becomes the owner for good (a command
    that only reads the user's files, such as `pswift logs -f`, then reads nothing the owner
    could not)."""
    owner = dir_owner(path)
    if os.geteuid() == 0 and owner != 0:
        import pwd
        try:
            gid = pwd.getpwuid(owner).pw_gid
        except KeyError:
            gid = os.stat(path, follow_symlinks=False).st_gid
        _drop_to(owner, gid)
    return owner


def write_for_command(path: str, name: str, blob: bytes, timeout: float = 30.0) -> None:
    """Write ``name`` into the run directory ``path`` whole (a temporary file renamed over it),
    for a command anyone may run: the directory opened without following a link, the file
    created new beside it without following one, and, when this process is root and the
    directory's owner is not, by a child dropped to that owner (so root writes nothing the owner
    could not, through any link the owner planted). Raises UnsafeFile or OSError."""
    owner = dir_owner(path)
    if os.geteuid() != 0 or owner == 0:
        _write_named(path, name, blob, owner)
        return
    import pwd
    try:
        gid = pwd.getpwuid(owner).pw_gid
    except KeyError:
        gid = os.stat(path, follow_symlinks=False).st_gid
    _as_user(owner, gid, timeout, path, 4096, lambda emit: _write_named(path, name, blob, owner))


def _write_named(path: str, name: str, blob: bytes, owner: int) -> bytes:
    """Write ``name`` in ``path`` (of ``owner``) whole; returns b"" (the child's answer)."""
    dfd, _ = _open_dir(path, owner)
    tmp = f".{name}.{os.urandom(6).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        try:
            os.write(fd, blob)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError as e:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise UnsafeFile(f"{path}/{name} not written: {e.strerror or e}") from None
    finally:
        os.close(dfd)
    return b""


def _read_named(path: str, names: tuple[str, ...], owner: int,
                events_sink: Callable[[bytes], None] | None = None) -> dict[str, bytes]:
    dfd, _ = _open_dir(path, owner)
    out: dict[str, bytes] = {}
    try:
        present = sorted(os.listdir(dfd))
        for pattern in names:
            limit = ADMIN_READS[pattern]
            for name in (n for n in present if fnmatch.fnmatchcase(n, pattern)):
                got = _read_checked(f"{path}/{name}", name, limit, dir_fd=dfd, owner=owner,
                                    tail="*" in pattern, sink=events_sink if name == runfiles.EVENTS else None)
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


def _collect(rfd: int, pid: int, deadline: float, path: str, cap: int,
             on_data: Callable[[bytes], None] | None) -> tuple[bytes, bytes]:
    """The child's frames until its answer: data frames to ``on_data``; (kind, bytes) of the
    answer. A child that writes more than ``cap`` bytes, misses the deadline, writes a frame
    it may not or ends without an answer is killed and refused."""
    buf, total = bytearray(), 0

    def refuse(why: str) -> UnsafeFile:
        os.kill(pid, signal.SIGKILL)
        return UnsafeFile(why)

    while True:
        while len(buf) >= _FRAME.size:
            kind, n = _FRAME.unpack_from(buf)
            if kind not in (b"D", b"K", b"E") or (kind == b"D" and on_data is None):
                raise refuse(f"the reader of {path} sent a malformed answer")
            if len(buf) < _FRAME.size + n:
                break
            payload = bytes(buf[_FRAME.size:_FRAME.size + n])
            del buf[:_FRAME.size + n]
            if kind != b"D":
                return kind, payload
            on_data(payload)   # type: ignore[misc]
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([rfd], [], [], left)[0]:
            raise refuse(f"reading {path} took longer than the deadline; killed the reader")
        chunk = os.read(rfd, 1 << 20)
        if not chunk:
            raise UnsafeFile(f"the reader of {path} failed")
        total += len(chunk)
        if total > cap:
            raise refuse(f"the reader of {path} sent more than {cap} bytes")
        buf += chunk


def _reap(pid: int) -> None:
    """Collect the child; one still running after its answer (or its deadline) is killed."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:
        pass


# ----------------------------------------------------------------------------- what a command writes
def write_output(path: os.PathLike[str] | str, write: Callable[[BinaryIO], object]) -> None:
    """Every file a command writes for its user (a plot, metadata): into a new file beside
    ``path`` (created exclusively, so never a link's target), then renamed over ``path`` at
    once. A symlink at ``path`` is replaced, never followed; a reader sees the old file or the
    whole new one. Raises :class:`OutputRefused` (one line) for a folder or an unwritable place."""
    where = os.fspath(path)
    if os.path.isdir(where) and not os.path.islink(where):
        raise OutputRefused(f"cannot write {where}: it is a folder; name a file")
    folder = os.path.dirname(where) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(where)}.", dir=folder)
    except OSError as e:
        raise OutputRefused(f"cannot write {where}: {e.strerror or e}") from None
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, where)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputRefused(f"cannot write {where}: {e.strerror or e}") from None
        raise


def own_folder(path: os.PathLike[str] | str) -> int:
    """A descriptor of the folder at ``path`` (not a symlink) that the caller owns and only the
    caller may write to, opened once: files are then made relative to it (``dir_fd``), so nothing
    can be swapped in between. Raises :class:`OutputRefused`."""
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise OutputRefused(f"{where} is not a folder to write into: {e.strerror or e} "
                            f"(a symlink is not followed)") from None
    st = os.fstat(fd)
    why = (f"belongs to uid {st.st_uid}, not you" if st.st_uid != os.geteuid()
           else "others can write to it" if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) else None)
    if why:
        os.close(fd)
        raise OutputRefused(f"{where} {why}: give a folder of your own that only you can write to")
    return fd


def create_private(path: str | os.PathLike[str], blob: bytes) -> bool:
    """``blob`` as ``path``, whole (fsynced) or not at all, readable by this user only, never
    over a file that is there (nor through a link); False when one is: the job's records that
    are written once (a launch's rendezvous, a member's seat, an epoch's seal)."""
    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
