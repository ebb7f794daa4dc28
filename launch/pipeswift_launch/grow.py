"""Grow back: a job below the top of its node range watches its partition from rank 0 and, when
enough nodes are free and more of them finish the job sooner by a clear margin, checkpoints
and requeues itself to come back with more stages.

Rank 0 asks Slurm (one bounded ``sinfo``/``squeue``, or pyslurm) every ``grow_check_s`` seconds
in a daemon thread, never on the training path. The estimate is the remaining JCT of staying,
remaining steps x the step time measured now, against growing to n nodes: a requeue (its
checkpoint, this attempt's measured setup and restore again, ``REQUEUE_S`` of Slurm's requeue)
plus the remaining steps at the predicted step time for n nodes, anchored to the step time
measured now (measured x predicted(n) / predicted(now)). Predictions come from the layers the
job measured in this attempt (the cost model over each count's measured cut), else from the
planner's estimates in plan.json. It grows when the saving is at
least ``COST_MARGIN`` x the cost and the step ``MIN_GAIN`` faster; at most once an attempt, and
only with a requeue to spare (``max_requeues``): no flapping.

Nodes count as free when idle (enough idle CPUs) in the job's partition, not the job's own,
less the nodes the partition's pending jobs ask for (they may start first).

A run of members grows in place onto members waiting to join (files in the run directory). Its
array holds members back beyond the planner's node count (``%K``, plan.json's
``members_at_once``): where growing onto free nodes pays by the same rule, rank 0 raises the
throttle (:func:`let_members_run`), a held-back member starts, sits down, and the run grows onto it;
a member the run declines brings the throttle back down to the members training.
"""

from __future__ import annotations

import threading
from pathlib import Path
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pipeswift_slurm import runfiles
from pipeswift_slurm.plan import members_at_once, predicted_steps, read_plan, write_plan
from pipeswift_slurm.planning.decide import free_nodes
from pipeswift_slurm.slurm.cluster import ClusterState
from pipeswift_slurm.slurm.records import holds_array_tasks
from pipeswift_slurm.stats import median_of

from .relayout import COST_MARGIN, MIN_GAIN

if TYPE_CHECKING:
    from pipeswift_slurm.plan import Plan

#: seconds Slurm takes to start a requeued job when nodes are free (its requeue delay)
REQUEUE_S = 10.0
#: a run of members checks at least this often: its waiting members are files in the run
#: directory (no Slurm query), and each idles its nodes until the run grows onto it or declines it
MEMBERS_CHECK_S = 5.0


@dataclass
class Growth:
    go: bool
    why: str
    nodes_from: int
    nodes_to: int = 0
    free: int = 0
    step_s: float = 0.0
    predicted_step_s: float = 0.0
    remaining: int = 0
    gain_s: float = 0.0
    cost_s: float = 0.0

    @property
    def declined(self) -> bool:
        """Growing was weighed and does not pay (not: no estimate yet, or no layout fits)."""
        return not self.go and self.nodes_to > 0

    def record(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()
                if k not in ("go", "why")}


