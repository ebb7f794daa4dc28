"""The one module that talks to Slurm.

Queries (nodes, jobs, a job's preemption) go through one of two backends with one interface:
``pyslurm`` (Slurm's C API in-process, ~2 ms) where it is importable and built for the running
Slurm's major.minor, else Slurm's commands (``scontrol``/``sinfo``/``squeue --json``, ~13 ms).
``PSWIFT_SLURM_BACKEND=cli|pyslurm`` forces one; a pyslurm that does not match the Slurm here is
a one-line warning and the commands, never a crash. Submitting, requeueing, cancelling and
accounting always use the commands. Every command goes through :func:`_run`: bounded in time,
any failure a :class:`SlurmError` with the command, its exit code and Slurm's own words on one
line. What Slurm prints is parsed in :mod:`.records`, for every supported version.
"""

from __future__ import annotations

# Imports inside functions: the backends, threads and the cluster view load only for the query
# that needs them (a submission asks in the background while it loads)

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Sequence, cast

if TYPE_CHECKING:
    from pipeswift_slurm.slurm.cluster import ClusterState

from pipeswift_slurm.slurm import outage, records
from pipeswift_slurm.errors import SlurmAbsent, SlurmError, SlurmUnreachable
from pipeswift_slurm.slurm.records import JobInfo, NodeState

TERMINAL_STATES = records.TERMINAL_STATES
QUERY_TIMEOUT = 30.0


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def brief(e: Exception, limit: int = 120) -> str:
    """A Slurm failure in a few words, for a warning that goes on without Slurm: Slurm's own
    conclusion (its last ``fatal:`` or ``error:``) rather than every line it printed."""
    text = str(e)
    for mark in ("fatal: ", "error: "):
        if mark in text:
            text = text.rsplit(mark, 1)[1]
            break
    return _one_line(text, limit)


