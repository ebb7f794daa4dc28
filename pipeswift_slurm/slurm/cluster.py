"""When would a job of N nodes start? A small backfill-style estimate from live cluster state.

Pure function of a :class:`ClusterState` (built by :func:`cluster_view` from the nodes and jobs
that :mod:`slurm` reads through either backend): every usable node of the partition is free now
(enough idle CPUs) or when the jobs running on it end. Like Slurm's backfill scheduler, pending
jobs ahead of ours are placed in priority order, each at the earliest time enough nodes are free
for as long as it will hold them (:class:`FreeNodes`, a count of free nodes over time); ours
then starts at the earliest time N nodes are free for its own hold: in a hole before the jobs
ahead when its time limit fits there, as backfill would start it.

A job holds its nodes for its time limit unless :func:`expected_ends` knows better: the user's
own pswift jobs (running or pending) for their prediction, other jobs for the share of their
limit that jobs of the same user (or partition) really used, from the history
(``RuntimeShares``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from pipeswift_slurm.durations import duration
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
    """How much of its time limit a job will use (elapsed / limit: the median of its user's
    ended jobs, by job id, else of its partition's, where the history has at least
    ``MIN_SHARES`` jobs); the predicted end (epoch s) of the user's own running pswift jobs, and
    the seconds the user's pending ones are predicted to hold their nodes."""
    by_job: dict[str, float]
    by_partition: dict[str, float]
    predicted_ends: dict[str, float]
    predicted_holds: dict[str, float] = {}


#: ended jobs a user's (or partition's) share of the limit is measured over, at least
MIN_SHARES = 5

class PendingJob(NamedTuple):
    job_id: str
    partition: str
    node_count: int
    time_limit_s: float
    user_id: int | None = None
    #: seconds it is expected to hold its nodes once started (None: its time limit)
    hold_s: float | None = None

    @property
    def expected_s(self) -> float:
        return self.time_limit_s if self.hold_s is None else self.hold_s


@dataclass
class ClusterState:
    now: float
    nodes: list[NodeState]
    running: list[RunningJob] = field(default_factory=list)
    pending: list[PendingJob] = field(default_factory=list)  # in priority order
    #: what the running jobs' end times are (expected_ends says so when it changed them)
    ends: str = "running jobs' time limits"
    #: the jobs ahead as placed, per (partition, CPUs per node, jobs known): every candidate of
    #: a plan asks the same state, and placing a busy site's queue is the costly part
    placed: dict[tuple[object, ...], "tuple[int, FreeNodes, int]"] = field(default_factory=dict, repr=False, compare=False)


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
                                      float(limit) * 60 if limit else math.inf, j.user_id))
    return ClusterState(now=now, nodes=list(nodes), running=running, pending=pending)


def expected_ends(state: ClusterState, shares: RuntimeShares) -> ClusterState:
    """``state`` with each job's time on its nodes as expected rather than its time limit: a
    pswift job of the user's for its prediction; another for its share of the limit (its user's,
    else its partition's). A running job already past that expected end runs to halfway between
    now and its limit; never longer than the limit."""
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
    pending = []
    for p in state.pending:
        hold = shares.predicted_holds.get(p.job_id)
        share = shares.by_job.get(p.job_id, shares.by_partition.get(p.partition))
        if hold is None and share is not None and math.isfinite(p.time_limit_s):
            hold = min(1.0, share) * p.time_limit_s
        pending.append(p if hold is None else p._replace(hold_s=min(hold, p.time_limit_s)))
    return ClusterState(now=state.now, nodes=state.nodes, running=out, pending=pending,
                        ends="jobs' expected ends: predictions, the history's share of their limits")


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


#: pending jobs ahead that the estimate places, at most (Slurm's backfill tests 500 by default)
MAX_AHEAD = 500


