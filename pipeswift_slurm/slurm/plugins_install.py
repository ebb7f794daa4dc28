"""`pswift admin install-plugins`: the Slurm-side plugins that ship in the wheel
(``pipeswift_plugins``: jobcomp_pswift.py and job_submit.lua), put where slurmctld looks for them.

- ``job_submit.lua`` goes next to slurm.conf (Slurm reads it from there, ``JobSubmitPlugins=lua``);
- ``pswift-jobcomp``, a two-line wrapper slurmctld runs for every job attempt
  (``JobCompType=jobcomp/script``), execs this interpreter on the installed jobcomp_pswift.py with
  the spool folder and the history database.

Each file is written whole to a temporary name in the folder and renamed over the old one (a
link there is replaced, never followed); nothing else is touched. slurm.conf is not edited: the
lines to add are returned, for the admin to review.
"""

from __future__ import annotations

import os
import shlex
import sys
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from pipeswift_slurm.errors import UsageError

WRAPPER = "pswift-jobcomp"
LUA = "job_submit.lua"
JOBCOMP = "jobcomp_pswift.py"


class Installed(NamedTuple):
    files: list[Path]
    conf_lines: list[str]


def plugin_dir() -> Path:
    """Where the installed package keeps the plugins (a checkout's plugins/ when editable)."""
    return Path(str(resources.files("pipeswift_plugins")))


def default_prefix() -> Path:
    """The folder of the slurm.conf in use ($SLURM_CONF, else /etc/slurm)."""
    conf = os.environ.get("SLURM_CONF")
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


def install(prefix: Path, spool: Path, db: Path, python: str | None = None) -> Installed:
    """Write job_submit.lua and the jobcomp wrapper into ``prefix``; the slurm.conf lines."""
    python = python or sys.executable
    if not prefix.is_dir() or prefix.is_symlink():
        raise UsageError(f"--prefix {prefix} is not a folder (a link is not followed); pass the folder "
                         f"of slurm.conf")
    for name, p in (("--spool", spool), ("--db", db)):
        if not p.is_absolute():
            raise UsageError(f"{name} {p}: give an absolute path (slurmctld runs the plugin from its own folder)")
    src = plugin_dir()
    try:
        lua = (src / LUA).read_text()
        (src / JOBCOMP).stat()
    except OSError as e:
        raise UsageError(f"the plugins are not in this installation ({src}: {e.strerror}); "
                         f"reinstall pipeswift-slurm") from None
    wrapper = (f"#!/bin/sh\n# written by `pswift admin install-plugins`: slurmctld runs this once per job attempt\n"
               f"exec {shlex.quote(python)} {shlex.quote(str(src / JOBCOMP))} "
               f"--spool {shlex.quote(str(spool))} --db {shlex.quote(str(db))}\n")
    try:
        _write(prefix / LUA, lua, 0o644)
        _write(prefix / WRAPPER, wrapper, 0o755)
    except OSError as e:
        raise UsageError(f"cannot write into {prefix}: {e.strerror}; run as the owner of slurm.conf's folder") from None
    return Installed([prefix / LUA, prefix / WRAPPER],
                     ["JobSubmitPlugins=lua", "JobCompType=jobcomp/script", f"JobCompLoc={prefix / WRAPPER}"])