def _run(cmd: Sequence[str], timeout: float = 60.0, check: bool = True,
         survive_term: bool = False, env: dict[str, str] | None = None,
         retry: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command; on failure raise SlurmError with command, exit code, stdout, stderr.
    While slurmctld does not answer, the command is tried again (:mod:`.outage`), then
    SlurmUnreachable; not with ``retry=False`` (a submission whose answer was lost may have
    been taken: it is not sent twice).
    ``survive_term``: the command ignores SIGTERM (a job's own requeue sends it to every process
    of the job, the commands that follow the requeue included)."""
    if not retry:
        return _run_once(cmd, timeout, check, survive_term, env)
    return outage.outlast(f"`{shlex.join(cmd)}`", _run_once, cmd, timeout, check, survive_term, env)


def _run_once(cmd: Sequence[str], timeout: float, check: bool, survive_term: bool,
              env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    exe = cmd[0]
    if shutil.which(exe) is None:
        raise SlurmAbsent(f"{exe}: command not found (install slurm-client, or run scripts/slurm-dev-cluster start)")
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        # Slurm's clients (`--version` too) retry for a minute or wait for a configless server
        raise SlurmAbsent(f"`{shlex.join(cmd)}` not run: SLURM_CONF={conf} is not a file; "
                         f"point it at the cluster's slurm.conf or unset it")
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL, preexec_fn=_ignore_term if survive_term else None)
    except subprocess.TimeoutExpired:
        hint = ("SLURM_CONF is not set, and Slurm may be looking for a configless server: "
                "export SLURM_CONF=/path/to/slurm.conf" if not os.environ.get("SLURM_CONF")
                else "is slurmctld running (scontrol ping)?")
        raise SlurmUnreachable(f"`{shlex.join(cmd)}` did not answer within {timeout:.0f} s; {hint}") from None
    if proc.returncode != 0 and outage.unreachable(proc.stderr + proc.stdout):
        raise SlurmUnreachable(f"`{shlex.join(cmd)}`: {_one_line(proc.stderr or proc.stdout)}")
    if check and proc.returncode != 0:
        said = _one_line(proc.stderr or proc.stdout or "no output")
        kind = SlurmAbsent if _NO_CONFIGURATION.search(proc.stderr or "") else SlurmError
        raise kind(f"`{shlex.join(cmd)}` failed (exit {proc.returncode}): {said}")
    return proc


#: what Slurm's clients say when they find no configuration (no file, and no configless server)
_NO_CONFIGURATION = re.compile(r"Could not establish a configuration source")


def _ignore_term() -> None:
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def submit(script: str, extra_args: Sequence[str] = (), cwd: str | None = None) -> str:
    """``sbatch --parsable [extra_args] script``; returns the job id."""
    cmd = ["sbatch", "--parsable", *extra_args, script]
    if cwd is not None:
        cmd[1:1] = [f"--chdir={cwd}"]
    out = _run(cmd, retry=False).stdout.strip()
    job_id = out.split(";")[0].strip()
    if not job_id.isdigit():
        raise SlurmError(f"`{shlex.join(cmd)}` printed {out!r}, not a job id")
    return job_id


# ----------------------------------------------------------------------------- version, backend
_cache: dict[str, Any] = {}


def slurm_version() -> tuple[int, int, int]:
    """(major, minor, micro) of the Slurm whose commands are on PATH (``scontrol --version``),
    asked once per process."""
    if "version" not in _cache:
        out = _run(["scontrol", "--version"], timeout=QUERY_TIMEOUT).stdout
        m = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
        if m is None:
            raise SlurmError(f"cannot read a version from `scontrol --version`: {_one_line(out)!r}")
        _cache["version"] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return cast("tuple[int, int, int]", _cache["version"])


class Backend(Protocol):
    """What a query backend answers (CliBackend, slurm_pyslurm.PyslurmBackend)."""
    name: str

    def nodes(self) -> list[NodeState]: ...
    def jobs(self, job_id: str | None = None) -> list[JobInfo]: ...
    def active_jobs(self) -> list[JobInfo]: ...


def _json(cmd: list[str], job_id: str | None) -> dict[str, Any]:
    """A query's JSON answer, once. Slurm 22.05's squeue/sinfo answer a controller that does not
    answer with exit 0 and a JSON "errors" list (slurm_load_jobs: "Unspecified error") and no
    data: that is SlurmUnreachable (retried by the caller), not an empty queue."""
    proc = _run(cmd, timeout=QUERY_TIMEOUT, check=False, retry=False)
    if proc.returncode != 0:
        if job_id is not None and "Invalid job id" in (proc.stderr + proc.stdout):
            return {"jobs": []}
        raise SlurmError(f"`{shlex.join(cmd)}` failed (exit {proc.returncode}): "
                         f"{_one_line(proc.stderr or proc.stdout or 'no output')}")
    doc = records.load(proc.stdout, shlex.join(cmd[:2]))
    failed = records.failed_loads(doc)
    if failed:
        raise SlurmUnreachable(f"`{shlex.join(cmd)}`: {failed}")
    return doc


class CliBackend:
    """Queries through Slurm's commands and their JSON (``--json`` needs Slurm 21.08+)."""

    name = "cli"

    def nodes(self) -> list[NodeState]:
        if slurm_version()[:2] >= (23, 2):   # sinfo --json answers node groups from 23.02 on
            cmd = ["scontrol", "show", "nodes", "--json"]
        else:
            cmd = ["sinfo", "--json"]
        return records.nodes(outage.outlast(shlex.join(cmd), _json, cmd, None))

    def jobs(self, job_id: str | None = None) -> list[JobInfo]:
        cmd = ["squeue", "--json"]
        if job_id is not None:
            cmd += ["--states=all", "--jobs", str(job_id)]
        return records.jobs(outage.outlast(shlex.join(cmd), _json, cmd, job_id))

    def active_jobs(self) -> list[JobInfo]:
        """Pending and running jobs only (see :func:`records.squeue_active`)."""
        cmd = ["squeue", "--noheader", "--states=PENDING,RUNNING", f"--format={records.ACTIVE_FORMAT}"]
        env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}   # whatever the user prefers
        return records.squeue_active(_run(cmd, timeout=QUERY_TIMEOUT, env=env).stdout)


