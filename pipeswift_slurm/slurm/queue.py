"""When would a job of N nodes start? A small backfill-style estimate from live cluster state.

Pure function of a :class:`ClusterState` (built by :func:`cluster_view` from the nodes and jobs
that :mod:`slurm` reads through either backend): every usable node of the partition is free now (enough idle CPUs) or when the
jobs running on it end; pending jobs ahead of ours take the earliest-free nodes first, for
their own time limit; our job starts when N nodes are free.

A running job ends at its time limit unless :func:`expected_ends` knows better: the user's own
pswift jobs at their predicted end, other jobs after the share of their limit that jobs of the
same user (or partition) really used, from the history (``RuntimeShares``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from pipeswift_slurm.fmt import duration
from pipeswift_slurm.slurm.records import JobInfo, NodeState

UNUSABLE = ("down", "drain", "drained", "draining", "fail", "failing", "maint", "future",
            "not_responding", "unknown", "reboot", "power")


class RunningJob(NamedTuple):
    job_id: str
    nodes: tuple[str, ...]
    end_time: float  # epoch seconds (start + time limit); inf if unlimited
    start_time: float | None = None
    user_id: int | None = None
    partition: str = ""


class RuntimeShares(NamedTuple):
    """How much of its time limit a running job will use (elapsed / limit: the median of its
    user's ended jobs, by job id, else of its partition's, where the history has at least
    ``MIN_SHARES`` jobs); and the predicted end (epoch s) of the user's own pswift jobs."""
    by_job: dict[str, float]
    by_partition: dict[str, float]
    predicted_ends: dict[str, float]


#: ended jobs a user's (or partition's) share of the limit is measured over, at least
MIN_SHARES = 5

class PendingJob(NamedTuple):
    job_id: str
    partition: str
    node_count: int
    time_limit_s: float


@dataclass
class ClusterState:
    now: float
    nodes: list[NodeState]
    running: list[RunningJob] = field(default_factory=list)
    pending: list[PendingJob] = field(default_factory=list)  # in priority order
    #: what the running jobs' end times are (expected_ends says so when it changed them)
    ends: str = "running jobs' time limits"


def cluster_view(nodes: list[NodeState], jobs: list[JobInfo], now: float) -> ClusterState:
    """The planner's view: every node, running jobs with their nodes and end times, pending jobs
    in priority order (highest first; ties by job id, i.e. submission order)."""
    running, pending = [], []
    for j in sorted(jobs, key=lambda j: (-j.priority, int(j.job_id) if j.job_id.isdigit() else 0)):
        if j.state == "RUNNING":
            running.append(RunningJob(j.job_id, j.node_names,
                                      float(j.end_time) if j.end_time else math.inf,
                                      float(j.start_time) if j.start_time else None,
                                      j.user_id, j.partition))
        elif j.state == "PENDING":
            limit = j.time_limit_min
            pending.append(PendingJob(j.job_id, j.partition, j.node_count or 1,
                                      float(limit) * 60 if limit else math.inf))
    return ClusterState(now=now, nodes=list(nodes), running=running, pending=pending)


def expected_ends(state: ClusterState, shares: RuntimeShares) -> ClusterState:
    """``state`` with each running job's end as expected rather than its time limit: a pswift
    job of the user's at its predicted end; another at start + its share of the limit (its
    user's, else its partition's). A job already past that expected end runs to halfway between now and
    its limit; never later than the limit."""
    out = []
    for j in state.running:
        end = j.end_time
        if j.job_id in shares.predicted_ends:
            end = min(end, shares.predicted_ends[j.job_id])
        elif j.start_time is not None and math.isfinite(end):
            share = shares.by_job.get(j.job_id, shares.by_partition.get(j.partition))
            if share is not None:
                end = j.start_time + min(1.0, share) * (end - j.start_time)
        if end < state.now:
            end = (state.now + j.end_time) / 2 if math.isfinite(j.end_time) else state.now
        out.append(j._replace(end_time=end))
    return ClusterState(now=state.now, nodes=state.nodes, running=out, pending=state.pending,
                        ends="running jobs' expected ends: predictions, the history's share of their limits")


