"""`pswift admin install-plugins`: the Slurm-side plugins that ship in the wheel
(``pipeswift_plugins``: jobcomp_pswift.py and job_submit.lua), put where slurmctld looks for them.

- ``pswift_job_submit.lua`` (the rules, a Lua module a site's own job_submit.lua can require)
  and ``job_submit.lua`` (for a site without one: it calls the module) go next to slurm.conf
  (Slurm reads job_submit.lua from there, ``JobSubmitPlugins=lua``);
- ``pswift-jobcomp``, a two-line wrapper slurmctld runs for every job attempt
  (``JobCompType=jobcomp/script``), execs this interpreter on the installed jobcomp_pswift.py with
  the spool folder and the history database. slurmctld runs it as root: the interpreter, the
  package and every folder above them must be root's and writable by no one else, or nothing is
  installed;
- the spool folder is created (0750) when it does not exist.

A file pswift installed before (same first two lines: an older version, another spool or
database) is replaced. Any other file that differs (a site's own job_submit.lua) is never
replaced silently: the install stops, naming it and the diff to look at; ``force`` replaces it, keeping the old one as
``NAME.pswift-backup-YYYYmmddTHHMMSS``. Each file is written whole to a temporary name in the
folder and renamed over the old one (a link there is replaced, never followed). slurm.conf is
not edited: the lines to add are returned, for the admin to review.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from pipeswift_slurm.errors import UsageError

WRAPPER = "pswift-jobcomp"
LUA = "job_submit.lua"
LUA_MODULE = "pswift_job_submit.lua"
JOBCOMP = "jobcomp_pswift.py"


class Installed(NamedTuple):
    files: list[Path]
    conf_lines: list[str]
    backups: list[Path]


def plugin_dir() -> Path:
    """Where the installed package keeps the plugins (a checkout's plugins/ when editable)."""
    return Path(str(resources.files("pipeswift_plugins")))


def default_prefix() -> Path:
    """The folder of the slurm.conf the controller reads: $SLURM_CONF's, else the one Slurm
    says (``scontrol show config``: a configless site's login node learns it from the
    controller), else /etc/slurm."""
    from pipeswift_slurm.slurm import client
    conf = os.environ.get("SLURM_CONF") or client.controller_conf()
    return Path(conf).parent if conf else Path("/etc/slurm")


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.parent / f".{path.name}.{os.urandom(3).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def root_safe(path: Path) -> str | None:
    """Why a file root will run is not safe to run, or None: the path as given (its links too)
    and the file it resolves to, with every folder above each, must be root's and writable by
    no one else (a sticky world-writable folder such as /tmp passes: nobody can rename what is
    not theirs in it)."""
    given = Path(os.path.abspath(path))
    for p in dict.fromkeys([given, *given.parents, *(lambda r: [r, *r.parents])(given.resolve())]):
        try:
            st = p.lstat()
        except OSError as e:
            return f"{p}: {e.strerror}"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0:
                return f"{p} is a link of uid {st.st_uid}, not root's"
            continue
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_uid != 0:
            return f"{p} belongs to uid {st.st_uid}, not root"
        if st.st_mode & 0o022 and not sticky:
            return f"{p} is writable by {'other users' if st.st_mode & 0o002 else 'its group'} (mode {st.st_mode & 0o7777:o})"
    return None


def _head(text: str) -> list[str]:
    """The first two lines: each file pswift installs names itself there."""
    return text.split("\n", 2)[:2]


def _planned(prefix: Path, files: dict[str, tuple[str, int]], force: bool) -> list[str]:
    """The backups ``force`` will make; raises UsageError for a file that differs without it."""
    backups = []
    for name, (text, _) in files.items():
        path = prefix / name
        try:
            old = path.read_text() if not path.is_symlink() else None
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UsageError(f"{path}: {e.strerror}") from None
        if old == text or (old is not None and _head(old) == _head(text)):
            continue                            # the same, or pswift's own from an earlier install
        if not force:
            raise UsageError(f"{path} exists and differs from pswift's (a site's own?): nothing installed; "
                             f"compare with `diff {path} {plugin_dir() / name}`, call pswift's rules from your own "
                             f"job_submit.lua (docs/admin.md), or pass --force to replace it (the old one is kept)")
        backups.append(name)
    return backups


def install(prefix: Path, spool: Path, db: Path, python: str | None = None, force: bool = False) -> Installed:
    """Write pswift_job_submit.lua, job_submit.lua and the jobcomp wrapper into ``prefix`` and
    create the spool folder; the slurm.conf lines (see the module for what is refused)."""
    import time
    python = python or sys.executable
    if not prefix.is_dir() or prefix.is_symlink():
        raise UsageError(f"--prefix {prefix} is not a folder (a link is not followed); pass the folder "
                         f"of slurm.conf")
    for name, p in (("--spool", spool), ("--db", db)):
        if not p.is_absolute():
            raise UsageError(f"{name} {p}: give an absolute path (slurmctld runs the plugin from its own folder)")
    src = plugin_dir()
    try:
        files = {LUA_MODULE: ((src / LUA_MODULE).read_text(), 0o644), LUA: ((src / LUA).read_text(), 0o644)}
        (src / JOBCOMP).stat()
    except OSError as e:
        raise UsageError(f"the plugins are not in this installation ({src}: {e.strerror}); "
                         f"reinstall pipeswift-slurm") from None
    for what, path in (("the interpreter", Path(python)), ("the jobcomp plugin", src / JOBCOMP)):
        why = root_safe(path)
        if why is not None:
            raise UsageError(f"slurmctld would run {what} ({path}) as root, but {why}: install pipeswift-slurm "
                             f"in a root-owned environment (e.g. python3 -m venv /opt/pswift) and run this from it")
    files[WRAPPER] = ((f"#!/bin/sh\n# written by `pswift admin install-plugins`: slurmctld runs this once per job attempt\n"
                       f"exec {shlex.quote(python)} {shlex.quote(str(src / JOBCOMP))} "
                       f"--spool {shlex.quote(str(spool))} --db {shlex.quote(str(db))}\n"), 0o755)
    backups = _planned(prefix, files, force)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    try:
        for name in backups:
            os.replace(prefix / name, prefix / f"{name}.pswift-backup-{stamp}")
        for name, (text, mode) in files.items():
            _write(prefix / name, text, mode)
        if not spool.exists():
            spool.mkdir(mode=0o750, parents=True)
            spool.chmod(0o750)
    except OSError as e:
        raise UsageError(f"cannot write into {prefix} or create {spool}: {e.strerror}; run as the owner of "
                         f"slurm.conf's folder") from None
    return Installed([prefix / name for name in files], ["JobSubmitPlugins=lua", "JobCompType=jobcomp/script",
                     f"JobCompLoc={prefix / WRAPPER}"], [prefix / f"{n}.pswift-backup-{stamp}" for n in backups])
