"""What follows an attempt's end, decided in one place (:func:`what_follows`): pure rules, no
torch, no Slurm call, no file. Two kinds of end, each with its facts gathered before and the
decision carried out after:

- the ranks stopped together at a step boundary (:class:`Stopped`: done, a signal, the time
  limit, a growth, a re-layout, or a hang in a job launched by hand): rank 0 of
  pipeswift_launch.train gathers the facts (Slurm's word on a preemption) and carries it out
  (requeue, the next attempt's node count and time limit);
- a launch of the ranks ended under srun (:class:`Launched`): the batch script's helper,
  pipeswift_launch.afterlaunch, gathers the facts (the ranks' records, srun's report, the
  allocation) and carries it out (restart, shrink, requeue, fail).

The requeue budget is :func:`requeues_left`, the restart budget :func:`restart_left`; no other
module counts either. The rule for a launch, as docs/design.md states it:

- a launch that ended by itself (done, re-laid out, or its own decision: a refusal, a spent
  budget, a requeue it asked for) is followed as it asked;
- a *fault* (a rank killed by a signal, a lost node or task, a broken collective, a timeout,
  an out-of-memory kill, a rank the watchdog found hung) is retried: the ranks start again in
  the same allocation from the newest committed checkpoint, up to ``[job] max_restarts`` times
  an attempt; after that the job is requeued (its node left out when one is to blame), within
  ``[job] max_requeues``; a second hang on the same node requeues at once, without that node;
- a *lost node* (the job is submitted with ``--no-kill``, so Slurm drops a failed node from the
  allocation instead of ending it) is a fault too: the ranks start again on the nodes left,
  with plan.json's layout for that many nodes (fewer stages); with no layout for them, the job
  is requeued without the lost node;
- a node that died *before Slurm knows* (for SlurmdTimeout, Slurm still calls it up) is found by
  its silence: every rank on it began and none ended or was reported by srun, SILENT_GRACE_S
  after the launch's first failure (:func:`silent_nodes`; pipeswift_launch.launchwatch stops
  srun, which would wait for it), or srun could not launch on it. The ranks start again at once
  on the nodes that answer (a step that excludes it); the ranks srun killed because of it are
  not faults of their nodes, and a requeue leaves out the silent node, never a healthy one;
- a *bug* (an exception of the model's or data's code) is tried once more; the same error at
  the same step in a second launch fails the job at once, no restart or requeue spent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipeswift_slurm.codes import Action, Exit, Stop
from pipeswift_slurm.config import MAX_RESTARTS_DEFAULT
from pipeswift_slurm.plan import predicted_steps
from pipeswift_slurm.slurm import srun
from pipeswift_slurm.slurm.cluster import ClusterState, usable_nodes

__all__ = ["MAX_RELAYOUTS", "MAX_RESTARTS_DEFAULT", "Allocation", "Budgets", "Death", "Decision", "Launched",
           "Stopped", "backoff", "first_death", "may_grow", "may_train", "requeues_left", "restart_left",
           "silent_nodes", "srun_deaths", "what_follows", "RequeueFacts", "requeue_may_resize", "requeue_nodes", "requeue_target",
           "free_nodes"]
#: re-layouts an attempt may make in place (pipeswift_launch.relayout proposes them)
MAX_RELAYOUTS = 2
#: seconds to wait before restart k (1-based): none before the first (as TorchElastic: a crash
#: once is the common case and every second of it is lost), then 1, 2, 4, ... at most BACKOFF_MAX_S
BACKOFF_MAX_S = 30.0
#: seconds after a launch's first failure that a node's ranks may stay silent before the node
#: counts as lost (a healthy rank whose peer died raises within a second or two)
SILENT_GRACE_S = 15.0

#: exception text of a failed machine or network rather than the model's code (lower case)
_FAULT_TEXT = re.compile(
    r"connection (?:reset|closed|refused|aborted)|broken pipe|timed? ?out|no route to host|"
    r"\bgloo\b|\bnccl\b|socket|distbackenderror|distnetworkerror|diststoreerror|rendezvous|"
    r"outofmemoryerror|out of memory|cuda error|ecc error|bus error|input/output error|"
    r"stale file handle|killed by signal|peer")


@dataclass(frozen=True)
class Death:
    """How one rank ended, as its launcher recorded it (an exception) or srun saw it (a signal,
    an exit code, a lost node)."""
    how: str                   # "exception", "signal 9", "exit 1", "lost", "hung" (the watchdog's)
    rank: int | None = None
    node: str | None = None
    step: int | None = None    # the step it was running (an exception), else None
    error: str | None = None   # "ValueError: the message", one line

    @property
    def is_fault(self) -> bool:
        """The machine's or the network's doing (retried), not the code's."""
        if self.how != "exception":
            return True
        return bool(_FAULT_TEXT.search((self.error or "").lower()))

    @property
    def signature(self) -> str:
        """What makes two failures the same: the error and the step it happened at; for a hang,
        the node it happened on."""
        return f"hung on {self.node}" if self.how == "hung" else f"{self.error} @ step {self.step}"

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        where = f" on {self.node}" if self.node else ""
        what = {"exception": f"raised {self.error}", "lost": "was lost", "hung": f"hung ({self.error})"}.get(
            self.how, f"was killed by {self.how}" if self.how.startswith("signal") else f"ended with {self.how}")
        at = f" at step {self.step}" if self.step is not None else ""
        return f"{who}{where} {what}{at}"


