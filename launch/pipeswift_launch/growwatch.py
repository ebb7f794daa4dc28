"""Rank 0's growth watcher while a job trains (the rule itself is grow.py's): started after
the layer profile when the job may grow, it asks Slurm for free nodes, or a run of members for
the members seated for its next epoch, raises or lowers the members' array throttle, and at the
step's end the growth it chose is recorded (plan.json re-cut from the measured layers) before
the requeue or the next epoch."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeswift_slurm import memberfiles, runfiles
from pipeswift_slurm.plan import members_at_once, relaid_out, write_plan
from pipeswift_slurm.planning import decide
from pipeswift_slurm.planning.costmodel import estimate_step

from . import grow, members, relayout, signals
from .dist_env import log0 as _log
from .slurmport import slurm

if TYPE_CHECKING:
    from .attempt import Attempt


def watch(att: Attempt, step_times: list[float], profiled: dict[str, Any]) -> Any:
    """Rank 0's growth watcher (grow.py) when the job may grow: below the top of its node range,
    a requeue to spare; None otherwise. Step times per node count come from the layers just
    measured (the cost model over each count's measured cut), else from the planner's."""
    plan, denv = att.plan, att.denv
    check_s = float(plan["grow_check_s"])
    if plan["members"] and check_s:   # its seats are files in the run directory, not a Slurm query
        check_s = min(check_s, grow.MEMBERS_CHECK_S)
    counts = [int(n) for n in plan["layouts"]]
    if (att.rank != 0 or not check_s or denv.nodes >= max(counts)
            or not (plan["members"] or denv.job_id is not None and decide.may_grow(denv.attempt, plan["max_requeues"]))):
        return None   # a run of members grows in place (the next epoch, `pswift run`'s too): no requeue spent
    cpus = int(att.layout["tasks_per_node"]) * int(plan["cpus_per_task"])
    profile = relayout.measured_profile(plan, att.layout, profiled, att.boundaries)
    predicted = relayout.step_times(plan, profile) if profile is not None else None
    if predicted is not None and profile is not None:   # this count as it runs now, not as a re-cut would
        predicted[denv.nodes] = estimate_step(
            profile, att.boundaries, att.layout["micro_batches"], att.layout["micro_batch_size"],
            int(att.layout["data_parallel"]), att.layout["tasks_per_node"], relayout.hardware(plan),
            plan["schedule"]).step_s

    epoch = int(os.environ.get("PSWIFT_EPOCH") or 0)
    array = os.environ.get("SLURM_ARRAY_JOB_ID") or ""
    throttled = bool(plan["members"] and array and grow.held_back(plan))
    asked = [-float(plan["grow_check_s"])]   # when Slurm was last asked: as often as one job asks it

    def check() -> Any:
        waiting = memberfiles.waiting(Path(plan["run_dir"]), epoch) if plan["members"] else []
        held = throttled and not waiting and grow.held_back(plan) and \
            time.monotonic() - asked[0] >= float(plan["grow_check_s"])
        if held:   # nodes a member the array holds back could start on
            asked[0] = time.monotonic()
            free = grow.members_free(slurm().cluster_state(), plan["partition"], cpus, array)
        elif plan["members"]:   # the nodes of members seated for the next epoch, not Slurm's free ones
            free = sum(len(s.nodes) for s in waiting)
        else:
            state = slurm().cluster_state()
            own = {n for j in state.running if j.job_id == denv.job_id for n in j.nodes}
            free = decide.free_nodes(state, plan["partition"], cpus, own)
        g = grow.choose(plan, denv.nodes, free, step_times[-20:], int(plan["training"]["steps"]) - att.step,
                        att.setup_s + att.load_s, att.checkpoints.last_s or 0.0, predicted,
                        requeue_s=0.0 if plan["members"] else grow.REQUEUE_S)
        if held and g.go:
            return _start_held_member(att, array, g)
        if g.declined and waiting:   # a member the run will not take gives its nodes back, not held idle
            _decline_members(att, waiting, epoch, g, array if throttled else "")
        return g

    w = grow.Watcher(check_s, check, signals.request_grow, lambda msg: _log(0, msg))
    w.start()
    return w


def _start_held_member(att: Attempt, array: str, g: Any) -> Any:
    """Growing onto free nodes pays: the array lets a member it holds back start (its throttle
    up to the members ``g`` grows to); the run grows onto it once it sits down (not now: it is
    not here yet)."""
    at_once = -(-g.nodes_to // int(att.plan["member_nodes"]))   # whole members, never fewer than it runs
    if at_once <= members_at_once(att.plan):
        return grow.Growth(False, f"array {array} already lets {members_at_once(att.plan)} member(s) run", g.nodes_from)
    try:
        grow.let_members_run(att.plan, array, at_once, slurm().set_array_throttle)
    except Exception as e:   # noqa: BLE001 - Slurm unreachable: the next check tries again
        return grow.Growth(False, f"cannot let the array start a member ({e})", g.nodes_from)
    _log(0, f"members: array {array} lets {at_once} member(s) run at once ({g.why})")
    return grow.Growth(False, f"waiting for the member(s) array {array} now starts", g.nodes_from)


def _decline_members(att: Attempt, waiting: list[Any], epoch: int, g: Any, array: str) -> None:
    """Members the run will not take end and give their nodes back; an array that held members
    back holds back as many again (its throttle down to the members training), or the next
    one would start only to be declined."""
    _log(0, f"member(s) {','.join(str(s.task) for s in waiting)} not taken ({g.why}): they end")
    for s in waiting:
        members.decline(memberfiles.epoch_dir(Path(att.plan["run_dir"]), epoch + 1), s.task)
    if array:
        try:
            grow.let_members_run(att.plan, array, att.denv.nodes // int(att.plan["member_nodes"]),
                               slurm().set_array_throttle)
        except Exception as e:   # noqa: BLE001 - it stays as it was; a member started is declined too
            _log(0, f"could not hold the array's members back again ({e})")


def commit_growth(att: Attempt, watcher: Any, profiled: dict[str, Any] | None) -> None:
    """Rank 0 records why the job grows (the event) and, with re-balancing on, writes plan.json's
    other node counts cut from this launch's measured layer times; the requeue follows in _finish."""
    g = watcher.decision if watcher is not None else None
    if att.rank == 0 and g is not None:
        att.grow_to = g.nodes_to
        att.events.emit("grow", step=att.step, **g.record())
        if profiled is not None and att.plan["rebalance"]:
            profile = relayout.measured_profile(att.plan, att.layout, profiled, att.boundaries)
            cuts = relayout.growth_cuts(att.plan, profile, att.denv.nodes) if profile is not None else {}
            if cuts:
                record = {"job_id": att.denv.job_id, "attempt": att.denv.attempt, "step": att.step,
                          "nodes": att.denv.nodes, "reason": "grow", "cuts": cuts}
                with grow.PLAN_WRITES:
                    write_plan(relaid_out(att.plan, cuts, record), Path(att.plan["run_dir"]) / runfiles.PLAN)
                _log(0, f"growing: plan.json re-cut from the measured layer times for {sorted(cuts, key=int)} node(s)")
