"""The pyslurm query backend: Slurm's C API in-process (pyslurm 25.11: ``Nodes``, ``Jobs``).

Used by :mod:`slurm` only, through the same three queries as its command-line backend, returning
the same types (:class:`~pipeswift_slurm.slurm.records.NodeState`, ``JobInfo``). pyslurm is built
for one Slurm major.minor (its version's first two numbers); :func:`unusable` checks that against
the Slurm here *before* importing it (the import loads that Slurm's library), from the
package's ``version.py``, without importlib.metadata's cost.
"""

from __future__ import annotations

# Imports inside functions: pyslurm, only where it is importable and built for the running Slurm

import importlib.util
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from pipeswift_slurm.errors import SlurmError, SlurmUnreachable
from pipeswift_slurm.slurm import outage
from pipeswift_slurm.slurm.records import JobInfo, NodeState, epoch, expand_hostlist


def installed_version() -> str | None:
    """pyslurm's version string where it is installed, else None (nothing imported)."""
    spec = importlib.util.find_spec("pyslurm")
    if spec is None or not spec.origin:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return "unknown"
    m = re.search(r"__version__\s*=\s*[\"']([^\"']+)", text)
    return m.group(1) if m else "unknown"


def unusable(slurm_version: tuple[int, int, int]) -> tuple[str, bool] | None:
    """None if pyslurm can serve this Slurm; else (why, installed?)."""
    have = installed_version()
    if have is None:
        return "pyslurm is not installed", False
    major_minor = tuple(int(x) if x.isdigit() else -1 for x in have.split(".")[:2])
    if major_minor != tuple(slurm_version[:2]):
        want = f"{slurm_version[0]}.{slurm_version[1]:02d}"
        return (f"pyslurm {have} does not match the Slurm {want}.{slurm_version[2]} here (install "
                f"pyslurm {want}.x built against it)"), True
    try:
        import pyslurm  # noqa: F401
    except Exception as e:  # a broken build: an ImportError, or a missing libslurm symbol
        return f"pyslurm {have} cannot be imported ({type(e).__name__}: {e})", True
    return None


#: how long a controller that answered `scontrol ping` is trusted with in-process calls
TRUSTED_FOR_S = 30.0
#: when slurmctld last answered the probe (time.monotonic()); None: not since start or a failure
_answered_at: float | None = None


def _probe() -> None:
    """Raise SlurmUnreachable unless slurmctld answers `scontrol ping` (once per TRUSTED_FOR_S).

    libslurm's loads retry a controller that refuses them for Slurm's MessageTimeout and more
    (about 20 s on 25.11 with its default 10 s), inside pyslurm, holding the interpreter: no
    thread or retry budget can cut that short, so pyslurm is asked only while slurmctld has
    just answered. The probe is a process, killed at the outage budget (at least 1 s), and
    answers at once when slurmctld is down."""
    global _answered_at
    now = time.monotonic()
    if _answered_at is not None and now - _answered_at < TRUSTED_FOR_S:
        return
    limit = max(1.0, outage.budget_s())
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=limit)
        up = ping.returncode == 0
    except subprocess.TimeoutExpired:
        up = False
    except OSError as e:
        raise SlurmError(f"scontrol ping could not run: {e}") from None
    if not up:
        raise SlurmUnreachable(f"Unable to contact slurm controller (`scontrol ping`: slurmctld did not "
                               f"answer within {limit:.0f} s)")
    _answered_at = time.monotonic()


def _call(what: str, fn: Any, *a: Any) -> Any:
    """``fn(*a)`` once slurmctld answered the probe, outlasting an outage of slurmctld
    (:mod:`.outage`); any other error one line."""
    def once() -> Any:
        global _answered_at
        _probe()
        try:
            return fn(*a)
        except Exception as e:  # pyslurm.RPCError and friends: one line, the library's error type
            if outage.unreachable(str(e)):
                _answered_at = None
                raise SlurmUnreachable(f"pyslurm {what} failed: {e}") from None
            raise SlurmError(f"pyslurm {what} failed: {e}") from None
    return outage.outlast(f"pyslurm {what}", once)


class PyslurmBackend:
    name = "pyslurm"

    def __init__(self) -> None:
        import pyslurm

        self._ps = pyslurm

    def nodes(self) -> list[NodeState]:
        nodes = _call("Nodes.load()", self._ps.Nodes.load)
        return [NodeState(name=str(n.name), state=str(n.state or "unknown").lower(),
                          cpus=int(n.total_cpus or 0), idle_cpus=int(n.idle_cpus or 0),
                          partitions=tuple(n.partitions or ()))
                for n in sorted(nodes.values(), key=lambda n: str(n.name))]

    def jobs(self, job_id: str | None = None) -> list[JobInfo]:
        if job_id is None:
            jobs = list(_call("Jobs.load()", self._ps.Jobs.load).values())
        elif not job_id.isdigit():
            return []              # not a job id: as squeue's "Invalid job id"
        else:
            try:
                jobs = [_call(f"Job.load({job_id})", self._ps.Job.load, int(job_id))]
            except SlurmUnreachable:
                raise              # slurmctld did not answer: not "no such job"
            except SlurmError:
                return []          # purged: as squeue's "Invalid job id"
        return [self._job(j) for j in jobs]

    def active_jobs(self) -> list[JobInfo]:
        """Pending and running jobs (one load, filtered here: pyslurm answers in-process)."""
        return [j for j in self.jobs() if j.state in ("PENDING", "RUNNING")]

    @staticmethod
    def _job(j: Any) -> JobInfo:
        state = str(j.state or "UNKNOWN").upper()
        nodes = str(j.allocated_nodes or "") if state != "PENDING" else ""
        return JobInfo(job_id=str(j.id), name=str(j.name or ""), state=state,
                       reason=str(j.state_reason or "None"), partition=str(j.partition or ""),
                       nodes=nodes, node_names=expand_hostlist(nodes),
                       node_count=int(j.num_nodes or 0), restarts=int(j.requeue_count or 0),
                       submit_time=epoch(j.submit_time), start_time=epoch(j.start_time),
                       end_time=epoch(j.end_time), time_limit_min=j.time_limit,
                       priority=int(j.priority or 0), qos=str(j.qos or ""),
                       excluded=str(getattr(j, "excluded_nodes", None) or ""),
                       preempt_time=epoch(getattr(j, "preempt_time", None)),
                       user_id=getattr(j, "user_id", None))