@dataclass(frozen=True)
class Budgets:
    """What this attempt has spent and may spend."""
    restarts: int              # restarts already made in this attempt
    max_restarts: int
    relayouts: int             # re-layouts already made in this attempt
    attempt: int               # Slurm's restart count (0: the first attempt)
    max_requeues: int
    in_slurm: bool = True      # a Slurm job (pswift run: no requeue)
    max_relayouts: int = MAX_RELAYOUTS


@dataclass(frozen=True)
class Allocation:
    """The job's nodes: how many the launch ran on, and what Slurm holds now. A job submitted
    with ``--no-kill`` keeps its allocation when a node fails; Slurm drops the node from it."""
    launched: int                          # nodes the ended launch ran on
    now: int                               # nodes the allocation holds now
    lost: tuple[str, ...] = ()             # the nodes it no longer holds
    stages: dict[int, int] = field(default_factory=dict)   # plan.json's layouts: nodes -> stages
    nodelist: str = ""                     # what it holds now, as Slurm writes it
    #: the lost nodes died before Slurm knew: the allocation still holds them, so the next launch
    #: leaves them out itself (srun --exclude, --overlap with the dead step)
    unannounced: bool = False


@dataclass(frozen=True)
class Launched:
    """A launch of the ranks ended under srun with ``rc``. ``ended_itself``: the launcher wrote
    this launch's end (its own decision); ``deaths``: what the ranks recorded and srun saw;
    ``seen``: the signatures of this job's earlier failures; ``alloc``: the job's nodes (None:
    not known); ``job_ending``: Slurm's words when srun could not start the launch because
    the job is completing (:func:`slurm.srun.job_ending`)."""
    rc: int
    ended_itself: bool = False
    deaths: list[Death] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    alloc: Allocation | None = None
    job_ending: str | None = None


@dataclass(frozen=True)
class Stopped:
    """The ranks stopped together at step ``step`` of ``steps`` for ``stop``, or (Stop.HUNG) a
    watchdog found a rank hung in a job launched by hand."""
    stop: Stop
    step: int
    steps: int
    #: on a stop by signal in a Slurm job, Slurm's word that it preempts the job (None: it could
    #: not be asked; taken as a preemption, the side that loses nothing)
    preempted: bool | None = None
    #: Slurm requeues a preempted job itself (24.05 on; pipeswift_slurm.slurm.client)
    slurm_requeues: bool = False
    hung_node: str | None = None   # Stop.HUNG: the node of the rank that stopped, when certain
    hung_why: str = ""
    #: a stop that may requeue in a Slurm job: what the next attempt's node count is decided from
    requeue: RequeueFacts | None = None