def backend() -> Backend:
    """The query backend for this process (chosen once): see the module's docstring."""
    if "backend" not in _cache:
        from pipeswift_slurm.slurm import pyslurm_backend as slurm_pyslurm

        want = os.environ.get("PSWIFT_SLURM_BACKEND", "auto").strip().lower() or "auto"
        if want not in ("auto", "cli", "pyslurm"):
            raise SlurmError(f"PSWIFT_SLURM_BACKEND={want!r}: use cli, pyslurm or leave it unset")
        chosen: Backend = CliBackend()
        if want != "cli":
            problem = slurm_pyslurm.unusable(slurm_version())
            if problem is None:
                chosen = slurm_pyslurm.PyslurmBackend()
            elif want == "pyslurm" or problem[1]:
                # forced, or installed but not for this Slurm: say so, once; not installed: quiet
                print(f"pswift: warning: {problem[0]}; using Slurm's commands instead", file=sys.stderr)
        _cache["backend"] = chosen
    return cast(Backend, _cache["backend"])


# ----------------------------------------------------------------------------- queries
#: where a configless Slurm's slurmd or sackd keeps the configuration it fetched (22.05 and 25.11)
CONFIGLESS_CACHE = "/run/slurm/conf/slurm.conf"


class ConfigSource(NamedTuple):
    """Where this machine's Slurm clients read their configuration, as Slurm looks: ``kind``
    "SLURM_CONF", "default" (the path built into the clients), "configless" (a slurmd's or
    sackd's cache) or "dns" (none here: the clients ask DNS for the controller's SRV record);
    ``path`` the file (None for dns)."""
    kind: str
    path: str | None


def config_source() -> ConfigSource:
    """$SLURM_CONF, then the clients' built-in default (``/etc/slurm/slurm.conf`` for a
    system install, ``PREFIX/etc/slurm.conf`` for one under a prefix), then the configless
    cache; else DNS. Reads files only: nothing here waits on a network."""
    env = os.environ.get("SLURM_CONF")
    if env:
        return ConfigSource("SLURM_CONF", env)
    exe = shutil.which("scontrol")
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(exe))) if exe else "/usr"
    default = "/etc/slurm/slurm.conf" if prefix in ("/usr", "/") else os.path.join(prefix, "etc", "slurm.conf")
    if os.path.isfile(default):
        return ConfigSource("default", default)
    if os.path.isfile(CONFIGLESS_CACHE):
        return ConfigSource("configless", CONFIGLESS_CACHE)
    return ConfigSource("dns", None)


def ping() -> str | None:
    """None when a controller answers ``scontrol ping`` (found however Slurm finds it: its
    file, the configless cache or DNS), else Slurm's words; bounded, not retried."""
    try:
        proc = _run(["scontrol", "ping"], timeout=15.0, check=False, retry=False)
    except SlurmError as e:
        return str(e)
    if proc.returncode == 0 and "UP" in proc.stdout:
        return None
    return _one_line(proc.stderr or proc.stdout or "no answer")


def controller_conf() -> str | None:
    """The slurm.conf the controller reads (``scontrol show config``'s SLURM_CONF, which a
    configless client learns from the controller too); None when Slurm cannot be asked."""
    try:
        return config().get("SLURM_CONF") or None
    except SlurmError:
        return None


def config() -> dict[str, str]:
    """``scontrol show config`` as a dict (ClusterName, SLURM_VERSION, AccountingStorageType...)."""
    if "config" not in _cache:
        out = _run(["scontrol", "show", "config"], timeout=QUERY_TIMEOUT).stdout
        _cache["config"] = {k.strip(): v.strip() for k, sep, v in
                            (line.partition("=") for line in out.splitlines()) if sep}
    return cast("dict[str, str]", _cache["config"])


def cluster_name() -> str:
    return config().get("ClusterName", "")


def partition_node_count(partition: str) -> int | None:
    """How many nodes ``partition`` has now (``scontrol show partition``'s TotalNodes); None
    when Slurm cannot be asked or does not know it."""
    try:
        out = _run(["scontrol", "show", "partition", partition], timeout=QUERY_TIMEOUT).stdout
    except SlurmError:
        return None
    m = re.search(r"\bTotalNodes=(\d+)", out)
    return int(m.group(1)) if m else None