def choose(plan: Plan, nodes: int, free: int, step_times: Sequence[float], remaining: int,
           restart_s: float, ckpt_s: float, predicted: dict[int, float] | None = None,
           requeue_s: float = REQUEUE_S) -> Growth:
    """Whether to grow now from ``nodes`` with ``free`` more nodes free, and to how many;
    ``predicted``: step time per node count (default: the planner's, from plan.json);
    ``requeue_s``: what the way back costs beside the checkpoint and the restart (a run of
    members launches again in place: 0)."""
    keep = Growth(False, "", nodes, free=free, remaining=remaining)
    predicted = predicted if predicted is not None else predicted_steps(plan)
    if nodes not in predicted or not step_times:
        keep.why = "no planner estimate for this node count"
        return keep
    now = median_of(step_times)
    cost = ckpt_s + restart_s + requeue_s
    best = keep
    for n, est in sorted(predicted.items()):
        if not nodes < n <= nodes + free:
            continue
        step = now * est / predicted[nodes]
        g = Growth(False, "", nodes, n, free, now, step, remaining, (now - step) * remaining, cost)
        if g.gain_s > best.gain_s:
            best = g
    if best.nodes_to == 0:
        keep.why = f"{free} node(s) free: no larger layout fits"
        return keep
    # the planner gave up to [job] jct_slack of JCT for fewer node-hours: growing must beat it too
    need = max(MIN_GAIN, plan["jct_slack"])
    if best.predicted_step_s > (1 - need) * best.step_s:
        best.why = f"{best.nodes_to} node(s) would be under {need:.0%} faster a step"
    elif best.gain_s < COST_MARGIN * best.cost_s:
        best.why = (f"{best.nodes_to} node(s) save {best.gain_s:.1f} s over {remaining} step(s), under "
                    f"{COST_MARGIN:g}x the requeue's {best.cost_s:.1f} s")
    else:
        best.go = True
        best.why = (f"{free} node(s) free: {nodes} -> {best.nodes_to} node(s), step {now:.4g} s -> "
                    f"{best.predicted_step_s:.4g} s predicted, saves {best.gain_s:.1f} s over {remaining} "
                    f"step(s) for a requeue of {best.cost_s:.1f} s")
    return best


def held_back(plan: Plan) -> bool:
    """Whether the run's array holds members back (its throttle under its task count)."""
    return members_at_once(plan) < int(plan["members"])


def members_free(state: ClusterState, partition: str | None, cpus_per_node: int, array_id: str) -> int:
    """Nodes a run of members could add by starting a member its array holds back: idle nodes,
    less what pending jobs ask for, the array's own held-back tasks aside (squeue lists them as
    one pending job: ``records.holds_array_tasks``); a member requeued by a preemption counts as the
    others do: it starts first."""
    others = [p for p in state.pending if not holds_array_tasks(p.job_id, array_id)]
    return free_nodes(ClusterState(state.now, state.nodes, state.running, others), partition, cpus_per_node, set())


#: plan.json's writers in this launch take turns: rank 0's main thread writing a re-layout from
#: its copy of the plan, and the growth watcher's thread raising the members' throttle (a read of
#: the file, then a write): neither write may drop the other's change
PLAN_WRITES = threading.Lock()


def let_members_run(plan: Plan, array_id: str, at_once: int, set_throttle: Callable[[str, int], None]) -> None:
    """Let ``at_once`` members of the run hold nodes (the array's throttle), and say so in the
    run's plan.json (``plan``, this launch's copy, too), so the next launch starts from it."""
    set_throttle(array_id, at_once)
    path = Path(plan["run_dir"]) / runfiles.PLAN
    with PLAN_WRITES:
        plan["members_at_once"] = at_once
        write_plan({**read_plan(path), "members_at_once": at_once}, path)


class Watcher:
    """Rank 0's daemon thread: every ``interval`` seconds, ``check()`` the cluster; the first
    time it says grow, keep the answer and call ``on_grow`` (it sets the stop flag)."""

    def __init__(self, interval: float, check: Callable[[], Growth], on_grow: Callable[[], None],
                 log: Callable[[str], None]) -> None:
        self.interval, self.check, self.on_grow, self.log = interval, check, on_grow, log
        self.decision: Growth | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="pswift-grow", daemon=True)
        self.said = ""   # the free count and target last explained

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                g = self.check()
            except Exception as e:  # Slurm unreachable: stay, try again next time
                g = Growth(False, f"cannot read the cluster ({type(e).__name__}: {e})", 0)
            if g.go:
                self.decision = g
                self.log(f"growing: {g.why}")
                self.on_grow()
                return
            said = f"{g.free}/{g.nodes_to}"
            if g.free and said != self.said:   # say why not once per free count and target
                self.said = said
                self.log(f"not growing: {g.why}")