class FreeNodes:
    """How many of a partition's usable nodes are free over time: a step function, ``free[i]``
    on ``[times[i], times[i + 1])`` and the last for ever. Placing a job is O(breakpoints)."""

    def __init__(self, now: float, free_at: list[float]) -> None:
        self.times: list[float] = [now]
        self.free: list[int] = [sum(1 for t in free_at if t <= now)]
        for t in sorted(t for t in free_at if now < t < math.inf):
            if t != self.times[-1]:
                self.times.append(t)
                self.free.append(self.free[-1])
            self.free[-1] += 1

    def earliest(self, count: int, hold_s: float) -> float:
        """The earliest breakpoint from which ``count`` nodes stay free for ``hold_s`` (inf: for
        ever); inf when there is none. A sliding-window minimum over the segments."""
        window: deque[int] = deque()   # segment indices, their free counts increasing
        j = 0
        for i, t in enumerate(self.times):
            while j < len(self.times) and (j <= i or self.times[j] < t + hold_s):
                while window and self.free[window[-1]] >= self.free[j]:
                    window.pop()
                window.append(j)
                j += 1
            while window[0] < i:
                window.popleft()
            if self.free[window[0]] >= count:
                return t
        return math.inf

    def take(self, start: float, count: int, hold_s: float) -> None:
        """Hold ``count`` nodes from ``start`` for ``hold_s`` (inf: for ever)."""
        a = self._split(start)
        z = self._split(start + hold_s) if math.isfinite(hold_s) else len(self.times)
        for k in range(a, z):
            self.free[k] -= count

    def _split(self, t: float) -> int:
        """The index of the segment that starts at ``t`` (made so when inside one)."""
        k = bisect.bisect_right(self.times, t) - 1
        if self.times[k] != t:
            k += 1
            self.times.insert(k, t)
            self.free.insert(k, self.free[k - 1])
        return k


def estimate_wait(state: ClusterState, nodes: int, cpus_per_node: int,
                  partition: str | None, hold_s: float = math.inf) -> WaitEstimate:
    """When ``nodes`` nodes would start a job that holds them ``hold_s`` (its time limit: what
    backfill fits in a hole; inf: only after every job ahead has its nodes)."""
    usable = usable_nodes(state, partition, cpus_per_node)
    if len(usable) < nodes:
        return WaitEstimate(math.inf, 0, len(usable),
                            f"partition {partition or '(default)'} has only {len(usable)} usable "
                            f"node(s) with {cpus_per_node} CPUs")
    key = (partition, cpus_per_node, len(state.nodes), len(state.running), len(state.pending))
    if key not in state.placed:
        state.placed[key] = _jobs_ahead(state, usable, cpus_per_node, partition)
    free_now, profile, ahead = state.placed[key]
    start = profile.earliest(nodes, hold_s)
    wait = max(0.0, start - state.now)
    behind = (max(0.0, profile.earliest(nodes, math.inf) - state.now)
              if ahead and math.isfinite(hold_s) else wait)
    why = (f"{free_now} of {len(usable)} node(s) free now" +
           (f", {ahead} pending job(s) ahead" if ahead else "") +
           ("" if wait == 0 else f"; {nodes} free in {duration(wait)} ({state.ends})"
            if not math.isinf(wait) else f"; {nodes} never free (unlimited jobs hold them)") +
           (f"; backfill: its {duration(hold_s)} fits before the jobs ahead (after them: {duration(behind)})"
            if behind > wait else ""))
    return WaitEstimate(wait, free_now, len(usable), why)


def _jobs_ahead(state: ClusterState, usable: list[NodeState], cpus_per_node: int,
                partition: str | None) -> tuple[int, FreeNodes, int]:
    """(usable nodes free now, the free nodes over time once the pending jobs ahead are placed
    in priority order, how many were placed)."""
    busy_until: dict[str, float] = {}
    for j in state.running:
        for n in j.nodes:
            busy_until[n] = max(busy_until.get(n, state.now), j.end_time)
    free_at = [state.now if node.idle_cpus >= cpus_per_node else busy_until.get(node.name, math.inf)
               for node in usable]
    free_now = sum(1 for t in free_at if t <= state.now)
    profile, ahead = FreeNodes(state.now, free_at), 0
    for p in state.pending:
        if (partition is not None and p.partition != partition) or p.node_count > len(usable):
            continue
        start = profile.earliest(p.node_count, p.expected_s)
        if math.isinf(start):
            continue
        profile.take(start, p.node_count, p.expected_s)
        ahead += 1
        if ahead == MAX_AHEAD:
            break
    return free_now, profile, ahead