class WaitEstimate(NamedTuple):
    seconds: float
    free_now: int
    usable: int
    why: str


def partition_problem(state: ClusterState, partition: str | None, min_nodes: int) -> str | None:
    """Why the job can never run in ``partition`` (no such partition, or fewer nodes in it, in
    any state, than the fewest the job asks for), with the fix; None when it can."""
    if partition is None:
        return None
    names = sorted({p for n in state.nodes for p in n.partitions})
    total = sum(1 for n in state.nodes if partition in n.partitions)
    if total == 0:
        return (f"[job] partition = {partition!r}: Slurm has no such partition with nodes (here: "
                f"{', '.join(names) or 'none'}); set [job] partition to one of them")
    if total < min_nodes:
        return (f"[resources] nodes asks for at least {min_nodes} node(s), but partition {partition!r} has "
                f"{total}; ask for {total} or fewer, or choose a larger partition")
    return None


def exclusions(old: list[str], exclude: str, usable: set[str], needed: int) -> list[str]:
    """A requeued job's ExcNodeList after leaving ``exclude`` out too: its earlier exclusions,
    oldest dropped first, so that ``needed`` usable nodes remain (each crash adding a node, a
    job left itself too few and waited forever); ``exclude`` itself only when that leaves
    enough. The list may shrink, to nothing."""
    keep = [x for x in old if x != exclude]
    def left(xs: list[str]) -> int:
        return len(usable - set(xs))
    while keep and left([*keep, exclude]) < needed:
        keep.pop(0)
    if left([*keep, exclude]) >= needed:
        return [*keep, exclude]
    while keep and left(keep) < needed:
        keep.pop(0)
    return keep


def usable_nodes(state: ClusterState, partition: str | None, cpus_per_node: int) -> list[NodeState]:
    """Nodes of the partition that are up and big enough."""
    return [n for n in state.nodes
            if (partition is None or partition in n.partitions)
            and not any(u in n.state.lower() for u in UNUSABLE) and n.cpus >= cpus_per_node]


def estimate_wait(state: ClusterState, nodes: int, cpus_per_node: int,
                  partition: str | None) -> WaitEstimate:
    usable = usable_nodes(state, partition, cpus_per_node)
    if len(usable) < nodes:
        return WaitEstimate(math.inf, 0, len(usable),
                            f"partition {partition or '(default)'} has only {len(usable)} usable "
                            f"node(s) with {cpus_per_node} CPUs")
    busy_until: dict[str, float] = {}
    for j in state.running:
        for n in j.nodes:
            busy_until[n] = max(busy_until.get(n, state.now), j.end_time)
    free_at: dict[str, float] = {}
    for node in usable:
        free_at[node.name] = state.now if node.idle_cpus >= cpus_per_node else busy_until.get(node.name, math.inf)
    free_now = sum(1 for t in free_at.values() if t <= state.now)
    ahead = 0
    for p in state.pending:
        if partition is not None and p.partition != partition:
            continue
        if p.node_count > len(free_at):
            continue
        order = sorted(free_at, key=free_at.__getitem__)[: p.node_count]
        start = max(free_at[n] for n in order)
        if math.isinf(start):
            continue
        for n in order:
            free_at[n] = start + p.time_limit_s
        ahead += 1
    times = sorted(free_at.values())
    start = times[nodes - 1]
    wait = max(0.0, start - state.now)
    why = (f"{free_now} of {len(usable)} node(s) free now" +
           (f", {ahead} pending job(s) ahead" if ahead else "") +
           ("" if wait == 0 else f"; {nodes} free in {duration(wait)} ({state.ends})"
            if not math.isinf(wait) else f"; {nodes} never free (unlimited jobs hold them)"))
    return WaitEstimate(wait, free_now, len(usable), why)
