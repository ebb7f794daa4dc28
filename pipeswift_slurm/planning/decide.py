"""What follows when one launch of the job's ranks ends inside its allocation: pure rules, no
torch, no Slurm call, no file (the batch script's helper, pipeswift_launch.afterlaunch, gathers
the facts and carries the decision out).

The rule, as docs/design.md states it:

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

from pipeswift_slurm.config import MAX_RESTARTS_DEFAULT
from pipeswift_slurm.plan import MAX_RELAYOUTS, RELAYOUT_EXIT

__all__ = ["MAX_RESTARTS_DEFAULT", "RELAYOUT_EXIT", "Allocation", "Budgets", "Death", "Decision", "after_launch",
           "backoff", "first_death", "requeue_left", "restart_left", "silent_nodes", "srun_deaths", "srun_heard"]
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
class Decision:
    """``action``: "done" (exit ``exit_code``, nothing more), "relaunch" (start the ranks again
    in this allocation after ``backoff_s``), "shrink" (start them again on the ``nodes`` the
    allocation has left), "requeue" (give the allocation back; the job queues again,
    ``exclude`` left out), "fail" (end the job, ``exit_code``)."""
    action: str
    why: str
    exit_code: int = 0
    backoff_s: float = 0.0
    exclude: str | None = None
    death: Death | None = None
    counts_as_restart: bool = False
    notes: list[str] = field(default_factory=list)
    nodes: int | None = None
    nodelist: str | None = None


def requeue_left(attempt: int, max_requeues: int) -> bool:
    """Whether attempt ``attempt`` (0-based) may be followed by another: the one requeue budget."""
    return attempt < max_requeues


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


def after_launch(rc: int, ended_itself: bool, deaths: list[Death], seen: list[str],
                 b: Budgets, alloc: Allocation | None = None) -> Decision:
    """What follows a launch that exited ``rc`` (srun's code). ``ended_itself``: the launcher
    wrote this launch's end (its own decision); ``deaths``: what the ranks recorded and srun
    saw; ``seen``: the signatures of this job's earlier failures; ``alloc``: the job's nodes
    (None: not known)."""
    if rc == 0:
        return Decision("done", "the ranks finished", 0)
    if rc == RELAYOUT_EXIT and ended_itself:
        if b.relayouts < b.max_relayouts:
            return Decision("relaunch", f"re-layout {b.relayouts + 1}")
        return Decision("fail", f"a re-layout beyond the {b.max_relayouts} an attempt may make", rc)
    if ended_itself:
        return Decision("done", f"the launcher ended the attempt itself (exit {rc})", rc)
    death = first_death(deaths) or Death(how=f"exit {rc}")
    if not death.is_fault and death.signature in seen:
        return Decision("fail", f"{death.describe()} again: the same error at the same step in two "
                                f"launches is the model's or the data's, not the cluster's; fix it and "
                                f"resubmit (the newest checkpoint is kept)", 1, death=death)
    kind = "fault" if death.is_fault else "error, once"
    if alloc is not None and alloc.now < alloc.launched:
        return _on_survivors(death, b, alloc, rc)
    if death.how == "hung" and death.node and death.signature in seen and b.in_slurm \
            and requeue_left(b.attempt, b.max_requeues):
        return Decision("requeue", f"{death.describe()}: a second hang on {death.node}; requeueing the job "
                                   f"without it", 0, exclude=death.node, death=death)
    if restart_left(b.restarts, b.max_restarts):
        n = b.restarts + 1
        return Decision("relaunch", f"{death.describe()} ({kind}): restart {n} of {b.max_restarts} in "
                                    f"this allocation", backoff_s=backoff(n), death=death,
                        counts_as_restart=True)
    spent = f"max_restarts = {b.max_restarts} spent in this attempt"
    if b.in_slurm and requeue_left(b.attempt, b.max_requeues):
        exclude = death.node if death.is_fault and death.how != "exception" else None
        return Decision("requeue", f"{death.describe()} ({kind}); {spent}: requeueing the job"
                        + (f" without {exclude}" if exclude else ""), 0, exclude=exclude, death=death)
    why = (f"{death.describe()} ({kind}); {spent}" +
           (f" and max_requeues = {b.max_requeues} spent at attempt {b.attempt}" if b.in_slurm else "")
           + ": raise [job] max_restarts or max_requeues and resubmit to continue from the checkpoint")
    return Decision("fail", why, rc if rc else 1, death=death)


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
        return Decision("shrink", f"{lost} lost{silent}: restart {n} of {b.max_restarts} on the {alloc.now} "
                                  f"node(s) left{change}", backoff_s=backoff(n), death=gone, counts_as_restart=True,
                        nodes=alloc.now, nodelist=alloc.nodelist,
                        exclude=",".join(alloc.lost) if alloc.unannounced else None)
    why = (f"no layout for the {alloc.now} node(s) left" if will is None or alloc.now == 0
           else f"max_restarts = {b.max_restarts} spent in this attempt")
    if b.in_slurm and requeue_left(b.attempt, b.max_requeues):
        exclude = alloc.lost[0] if alloc.lost else None
        return Decision("requeue", f"{lost} lost; {why}: requeueing the job" + (f" without {exclude}" if exclude else ""),
                        0, exclude=exclude, death=gone)
    return Decision("fail", f"{lost} lost; {why}, and max_requeues = {b.max_requeues} spent at attempt "
                            f"{b.attempt}: resubmit to continue from the checkpoint", rc if rc else 1, death=gone)


_SRUN_TASK = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<ranks>[\d,\-]+): (?P<what>.+?)\s*$")


_LAUNCH_FAILED = re.compile(r"^srun: error: Task launch for \S+ failed on node (?P<node>[^\s:]+): (?P<what>.+?)\s*$")


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


def srun_heard(text: str) -> set[int]:
    """Every rank srun reported the end of ("node2: tasks 0-3,5: Terminated"), however it ended."""
    heard: set[int] = set()
    for line in text.splitlines():
        m = _SRUN_TASK.match(line)
        for part in (m.group("ranks").split(",") if m else []):
            lo, _, hi = part.partition("-")
            if lo.isdigit() and (hi.isdigit() or not hi):
                heard.update(range(int(lo), int(hi or lo) + 1))
    return heard


def srun_deaths(text: str) -> list[Death]:
    """The ranks srun reports ended badly ("srun: error: node2: task 1: Killed"), in its order;
    ranks it merely terminated after the first (kill-on-bad-exit) are left out."""
    out: list[Death] = []
    for line in text.splitlines():
        launch = _LAUNCH_FAILED.match(line)   # srun could not reach the node: it is lost
        if launch is not None:
            out.append(Death(how="lost", node=launch.group("node"), error=launch.group("what")))
            continue
        m = _SRUN_TASK.match(line)
        if m is None:
            continue
        what = m.group("what")
        if what in ("Terminated",):     # srun's own SIGTERM to the others: a consequence
            continue
        code = re.match(r"Exited with exit code (\d+)", what)
        how = (f"exit {code.group(1)}" if code else "signal 9" if what == "Killed"
               else "lost" if "node failure" in what.lower() or "unknown" in what.lower() else what.lower())
        first = re.match(r"\d+", m.group("ranks"))
        out.append(Death(how=how, rank=int(first.group()) if first else None, node=m.group("node")))
    return out
