"""The end of an attempt or of a launch, the launcher's side of it in one home: the budgets the
decision weighs (built here only) and the requeue that carries a decision out (asked of Slurm
here only). The decision itself is :mod:`pipeswift_slurm.planning.decide`'s (pure). Who gathers
the facts and acts on the rest: train.py (the ranks' stop at a step boundary), afterlaunch.py
(a launch that ended under srun: restart, shrink, re-layout), watchdog.py (a hang in a rank
launched by hand)."""

from __future__ import annotations

from typing import Any, Callable

from pipeswift_slurm.planning import decide

from .slurmport import slurm


def budgets(plan: Any, attempt: int, job_id: str | None, restarts: int = 0, relayouts: int = 0) -> decide.Budgets:
    """What ``attempt`` of the job may still spend, as plan.json's [job] limits it: the one
    construction of :class:`decide.Budgets` (``restarts``, ``relayouts``: the allocation's so
    far, counted by the batch script; the ranks' own stop counts none)."""
    return decide.Budgets(restarts=restarts, max_restarts=int(plan["max_restarts"]), relayouts=relayouts,
                          attempt=attempt, max_requeues=int(plan["max_requeues"]), in_slurm=job_id is not None)


def requeue(plan: Any, job_id: str, exclude: str | None = None, nodes: int | None = None,
            say: Callable[[str], None] = print) -> bool:
    """Requeue the job: its next attempt off node ``exclude`` when the partition can spare it
    (whether it could), asking for ``nodes`` nodes when given (else what this attempt asked).
    Slurm's errors of the requeue itself are raised; a node request Slurm refuses is said."""
    excluded = slurm().requeue(str(job_id), exclude=exclude, nodes_needed=min(int(n) for n in plan["layouts"]))
    if nodes:
        try:
            slurm().set_node_range(str(job_id), f"{nodes}-{nodes}")
        except Exception as e:   # noqa: BLE001 - the next attempt then asks for what this one had
            say(f"could not set the node request to {nodes}: {e}")
    return excluded