def _partitions() -> list[dict[str, str]]:
    """Every partition's fields as ``scontrol -o show partition`` gives them, one dict each (an
    answer up to PARTITIONS_MAX_AGE_S old is reused: :func:`prefetch` asks it ahead of a submission)."""
    import threading
    asking = _cache.get("asking partitions")
    if asking is not None and asking is not threading.current_thread():
        asking.join(QUERY_TIMEOUT)   # the prefetch's query, under way: its answer, not a second one
    asked = _cache.get("partitions")
    if asked is not None and time.monotonic() - asked[0] < PARTITIONS_MAX_AGE_S:
        return cast("list[dict[str, str]]", asked[1])
    out = _run(["scontrol", "-o", "show", "partition"], timeout=QUERY_TIMEOUT).stdout
    fields = (dict(x.split("=", 1) for x in line.split() if "=" in x) for line in out.splitlines())
    got = [f for f in fields if "PartitionName" in f]
    _cache["partitions"] = (time.monotonic(), got)
    return got


#: how long an answer of `scontrol show partition` stands for the partitions (a submission's)
PARTITIONS_MAX_AGE_S = 10.0


def default_partition() -> str | None:
    """The partition a job goes to when it names none (slurm.conf's Default=YES); None when
    there is none or Slurm cannot be asked."""
    try:
        return next((f["PartitionName"] for f in _partitions() if f.get("Default") == "YES"), None)
    except SlurmError:
        return None


class Preemption(NamedTuple):
    """How a partition treats a preempted job: its PreemptMode ("OFF": never preempted) and the
    GraceTime between the SIGTERM and the kill."""
    partition: str
    default: bool
    mode: str
    grace_s: int


def partitions_preemption() -> list[Preemption]:
    """Every partition's preemption (``scontrol show partition -o``; a partition without its
    own PreemptMode has the cluster's; PreemptType=preempt/none preempts nothing)."""
    partitions = _partitions()
    cfg = config()
    none = cfg.get("PreemptType", "preempt/none").endswith("/none")
    got = []
    for f in partitions:
        mode = "OFF" if none else f.get("PreemptMode") or cfg.get("PreemptMode", "OFF")
        grace = re.match(r"\d+", f.get("GraceTime", "0"))
        got.append(Preemption(f["PartitionName"], f.get("Default") == "YES", mode.upper(),
                              int(grace.group()) if grace else 0))
    return got


def job_info(job_id: str) -> JobInfo | None:
    """The job as squeue sees it (including recently finished jobs), or None once purged."""
    for j in backend().jobs(str(job_id)):
        if j.job_id == str(job_id):
            return j
    return None


def active_jobs() -> list[JobInfo]:
    """Every pending and running job, as squeue sees them (one query)."""
    return backend().active_jobs()


def held_jobs(users: Sequence[str] = ()) -> list[records.HeldJob]:
    """The jobs Slurm holds of ``users`` (everyone's with none) and their working directories."""
    import secrets
    end = secrets.token_hex(8)
    cmd = ["squeue", "--noheader", f"--format={records.workdir_format(end)}",
           *([f"--users={','.join(users)}"] if users else [])]
    return records.squeue_work_dirs(_run(cmd, timeout=QUERY_TIMEOUT).stdout, end)


def being_preempted(job_id: str, attempt: int | None = None) -> bool:
    """True while Slurm is preempting the job (PreemptTime is set; a plain scancel leaves it
    unset), or once Slurm has already requeued it past ``attempt`` (its restart count): a requeue
    clears PreemptTime, and one can come first when the grace time ran out during an outage."""
    job = job_info(job_id)
    if job is None:
        return False
    return job.preempt_time is not None or (attempt is not None and job.restarts > attempt)


def cluster_state(now: float | None = None) -> "ClusterState":
    """Every node and the running/pending jobs, as the planner sees them, on any Slurm version
    (the answer of :func:`prefetch` when one is pending)."""

    from pipeswift_slurm.slurm.cluster import cluster_view

    pending = _cache.pop("prefetch", None)
    if pending is not None and pending.fresh():
        nodes, jobs = pending.result()
    else:
        b = backend()
        nodes, jobs = b.nodes(), b.active_jobs()
    return cluster_view(nodes, jobs, now if now is not None else time.time())


