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

A file is pswift's by its content: the install keeps the sha256 of each file it wrote in
``.pswift-installed.json`` beside them, so a file whose hash is the one recorded (an older
version, another spool or database) is replaced. A file that names itself pswift's (its first
two lines) but whose content changed since (a site added its own rules to it), or one from an
install before the record, is backed up first, then replaced. Any other file that differs (a
site's own job_submit.lua) is never replaced silently: the install stops, naming it and the
diff to look at; ``force`` replaces it. Every backup is ``NAME.pswift-backup-YYYYmmddTHHMMSS``.

What slurmctld will run as root is checked whole: the interpreter, and every file and folder
it imports from (its ``sys.path`` under ``-I``, and the package's own files), must be root's
and writable by no one else; the wrapper runs the interpreter with ``-I`` (no environment
variable, user site or current folder changes what it imports). Each file is written whole to a temporary name in the
folder and renamed over the old one (a link there is replaced, never followed). slurm.conf is
not edited: the lines to add are returned, for the admin to review.
"""

from __future__ import annotations

# Imports inside functions: the package's plugin files, only for install-plugins

import hashlib
import json
import os
import shlex
import stat
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from pipeswift_slurm.errors import UsageError

WRAPPER = "pswift-jobcomp"
LUA = "job_submit.lua"
LUA_MODULE = "pswift_job_submit.lua"
JOBCOMP = "jobcomp_pswift.py"
#: beside the installed files: the sha256 of each, as this install wrote it
MANIFEST = ".pswift-installed.json"
#: the most files and folders :func:`tree_unsafe` looks at under one import root
TREE_MAX = 300_000


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


def tree_unsafe(top: Path) -> str | None:
    """Why a folder root will import from is not safe, or None: every file and folder under it
    (links not followed, but each must be root's) must be root's and writable by no one else."""
    seen = 0
    for folder, dirs, names in os.walk(top, followlinks=False):
        for name in (*dirs, *names):
            seen += 1
            if seen > TREE_MAX:
                return f"{top} holds more than {TREE_MAX} files: install pswift in an environment of its own"
            p = os.path.join(folder, name)
            try:
                st = os.lstat(p)
            except OSError as e:
                return f"{p}: {e.strerror}"
            if st.st_uid != 0:
                return f"{p} belongs to uid {st.st_uid}, not root"
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                return f"{p} is writable by {'other users' if st.st_mode & 0o002 else 'its group'} (mode {st.st_mode & 0o7777:o})"
    return None


def import_roots(python: str) -> list[Path]:
    """The folders ``python -I`` imports from, and those of pswift's own package and plugins."""
    import pipeswift_slurm
    try:
        out = subprocess.run([python, "-I", "-c", "import sys, json; print(json.dumps(sys.path))"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        paths = [Path(p) for p in json.loads(out) if p]
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise UsageError(f"cannot ask {python} where it imports from: {e}") from None
    own = [Path(pipeswift_slurm.__file__).parent, plugin_dir(), plugin_dir().parent]   # the plugin's sys.path[0]
    return [p for p in dict.fromkeys([*paths, *own]) if p.is_dir()]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _recorded(prefix: Path) -> dict[str, str]:
    """The hashes the last install recorded (none where there is no record, or a bad one)."""
    try:
        fd = os.open(prefix / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            got = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(got, dict) else {}


def _head(text: str) -> list[str]:
    """The first two lines: each file pswift installs names itself there."""
    return text.split("\n", 2)[:2]


def _planned(prefix: Path, files: dict[str, tuple[str, int]], force: bool) -> list[str]:
    """The backups the install will make; raises UsageError for a file that is not pswift's
    and differs, without ``force``."""
    recorded = _recorded(prefix)
    backups = []
    for name, (text, _) in files.items():
        path = prefix / name
        try:
            old = path.read_text() if not path.is_symlink() else None
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UsageError(f"{path}: {e.strerror}") from None
        if old == text or (old is not None and recorded.get(name) == _sha(old)):
            continue                            # the same, or as an earlier install wrote it
        if old is not None and _head(old) == _head(text):
            backups.append(name)                # pswift's, changed since (or from before the record)
            continue
        if not force:
            raise UsageError(f"{path} exists and differs from pswift's (a site's own?): nothing installed; "
                             f"compare with `diff {path} {plugin_dir() / name}`, call pswift's rules from your own "
                             f"job_submit.lua (docs/admin.md), or pass --force to replace it (the old one is kept)")
        backups.append(name)
    return backups


def install(prefix: Path, spool: Path, db: Path, python: str | None = None, force: bool = False) -> Installed:
    """Write pswift_job_submit.lua, job_submit.lua and the jobcomp wrapper into ``prefix`` and
    create the spool folder; the slurm.conf lines (see the module for what is refused)."""
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
    for top in import_roots(python):
        why = root_safe(top) or tree_unsafe(top)
        if why is not None:
            raise UsageError(f"slurmctld would run {python} as root, importing from {top}, but {why}: install "
                             f"pipeswift-slurm in a root-owned environment (e.g. python3 -m venv /opt/pswift) and "
                             f"run this from it")
    files[WRAPPER] = ((f"#!/bin/sh\n# written by `pswift admin install-plugins`: slurmctld runs this once per job attempt\n"
                       f"exec {shlex.quote(python)} -I {shlex.quote(str(src / JOBCOMP))} "
                       f"--spool {shlex.quote(str(spool))} --db {shlex.quote(str(db))}\n"), 0o755)
    backups = _planned(prefix, files, force)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    try:
        for name in backups:
            os.replace(prefix / name, prefix / f"{name}.pswift-backup-{stamp}")
        for name, (text, mode) in files.items():
            _write(prefix / name, text, mode)
        _write(prefix / MANIFEST, json.dumps({n: _sha(t) for n, (t, _) in files.items()}, indent=1) + "\n", 0o644)
        if not spool.exists():
            spool.mkdir(mode=0o750, parents=True)
            spool.chmod(0o750)
    except OSError as e:
        raise UsageError(f"cannot write into {prefix} or create {spool}: {e.strerror}; run as the owner of "
                         f"slurm.conf's folder") from None
    return Installed([prefix / name for name in files], ["JobSubmitPlugins=lua", "JobCompType=jobcomp/script",
                     f"JobCompLoc={prefix / WRAPPER}"], [prefix / f"{n}.pswift-backup-{stamp}" for n in backups])