@dataclass(frozen=True)
class Decision:
    """``action`` (:class:`codes.Action`): DONE (exit ``exit_code``, nothing more), RELAUNCH
    (start the ranks again in this allocation after ``backoff_s``), RELAYOUT (the same, on
    plan.json's new cut), SHRINK (start them again on the ``nodes`` the allocation has left),
    REQUEUE (give the allocation back; the job queues again, ``exclude`` left out, asking for
    ``nodes`` when set, ``notes`` saying why), GROW (a requeue for more nodes, ``nodes``), FAIL
    (end the job, ``exit_code``). ``reason``: a stop's ``end`` event reason;
    ``requeue_by``: who requeues ("pswift", or "slurm" for a preemption it requeues itself);
    ``forbid_requeue``: keep Slurm from requeueing a preempted job whose budget is spent."""
    action: Action
    why: str
    exit_code: int = 0
    backoff_s: float = 0.0
    exclude: str | None = None
    death: Death | None = None
    counts_as_restart: bool = False
    notes: list[str] = field(default_factory=list)
    nodes: int | None = None
    nodelist: str | None = None
    reason: str = ""
    requeue_by: str | None = None
    forbid_requeue: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", Action(self.action))   # one of Action's, even from a broadcast dict


def requeues_left(attempt: int, max_requeues: int) -> int:
    """Requeues the job may still make after attempt ``attempt`` (0-based): the one requeue
    budget. 0: this attempt is the last; below 0: this attempt is beyond it and must not train."""
    return max_requeues - attempt


def may_train(attempt: int, max_requeues: int) -> bool:
    """Whether attempt ``attempt`` is within the budget at all (a later one refuses to train)."""
    return requeues_left(attempt, max_requeues) >= 0


def may_grow(attempt: int, max_requeues: int) -> bool:
    """Whether attempt ``attempt`` may stop to grow: a growth spends a requeue and keeps one to
    spare (a preemption of the grown attempt still requeues)."""
    return requeues_left(attempt, max_requeues) >= 2


def restart_left(restarts: int, max_restarts: int) -> bool:
    """Whether an attempt that restarted ``restarts`` times may restart once more."""
    return restarts < max_restarts


def backoff(restart: int) -> float:
    """Seconds before the ``restart``-th restart (1-based)."""
    return 0.0 if restart <= 1 else min(BACKOFF_MAX_S, 2.0 ** (restart - 2))


def first_death(deaths: list[Death]) -> Death | None:
    """The death that explains the launch's end: an exception of the code first (a peer's
    broken collective is its consequence), else a rank killed or lost, else anything."""
    bugs = [d for d in deaths if not d.is_fault]
    killed = [d for d in deaths if d.how != "exception" and not d.how.startswith("exit")]
    chosen = bugs or killed or deaths
    return chosen[0] if chosen else None


def what_follows(end: Launched | Stopped, b: Budgets) -> Decision:
    """The one decision of what follows an attempt's end (a stop at a step boundary, or a
    launch that ended under srun), within budgets ``b``."""
    return _after_stop(end, b) if isinstance(end, Stopped) else _after_launch(end, b)