class _Prefetch:
    """The cluster query running in a background thread (the CLI backend's two commands in two
    threads; pyslurm's calls one after the other); ``result()`` waits and re-raises errors."""

    MAX_AGE_S = 10.0   # an answer older than this is not used (a fresh query is made)

    def __init__(self) -> None:
        import threading
        self.finished: float | None = None
        self.got: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._fetch, daemon=True, name="pswift-prefetch")
        self.thread.start()
        # the submission's warnings read the partitions (GraceTime); planning never waits for it
        _cache["asking partitions"] = threading.Thread(target=_partitions_quietly, daemon=True,
                                                       name="pswift-prefetch-partitions")
        _cache["asking partitions"].start()

    def _ask(self, what: str, b: Any) -> None:
        try:
            self.got[what] = b.nodes() if what == "nodes" else b.active_jobs()
        except Exception as e:  # handed to whoever waits for the answer
            self.got[what] = e

    def _fetch(self) -> None:
        import threading
        try:
            b = backend()
        except Exception as e:
            self.got["nodes"] = self.got["jobs"] = e
            self.finished = time.monotonic()
            return
        jobs = threading.Thread(target=self._ask, args=("jobs", b), daemon=True) if b.name == "cli" else None
        if jobs is not None:
            jobs.start()
        self._ask("nodes", b)
        if jobs is None:
            self._ask("jobs", b)
        else:
            jobs.join()
        self.finished = time.monotonic()
        try:
            automatic_requeue_limit()   # cached for the submission (scontrol show config)
        except Exception:
            pass                        # asked again, and reported, where it is needed

    def fresh(self) -> bool:
        """Still asking, or answered within MAX_AGE_S."""
        return self.finished is None or time.monotonic() - self.finished < self.MAX_AGE_S

    def result(self) -> tuple[list[NodeState], list[JobInfo]]:
        self.thread.join()
        for v in self.got.values():
            if isinstance(v, Exception):
                raise v
        return self.got["nodes"], self.got["jobs"]


def _partitions_quietly() -> None:
    try:
        partitions_preemption()   # the partitions and the configuration, cached
    except Exception:
        pass   # asked again, and reported, where it is needed


def prefetch() -> None:
    """Start asking Slurm now, in background threads, what planning and submitting will ask
    (the nodes, the queue, the requeue limit, the partitions), so that the queries overlap with
    loading the config and the planner; the next :func:`cluster_state` call takes the answer. Only where
    Slurm's configuration is there to read (:func:`config_source`: its file, the default or
    the configless cache; a client with none may wait on DNS: that is left to the query that
    needs it, with its timeout and its hint)."""
    conf = config_source().path
    if "prefetch" not in _cache and conf is not None and os.path.isfile(conf):
        _cache["prefetch"] = _Prefetch()

#: every state an attempt ends in (requeued attempts too). With explicit states, sacct's -S/-E
#: select attempts that *ended* in the window; without them, 22.05 selects by eligible time and
#: misses jobs started at submission (slurmdbd records their eligible time as 0).
ENDED_STATES = "BF,CA,CD,DL,F,NF,OOM,PR,RQ,TO"


def sacct_jobs(since: float | None = None, cluster: str | None = None) -> list[dict[str, Any]] | None:
    """Every job attempt slurmdbd knows that ended at or after ``since`` (epoch seconds; None:
    all), requeued attempts included (``--duplicates``), of ``cluster`` (sacct's ``-M``; None:
    this one), as history records; None where there is no slurmdbd (sacct then refuses or prints
    no JSON)."""
    import datetime as _dt

    if shutil.which("sacct") is None:
        return None
    # not 1970-01-01: sacct reads a start at the epoch as "unset" and then selects nothing
    start = "1971-01-01T00:00:00" if since is None else \
        _dt.datetime.fromtimestamp(max(86400.0 * 366, since)).strftime("%Y-%m-%dT%H:%M:%S")
    proc = _run(["sacct", "--json", "--allusers", "--duplicates", f"--state={ENDED_STATES}",
                 f"--starttime={start}", "--endtime=now", *([f"--clusters={cluster}"] if cluster else [])],
                timeout=120.0, check=False)
    if proc.returncode != 0 or not proc.stdout.lstrip().startswith("{"):
        return None
    return records.sacct_records(records.load(proc.stdout, "sacct --json"))


