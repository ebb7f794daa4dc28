"""Members or one job (issue 62): whether a run is submitted as a job array of members
(pipeswift_launch.members), with the reason either way. The one home of this rule.

A preempted job goes back to the queue and waits there again, for its node range's bottom; a
run of members loses only the preempted member, and the others train on after a relaunch in
their own allocations. ``[resources] members = "auto"`` weighs one against the other, per
preemption the partition's history expects over the run (its preemptions of pswift jobs an
hour x the run's expected hours on the nodes):

- one job: it waits in the queue again (the planner's wait for the range's bottom) and starts
  again (its setup);
- members: the run relaunches twice in place (a setup as the member leaves, another as it comes
  back), and while the member is away (the same wait, counted in full: a member's nodes are
  never more than the bottom's) the others train at the step time of the nodes left.

Members where at least ``MIN_EXPECTED`` preemptions are expected and a preemption costs members
less; else, or where the node range is not a whole number of at least two members, one job. A
number is the user's, and stays. The workload bench (docs/benchmarks.md, "Reading the workload
row with members") is why the price is weighed, not the rate alone: members forced on every
training job of a window did not beat one job (M/P 1.13, 1.10 and 0.83 in three runs, each
interval holding 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeswift_slurm.durations import duration

if TYPE_CHECKING:
    from pipeswift_slurm.config import TrainConfig
    from pipeswift_slurm.planning.planner import Candidate, Estimate, PlanResult

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
    price = preemption_costs(planned.best_per_nodes(), est, top, size, r.nodes_min)
    if price is None:
        return 0, f"one job: {seen}, but no step time for {top - size} node(s) to weigh a member's loss with"
    one_s, members_s, why = price
    if members_s >= one_s:
        return 0, (f"one job: {seen}, {expected:.2g} preemption(s) expected, each costing one job {one_s:.0f} s "
                   f"and members {members_s:.0f} s ({why}): members would not pay")
    return top // size, (f"{top // size} members: {seen}, {expected:.2g} preemption(s) expected over the run's "
                         f"{duration(hours * 3600)}, each costing one job {one_s:.0f} s and members "
                         f"{members_s:.0f} s ({why})")


def at_once(cfg: TrainConfig, planned: PlanResult | None, members: int) -> int:
    """How many of ``members`` may hold nodes from the start (the array's throttle, ``%K``): as
    many as the planner's chosen node count holds (one job would ask no more), never fewer than
    the node range's bottom; every member without a plan. A member beyond them starts only when
    the run raises the throttle, where growing onto free nodes pays (pipeswift_launch.grow), as
    one job grows: an array of members at the range's top took every node that freed, ahead of
    other users' jobs (the workload bench: their bounded slowdown 6.0 against one job's 2.7)."""
    if not members or planned is None or planned.chosen is None:
        return members
    r = cfg.resources
    bottom = -(-r.nodes_min // r.member_nodes)
    return max(1, bottom, min(members, int(planned.chosen.nodes) // r.member_nodes))


def preemption_costs(best: dict[int, Candidate], chosen: Estimate, top: int, size: int,
                     bottom: int) -> tuple[float, float, str] | None:
    """Seconds one preemption costs the run as one job and as members of ``size`` node(s), and
    how, from the planner's best layout per node count (``best``) and its chosen one's estimate;
    None without a step time for the top and for one member fewer."""
    full, fewer = best.get(top), best.get(top - size)
    if full is None or fewer is None or full.estimate is None or fewer.estimate is None \
            or min(full.estimate.step_s, fewer.estimate.step_s) <= 0:
        return None
    at_bottom = best.get(bottom)
    wait = (at_bottom.estimate if at_bottom is not None and at_bottom.estimate is not None else chosen).queue_s
    setup = chosen.setup_s
    lost = max(0.0, 1.0 - full.estimate.step_s / fewer.estimate.step_s)
    one_s = wait + setup
    members_s = 2 * setup + (wait + setup) * lost
    return one_s, members_s, (f"a wait of {wait:.0f} s and a setup of {setup:.0f} s; {top - size} node(s) step "
                              f"{fewer.estimate.step_s / full.estimate.step_s:.2f}x slower than {top}")
