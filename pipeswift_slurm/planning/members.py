"""Members or one job (issue 62): whether a run is submitted as a job array of members
(pipeswift_launch.members), with the reason either way. The one home of this rule.

A preempted job goes back to the queue and waits there again, for its node range's bottom; a
run of members loses only the preempted member, and the others train on after a relaunch in
their own allocations. Members pay where preemptions are expected during the run: ``[resources]
members = "auto"`` makes the run members when the partition's history (its preemptions of
pswift jobs per hour, over the run's expected hours on the nodes) expects at least
``MIN_EXPECTED`` preemptions; where it expects fewer, or the node range is not a whole number
of at least two members, one job. A number is the user's, and stays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeswift_slurm.durations import duration

if TYPE_CHECKING:
    from pipeswift_slurm.config import TrainConfig
    from pipeswift_slurm.planning.planner import PlanResult

#: preemptions expected over the run from which members pay: one chance in ten
MIN_EXPECTED = 0.1


def choose(cfg: TrainConfig, planned: PlanResult | None) -> tuple[int, str]:
    """(members, why): 0 is one job."""
    r = cfg.resources
    if r.members != "auto":
        n = int(r.members)
        return n, (f"{n} members of {r.member_nodes} node(s), as [resources] members says" if n
                   else "one job ([resources] members = 0)")
    top, size = r.nodes_max, r.member_nodes
    if top % size or r.nodes_min % size or top // size < 2:
        return 0, (f"one job: nodes [{r.nodes_min}, {top}] is not a whole number of at least two members of "
                   f"member_nodes = {size}")
    if planned is None or planned.chosen is None or planned.chosen.estimate is None:
        return 0, "one job: no estimate of the run to weigh members against"
    est, rate = planned.chosen.estimate, planned.interruptions.preemptions_per_hour
    hours = (est.setup_s + est.train_s + est.checkpoint_s) / 3600.0
    expected = rate * hours
    seen = (f"partition {cfg.job.partition or '(default)'} preempted {rate:.3g} pswift job(s) an hour in the "
            f"history")
    if expected < MIN_EXPECTED:
        return 0, (f"one job: {seen}, {expected:.2g} preemption(s) over the run's {duration(hours * 3600)} on "
                   f"its nodes, under {MIN_EXPECTED:g}: members would not pay")
    return top // size, (f"{top // size} members: {seen}, {expected:.2g} preemption(s) expected over the run's "
                         f"{duration(hours * 3600)}; each would send one job back to the queue (now "
                         f"{duration(est.queue_s)} to start), while members train on")