def _after_stop(s: Stopped, b: Budgets) -> Decision:
    if s.stop == Stop.RELAYOUT:   # plan.json holds the new cut: every rank launches again
        return Decision(Action.RELAYOUT, f"re-laid out at step {s.step}", int(Exit.RELAYOUT), reason="relayout")
    if s.step >= s.steps:
        return Decision(Action.DONE, f"all {s.steps} steps trained", 0, reason="completed")
    if s.stop == Stop.HUNG:
        return _after_hang(s, b)
    if s.stop == Stop.GROW and b.in_slurm:   # the watcher asked only with a requeue to spare
        nodes, why = _asked_nodes(s, "grow")
        return Decision(Action.GROW, f"growing at step {s.step}: requeueing the job", 0, reason="grow",
                        requeue_by="pswift", nodes=nodes, notes=why)
    if not b.in_slurm:
        reason = "time_limit" if s.stop == Stop.TIME else "stopped"
        return Decision(Action.DONE, f"stopped at step {s.step} ({reason}); pswift run has no requeue", 0, reason=reason)
    reason = "time_limit" if s.stop == Stop.TIME else "cancelled" if s.preempted is False else "preempted"
    if reason == "cancelled":
        return Decision(Action.DONE, f"cancelled at step {s.step}", 0, reason=reason)
    if requeues_left(b.attempt, b.max_requeues) <= 0:
        return Decision(Action.DONE, f"{reason} at step {s.step}, but this was attempt {b.attempt} and max_requeues = "
                                f"{b.max_requeues} is spent: not requeueing; raise [job] max_requeues and "
                                f"resubmit to continue from the checkpoint", int(Exit.BUDGET_SPENT), reason=reason,
                        forbid_requeue=reason == "preempted" and s.slurm_requeues)
    # Slurm never requeues a timed-out job; a preempted one only from 24.05 on
    by = "slurm" if reason == "preempted" and s.slurm_requeues else "pswift"
    nodes, why = _asked_nodes(s, reason) if by == "pswift" else (None, [])
    return Decision(Action.REQUEUE, f"{reason} at step {s.step}: " + (
        "Slurm requeues the job itself" if by == "slurm" else "requeueing the job"), 0, reason=reason, requeue_by=by,
        nodes=nodes, notes=why)


def _asked_nodes(s: Stopped, reason: str) -> tuple[int | None, list[str]]:
    """A requeue's node count (None: as this attempt asked) and its reason, as a note."""
    if s.requeue is None:
        return None, []
    nodes, why = requeue_nodes(s.requeue, reason)
    return nodes, [why] if why else []


def _after_hang(s: Stopped, b: Budgets) -> Decision:
    """A hang in a job launched by hand (in a batch job the watchdog's record makes it a
    :class:`Launched` fault): requeue without the hung rank's node, within the budget."""
    if b.in_slurm and requeues_left(b.attempt, b.max_requeues) > 0:
        return Decision(Action.REQUEUE, f"{s.hung_why}; requeueing the job"
                        + (f" without node {s.hung_node}" if s.hung_node else ""), int(Exit.HUNG),
                        exclude=s.hung_node, reason="hung", requeue_by="pswift")
    return Decision(Action.DONE, f"{s.hung_why}; not requeueing (attempt {b.attempt}, max_requeues = "
                            f"{b.max_requeues})", int(Exit.HUNG), reason="hung")


def _after_launch(end: Launched, b: Budgets) -> Decision:
    rc, ended_itself, deaths, seen, alloc = end.rc, end.ended_itself, end.deaths, end.seen, end.alloc
    if rc == 0:
        return Decision(Action.DONE, "the ranks finished", 0)
    if rc == Exit.RELAYOUT and ended_itself:
        if b.relayouts < b.max_relayouts:
            return Decision(Action.RELAYOUT, f"re-layout {b.relayouts + 1}")
        return Decision(Action.FAIL, f"a re-layout beyond the {b.max_relayouts} an attempt may make", rc)
    if rc == Exit.REJOIN and ended_itself:   # no budget: the run's members, not this one, changed
        return Decision(Action.REJOIN, "the run's members changed: its next epoch")
    if ended_itself:
        return Decision(Action.DONE, f"the launcher ended the attempt itself (exit {rc})", rc)
    if end.job_ending:   # preempted, requeued or cancelled between launches: Slurm ends the job
        return Decision(Action.DONE, f"srun could not start the launch ({end.job_ending}): the job is being "
                                     f"preempted, requeued or cancelled; not launching again", rc)
    death = first_death(deaths) or Death(how=f"exit {rc}")
    if not death.is_fault and death.signature in seen:
        return Decision(Action.FAIL, f"{death.describe()} again: the same error at the same step in two "
                                f"launches is the model's or the data's, not the cluster's; fix it and "
                                f"resubmit (the newest checkpoint is kept)", 1, death=death)
    kind = "fault" if death.is_fault else "error, once"
    if alloc is not None and alloc.now < alloc.launched:
        return _on_survivors(death, b, alloc, rc)
    if death.how == "hung" and death.node and death.signature in seen and b.in_slurm \
            and requeues_left(b.attempt, b.max_requeues) > 0:
        return Decision(Action.REQUEUE, f"{death.describe()}: a second hang on {death.node}; requeueing the job "
                                   f"without it", 0, exclude=death.node, death=death)
    if restart_left(b.restarts, b.max_restarts):
        n = b.restarts + 1
        return Decision(Action.RELAUNCH, f"{death.describe()} ({kind}): restart {n} of {b.max_restarts} in "
                                    f"this allocation", backoff_s=backoff(n), death=death,
                        counts_as_restart=True)
    spent = f"max_restarts = {b.max_restarts} spent in this attempt"
    if b.in_slurm and requeues_left(b.attempt, b.max_requeues) > 0:
        exclude = death.node if death.is_fault and death.how != "exception" else None
        return Decision(Action.REQUEUE, f"{death.describe()} ({kind}); {spent}: requeueing the job"
                        + (f" without {exclude}" if exclude else ""), 0, exclude=exclude, death=death)
    why = (f"{death.describe()} ({kind}); {spent}" +
           (f" and max_requeues = {b.max_requeues} spent at attempt {b.attempt}" if b.in_slurm else "")
           + ": raise [job] max_restarts or max_requeues and resubmit to continue from the checkpoint")
    return Decision(Action.FAIL, why, rc if rc else 1, death=death)