def accounting_problem() -> str | None:
    """None when slurmdbd answers sacct, else Slurm's words."""
    proc = _run(["sacct", "-n", "-X", "--starttime=now", "--endtime=now"], timeout=QUERY_TIMEOUT,
                check=False)
    return None if proc.returncode == 0 else _one_line(proc.stderr or proc.stdout or "no output")


def test_only_start(nodes: int, cpus_per_node: int, partition: str | None, time_limit: str | None,
                    now: float | None = None) -> float | None:
    """Slurm's own estimate (``sbatch --test-only``) of when a job of this shape would start,
    as epoch seconds; None when Slurm says it cannot. It consumes a job id per call."""
    import datetime as _dt
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write("#!/bin/bash\ntrue\n")
        script = f.name
    try:
        cmd = ["sbatch", "--test-only", f"--nodes={nodes}", f"--mincpus={cpus_per_node}"]
        if partition:
            cmd.append(f"--partition={partition}")
        if time_limit:
            cmd.append(f"--time={time_limit}")
        proc = _run([*cmd, script], check=False)
    finally:
        os.unlink(script)
    m = re.search(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", proc.stderr + proc.stdout)
    if proc.returncode != 0 or m is None:
        return None
    return _dt.datetime.fromisoformat(m.group(1)).timestamp()


def requeues_preempted_jobs() -> bool:
    """Whether Slurm itself requeues a preempted job (PreemptMode=REQUEUE) whose tasks end within
    GraceTime. From 24.05 it does ("For PreemptMode=CANCEL and PreemptMode=REQUEUE assume that
    job signalled for GraceTime was preempted", CHANGELOG 24.05.0rc1): a job that requeued itself
    as well is requeued twice and runs one attempt too many. Before, such a job ends COMPLETED or
    FAILED unless it requeues itself. Checked on 22.05.8 and 25.11.7 by tests/test_preemption.py."""
    return slurm_version()[:2] >= (24, 5)


def requeues_as_submitted(partition: str | None) -> bool:
    """Whether Slurm itself requeues a job preempted in ``partition`` (None: the default one),
    with the node request it was submitted with: PreemptMode REQUEUE there, from 24.05."""
    if not requeues_preempted_jobs():
        return False
    modes = partitions_preemption()
    got = next((p for p in modes if (p.partition == partition if partition else p.default)), None)
    return got is not None and "REQUEUE" in got.mode


def automatic_requeue_limit() -> int | None:
    """How many times Slurm requeues a job by itself before holding it (REQUEUE_HOLD, "launch
    failure limit exceeded"): MaxBatchRequeue (default 5) counts every automatic requeue, so
    from 24.05, where preemptions are requeued by Slurm, a job preempted that often is held.
    None before 24.05 (pswift's own `scontrol requeue` is not counted)."""
    if not requeues_preempted_jobs():
        return None
    try:
        return int(config().get("MaxBatchRequeue", "5"))
    except ValueError:
        return 5


def forbid_requeue(job_id: str) -> None:
    """Keep Slurm from requeueing the job when it ends (a preempted job then ends PREEMPTED)."""
    _run(["scontrol", "update", f"JobId={job_id}", "Requeue=0"])


def requeue(job_id: str, exclude: str | None = None, nodes_needed: int = 1) -> bool:
    """Requeue the job; with ``exclude``, keep its next attempt off that node when the partition
    still has ``nodes_needed`` other usable nodes (returns whether it did). A running job's
    ExcNodeList cannot change, so it is set just after the requeue, while the job is pending;
    the requeue's SIGTERM to the job's processes (these commands included) is ignored."""
    from pipeswift_slurm.slurm.cluster import exclusions, usable_nodes

    old: list[str] = []
    new_exc = None
    if exclude:
        job = job_info(job_id)
        usable = {n.name for n in usable_nodes(cluster_state(), (job.partition if job else "") or None, 1)}
        old = list(records.expand_hostlist(job.excluded)) if job is not None else []
        new_exc = exclusions(old, exclude, usable, nodes_needed)
    # the requeue SIGTERMs every process of the job, this command too: it must outlive that
    try:
        _run(["scontrol", "requeue", str(job_id)], survive_term=True)
    except SlurmError as e:
        if "Job is pending execution" not in str(e):
            raise
        return False   # Slurm requeued it first (a preemption whose grace ran out): queued again, as asked
    if new_exc is not None and new_exc != old:
        _run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(new_exc)}"], survive_term=True)
    return new_exc is not None and exclude in new_exc


