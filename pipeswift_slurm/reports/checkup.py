"""`pswift doctor` without a job: is this machine set up to plan, submit and record jobs?

Each check says what it found and, where something is wrong, the fix. Nothing here raises:
a check that cannot run is itself a finding.
"""

from __future__ import annotations

# Imports inside functions: the history store, preflight and the Slurm client, each only for the
# check that needs it

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeswift_slurm.slurm import client as slurm
from pipeswift_slurm.errors import PswiftError

#: Slurm's own words -> what to do about them
KNOWN_FIXES = (
    ("Could not establish a configuration source", "set SLURM_CONF to the cluster's slurm.conf, or run sackd "
     "(configless: it fetches it), or publish the controller's DNS SRV record"),
    ("configless", "set SLURM_CONF to the cluster's slurm.conf, or run sackd (configless)"),
    ("Unable to contact slurm controller", "start slurmctld, or point SLURM_CONF at a running cluster"),
    ("Connection refused", "start slurmctld, or point SLURM_CONF at a running cluster"),
    ("command not found", "install Slurm's client tools (Debian: slurm-client) or put them on PATH"),
    ("Protocol authentication error", "start munged on munge's default socket (sacct and sacctmgr use no other)"),
)


@dataclass(frozen=True)
class Finding:
    what: str
    value: str
    fix: str | None = None     # None: fine

    @property
    def ok(self) -> bool:
        return self.fix is None


def _fix_for(message: str) -> str:
    for words, fix in KNOWN_FIXES:
        if words.lower() in message.lower():
            return fix
    return "see the message; `scontrol ping` and `sinfo` should answer"


def _slurm_conf() -> Finding:
    """Where this machine's clients read Slurm's configuration, found as Slurm finds it."""
    src = slurm.config_source()
    if src.kind == "SLURM_CONF" and not Path(src.path or "").is_file():
        return Finding("Slurm configuration", f"$SLURM_CONF = {src.path} (no such file)",
                       "point SLURM_CONF at an existing slurm.conf, or unset it (Slurm then looks itself)")
    where = {"SLURM_CONF": f"{src.path} ($SLURM_CONF)", "default": f"{src.path} (the clients' default)",
             "configless": f"{src.path} (configless: the copy a slurmd or sackd fetched)",
             "dns": "no file here: configless, the controller to be found through DNS (its SRV record)"}[src.kind]
    return Finding("Slurm configuration", where)


#: a preempted job needs at least this long to finish its step and checkpoint (a small model)
MIN_GRACE_S = 10


def _preemption() -> list[Finding]:
    """Each preemptible partition's GraceTime: the time a preempted job has to checkpoint."""
    try:
        parts = [p for p in slurm.partitions_preemption() if not p.mode.startswith("OFF")]
    except PswiftError as e:
        return [Finding("preemption", str(e), _fix_for(str(e)))]
    return [Finding(f"preemption on {p.partition}", f"{p.mode}, GraceTime {p.grace_s} s",
                    None if p.grace_s >= MIN_GRACE_S else
                    f"GraceTime {p.grace_s} s leaves a preempted job no time to checkpoint: set "
                    f"GraceTime >= {MIN_GRACE_S} (more for big models: `pswift plan` says how much)")
            for p in parts]


def _slurm() -> list[Finding]:
    try:
        version = ".".join(map(str, slurm.slurm_version()))
        cfg = slurm.config()
    except PswiftError as e:
        return [Finding("Slurm", str(e), _fix_for(str(e)))]
    out = [Finding("Slurm", f"{version}, cluster {cfg.get('ClusterName', '?')}, "
                            f"controller {cfg.get('SlurmctldHost[0]', cfg.get('SlurmctldHost', '?'))}")]
    from pipeswift_slurm.slurm import pyslurm_backend as slurm_pyslurm
    try:
        name = slurm.backend().name
    except PswiftError as e:
        return [*out, Finding("query backend", str(e), "unset PSWIFT_SLURM_BACKEND or set cli|pyslurm")]
    why = slurm_pyslurm.unusable(slurm.slurm_version())
    out.append(Finding("query backend", name + (f" ({why[0]})" if why else ""),
                       "install pyslurm built against this Slurm (README: Install)" if why and why[1] else None))
    acct = cfg.get("AccountingStorageType", "?")
    if "slurmdbd" in acct:
        problem = slurm.accounting_problem()
        out.append(Finding("accounting", "slurmdbd" + (f", but sacct failed: {problem}" if problem else ""),
                           _fix_for(problem) if problem else None))
    else:
        out.append(Finding("accounting", "off (no slurmdbd): `pswift history ingest --sacct` has "
                                         "nothing to read; the jobcomp plugin still records every job"))
    return out


def _history(db: Path | None) -> Finding:
    from pipeswift_slurm.history.store import History, default_path
    path = db or default_path()
    if not path.exists():
        return Finding("history DB", f"{path} (not created yet; the first ingest or submit creates it)")
    try:
        h = History(path, create=False, read_only=True)
        try:
            n = h.db["slurm_jobs"].count, h.db["jobs"].count
        finally:
            h.close()
    except PswiftError as e:
        return Finding("history DB", str(e), "move the file aside and run `pswift history ingest`")
    return Finding("history DB", f"{path}: {n[0]} Slurm attempt(s), {n[1]} pswift job(s)")


def _job_python() -> Finding:
    """Whether this interpreter (a job's default [job] python) can run a pswift job's ranks."""
    from pipeswift_slurm.preflight import FIX, missing
    try:
        gone = missing(sys.executable)
    except OSError as e:
        return Finding("job Python", f"{sys.executable}: cannot run it ({e})", "set [job] python in the TOML")
    if gone:
        return Finding("job Python", f"{sys.executable} cannot import {', '.join(gone)}", FIX)
    return Finding("job Python", f"{sys.executable} (torch, deepspeed and the launcher found)")


def environment(db: Path | None = None) -> list[Finding]:
    """Each check of this machine's set-up. Slurm is asked (``scontrol ping``, bounded) before
    anything is judged of its configuration: a configless site has no file to judge."""
    conf = _slurm_conf()
    if not conf.ok:
        probes = [Finding("Slurm", "not asked (its configuration file is missing)")]
    else:
        down = slurm.ping()
        if down is not None:
            probes = [Finding("Slurm", f"no controller answered `scontrol ping`: {slurm.brief(Exception(down), 200)}",
                              _fix_for(down))]
            if slurm.config_source().kind == "dns":   # one check says one thing: the lookup failed
                conf = Finding(conf.what, "no file here, and configless Slurm found no controller through DNS "
                                          "(its SRV record)", _fix_for(down))
        else:
            probes = _slurm()
            if probes and probes[0].ok:
                probes += _preemption()
    return [conf, *probes, _job_python(), _history(db)]