def _on_survivors(death: Death, b: Budgets, alloc: Allocation, rc: int) -> Decision:
    """Slurm took node(s) away from the allocation (a node failure, ``--no-kill``): go on with
    the nodes left on plan.json's layout for them, else requeue without the lost node."""
    lost = ", ".join(alloc.lost) or f"{alloc.launched - alloc.now} node(s)"
    was, will = alloc.stages.get(alloc.launched), alloc.stages.get(alloc.now)
    gone = Death("lost", death.rank if death.how == "lost" else None, alloc.lost[0] if alloc.lost else death.node,
                 death.step, death.error)
    if will is not None and alloc.now > 0 and restart_left(b.restarts, b.max_restarts):
        n = b.restarts + 1
        change = f", {was} -> {will} stage(s)" if was is not None and was != will else ""
        silent = " (silent, before Slurm knew)" if alloc.unannounced else ""
        return Decision(Action.SHRINK, f"{lost} lost{silent}: restart {n} of {b.max_restarts} on the {alloc.now} "
                                  f"node(s) left{change}", backoff_s=backoff(n), death=gone, counts_as_restart=True,
                        nodes=alloc.now, nodelist=alloc.nodelist,
                        exclude=",".join(alloc.lost) if alloc.unannounced else None)
    why = (f"no layout for the {alloc.now} node(s) left" if will is None or alloc.now == 0
           else f"max_restarts = {b.max_restarts} spent in this attempt")
    if b.in_slurm and requeues_left(b.attempt, b.max_requeues) > 0:
        exclude = alloc.lost[0] if alloc.lost else None
        return Decision(Action.REQUEUE, f"{lost} lost; {why}: requeueing the job" + (f" without {exclude}" if exclude else ""),
                        0, exclude=exclude, death=gone)
    return Decision(Action.FAIL, f"{lost} lost; {why}, and max_requeues = {b.max_requeues} spent at attempt "
                            f"{b.attempt}: resubmit to continue from the checkpoint", rc if rc else 1, death=gone)


def silent_nodes(began: dict[int, str], ended: set[int], waited_s: float,
                 grace_s: float = SILENT_GRACE_S) -> tuple[str, ...]:
    """The nodes every one of whose ranks began and then gave no sign (no record of its end, no
    word from srun, in ``ended``) ``waited_s`` after the launch's first failure; none before
    ``grace_s``. A node with one rank heard from is not lost (a rank's own trouble)."""
    if waited_s < grace_s:
        return ()
    nodes: dict[str, list[bool]] = {}
    for rank, node in began.items():
        nodes.setdefault(node, []).append(rank in ended)
    return tuple(sorted(n for n, heard in nodes.items() if not any(heard)))


def srun_deaths(text: str) -> list[Death]:
    """The ranks srun reports ended badly (:func:`slurm.srun.ended_badly`), as deaths."""
    return [Death(how=e.how, rank=e.rank, node=e.node, error=e.error) for e in srun.ended_badly(text)]