def shrink_job(job_id: str, nodelist: str) -> None:
    """Give the running job's nodes outside ``nodelist`` back (``scontrol update JobId=
    NodeList=``, which a user may do to their own job): a node that died before Slurm knew then
    no longer holds the job in COMPLETING at its end. Raises SlurmError with Slurm's word."""
    _run(["scontrol", "update", f"JobId={job_id}", f"NodeList={nodelist}"], timeout=QUERY_TIMEOUT)


def set_node_range(job_id: str, node_range: str) -> None:
    """A pending job's node request (``min-max``): only while pending (a requeued job is, even
    while its old attempt is still completing). Slurm then starts it on the range's minimum,
    not as many as are free (measured on 22.05), so a caller asks for ``n-n``. Raises
    PswiftError with Slurm's word."""
    _run(["scontrol", "update", f"JobId={job_id}", f"NumNodes={node_range}"], survive_term=True)


def set_time_limit(job_id: str, limit_s: int, time_min_s: int | None = None) -> None:
    """A requeued (pending) job's time limit, and its --time-min, in whole minutes: a pending
    job's owner may raise it up to the partition's MaxTime (a running job's only lower it).
    Raises PswiftError with Slurm's word."""
    from pipeswift_slurm.slurm.timespec import slurm_minutes
    extra = [f"TimeMin={slurm_minutes(time_min_s)}"] if time_min_s else []
    _run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={slurm_minutes(limit_s)}", *extra],
         survive_term=True)


def sacct_state(job_id: str) -> tuple[str, int] | None:
    """(state of the newest attempt, requeues before it) as slurmdbd recorded them, for a job
    the controller has forgotten (MinJobAge); None where there is no slurmdbd or no record."""
    if shutil.which("sacct") is None:
        return None
    proc = _run(["sacct", "-j", str(job_id), "-X", "--duplicates", "-n", "-P", "-o", "State"],
                timeout=QUERY_TIMEOUT, check=False)
    states = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []
    return (states[-1], len(states) - 1) if states else None


def cancel(job_id: str, signal: str | None = None) -> None:
    """scancel the job; with ``signal`` (a name or number), only send it to the job's steps."""
    _run(["scancel", *([f"--signal={signal}"] if signal else []), str(job_id)])


def cancel_pending(array_job_id: str) -> None:
    """scancel the array's tasks that are still queued (a run of members that trained every
    step: a member requeued meanwhile has nothing left to do); its running tasks end themselves."""
    _run(["scancel", "--state=PENDING", str(array_job_id)], timeout=QUERY_TIMEOUT)


def set_array_throttle(array_job_id: str, at_once: int) -> None:
    """How many of the job array's tasks may run at once (``scontrol update ArrayTaskThrottle``,
    the ``%K`` of --array, which the array's owner may change while tasks are queued). Raises
    PswiftError with Slurm's word."""
    _run(["scontrol", "update", f"JobId={array_job_id}", f"ArrayTaskThrottle={int(at_once)}"],
         timeout=QUERY_TIMEOUT)


def array_tasks(array_job_id: str) -> list[JobInfo]:
    """Every task of the job array as squeue sees them (recently ended ones included): through
    squeue whatever the backend, as pyslurm's Job.load gives the one task holding the array's id."""
    return CliBackend().jobs(str(array_job_id))