# ------------------------------------------------------------- the requeued attempt's node count
@dataclass(frozen=True)
class RequeueFacts:
    """What a requeued attempt's node count is decided from, gathered by rank 0 at a stop:
    plan.json (its layouts, node request, partition and estimates), the cluster as Slurm sees it
    (None when it could not be asked: ``error`` says why), the job's own nodes, the CPUs a node
    must have free, and a growth's target."""
    plan: Any
    cluster: ClusterState | None
    mine: frozenset[str] = frozenset()
    cpus_per_node: int = 1
    grow_to: int | None = None
    error: str = ""


def requeue_may_resize(plan: Any) -> bool:
    """Whether a requeued attempt may ask for another node count than this one: a node range
    with several layouts (one layout, or a fixed request, which fixes the task count too: no; a
    member of a run of members: its own nodes, always)."""
    return len(plan["layouts"]) >= 2 and "-" in str(plan["nodes_request"]) and not plan["members"]


def requeue_nodes(f: RequeueFacts, reason: str) -> tuple[int | None, str]:
    """How many nodes the requeued attempt asks for (None: as this one did), and why: a
    growth's target, else what the cluster will have when it restarts (:func:`requeue_target`),
    when that is fewer than the range's minimum (an updated pending job starts on its range's
    minimum, a submitted one on as many as are free up to its maximum: the request changes only
    when the job would otherwise wait). One layout, or a fixed request (it fixes the task count
    too): as it asked."""
    plan = f.plan
    if not requeue_may_resize(plan):
        return None, ""
    if reason == "grow" and f.grow_to:
        return f.grow_to, "growing"
    if f.cluster is None:
        return None, f"cannot read the cluster ({f.error})"
    nodes, why = requeue_target(plan, f.cluster, f.cpus_per_node, set(f.mine))
    asked = int(str(plan["nodes_request"]).split("-")[0])
    return (nodes, why) if nodes < asked else (None, "")


def _pool(state: ClusterState, partition: str | None, cpus_per_node: int,
          mine: set[str]) -> tuple[int, int, int]:
    """(idle usable nodes not the job's, the job's own, what pending jobs sharing those nodes ask
    for: they may start first, whatever their partition)."""
    usable = usable_nodes(state, partition, cpus_per_node)
    names = {n.name for n in usable}
    idle = sum(1 for n in usable if n.name not in mine and n.idle_cpus >= cpus_per_node)
    demand = 0
    for p in state.pending:
        shared = sum(1 for n in state.nodes if n.name in names and p.partition in n.partitions)
        demand += min(p.node_count, shared)
    return idle, len(mine & names), demand


def free_nodes(state: ClusterState, partition: str | None, cpus_per_node: int, mine: set[str]) -> int:
    """Nodes the job could add now: idle ones not its own, less what pending jobs ask for."""
    idle, _, demand = _pool(state, partition, cpus_per_node, mine)
    return max(0, idle - demand)


def requeue_target(plan: Any, state: ClusterState, cpus_per_node: int, mine: set[str]) -> tuple[int, str]:
    """How many nodes a requeued attempt should ask for, and why: of the node counts plan.json
    has a layout for, the fastest (the planner's estimate, else the most nodes) within what it
    can have when it restarts (idle nodes and its own, less what pending jobs sharing them ask
    for); the smallest layout when even that is more. Slurm gives a pending job the minimum of
    its node range, so the requeued job asks for exactly this count."""
    idle, own, demand = _pool(state, plan["partition"], cpus_per_node, mine)
    available = max(0, idle + own - demand)
    counts = sorted(int(n) for n in plan["layouts"])
    fits = [n for n in counts if n <= available]
    if not fits:
        return counts[0], f"{available} node(s) available: the smallest layout"
    predicted = predicted_steps(plan)
    if all(n in predicted for n in fits):
        best = min(fits, key=lambda n: (predicted[n], -n))
        return best, f"{available} node(s) available, {best} predicted fastest"
    return fits[-1], f"{available} node(s) available"
