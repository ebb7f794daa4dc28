"""Re-balance in place: after an attempt's profiling window, cut the stages again from the
layer times just measured, and re-lay out inside the same allocation when it pays.

Rank 0 proposes (:func:`propose`), every rank follows its answer. The new cut is the planner's
own rule (:func:`pipeswift_slurm.planning.costmodel.stage_cut`: exact min-max, memory cap included) over
the measured per-layer times; the cost model turns the old and new cuts into step times, and the
prediction is anchored to the step time measured now (measured x model(new) / model(old)).

Each launch profiles its layers during steps 2-4, and again when its step times drift
(:class:`Drift`). A re-layout happens only when all of these hold (hysteresis: noise never moves a job twice):
- the cut differs and is predicted at least ``MIN_GAIN`` faster per step;
- the seconds saved over the remaining steps are at least ``COST_MARGIN`` x its cost: one
  checkpoint, and this attempt's measured setup and load again (plus a launch);
- this attempt has re-laid out fewer than ``MAX_RELAYOUTS`` times.

Then every rank commits a checkpoint, rank 0 rewrites plan.json (:func:`pipeswift_slurm.plan.
relaid_out`: every node count's layout cut from the measured times, the revision up by one, the
record kept) and the launcher exits with ``Exit.RELAYOUT`` (pipeswift_slurm.codes): the batch script starts it again in
the same allocation, where it resumes from that checkpoint with the new boundaries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Sequence

from pipeswift_slurm.planning.costmodel import (DEFAULT_DEVICE_MEMORY, Hardware, Profile, checkpoint_seconds,
                                       estimate_step, every_known, overheads_from_instructions,
                                       stage_cut)
from pipeswift_slurm.planning.partition import PartitionError
from pipeswift_slurm.planning.decide import MAX_RELAYOUTS
from pipeswift_slurm.stats import median, median_of

if TYPE_CHECKING:
    from pipeswift_slurm.plan import LayoutSpec, Plan

MIN_GAIN = 0.10
COST_MARGIN = 2.0
#: a launch profiles its layers again (and may re-cut) when the median of its last
#: ``DRIFT_WINDOW`` steps is ``DRIFT`` away from that of the ``DRIFT_WINDOW`` steps after the
#: last profile, judged ``DRIFT_STEPS`` steps after a profile at the earliest, at most
#: ``MAX_PROFILES`` profiles a launch
DRIFT, DRIFT_STEPS, DRIFT_WINDOW, MAX_PROFILES = 0.25, 20, 10, 3
#: seconds of a launch not in the measured setup (srun, the interpreter before the launcher)
LAUNCH_S = 1.0


@dataclass
class Proposal:
    go: bool
    why: str
    boundaries: list[int]
    step_s: float = 0.0             # measured now (median of the profiled steps)
    predicted_step_s: float = 0.0   # with the new cut, anchored to step_s
    remaining: int = 0
    gain_s: float = 0.0             # predicted seconds saved over the remaining steps
    cost_s: float = 0.0             # predicted seconds the re-layout costs

    def record(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()
                if k not in ("go", "why")}


def measured_profile(plan: Plan, layout: LayoutSpec, profiled: dict[str, Any],
                     boundaries: Sequence[int]) -> Profile | None:
    """The job's profile from one layer_profile event's content (every layer present), or None."""
    n = boundaries[-1]
    secs = profiled.get("seconds") or {}
    if any(str(i) not in secs for i in range(n)):
        return None
    params = [profiled.get("param_bytes", {}).get(str(i)) for i in range(n)]
    acts = [profiled.get("activation_bytes", {}).get(str(i)) for i in range(n)]
    saved = [(profiled.get("saved_bytes") or {}).get(str(i)) for i in range(n)]
    weight = [(profiled.get("weight_seconds") or {}).get(str(i)) for i in range(n)]
    over: dict[str, float] = {}
    if profiled.get("instructions"):
        over = overheads_from_instructions(profiled["instructions"], secs, boundaries,
                                           int(layout["micro_batches"]))
    t = plan["training"]
    return Profile(tuple(float(secs[str(i)]) for i in range(n)),
                   every_known(params), every_known(acts),
                   int(layout["micro_batch_size"]), "measured", **over,
                   precision=t["precision"], zero_stage=int(t["zero_stage"]),
                   recompute_interval=int(t["activation_checkpoint_interval"]),
                   saved_bytes=every_known(saved),
                   weight_fraction=tuple(None if w is None or not float(secs[str(i)]) > 0
                                         else min(1.0, float(w) / float(secs[str(i)])) for i, w in enumerate(weight)))


def hardware(plan: Plan) -> Hardware:
    device = plan["device"]
    return Hardware(device=device, device_memory=plan["device_memory"] or DEFAULT_DEVICE_MEMORY[device],
                    host_cores=plan["host_cores"], ranks_per_host=plan["ranks_per_host"],
                    threads_per_rank=int(plan["cpus_per_task"]), p2p_latency=float(plan["p2p_latency"]),
                    p2p_bandwidth=float(plan["p2p_bandwidth"]))


def step_times(plan: Plan, profile: Profile) -> dict[int, float]:
    """The cost model's step time for every node count of plan.json from a measured profile,
    each layout cut by the measured times (counts whose cut does not fit are left out)."""
    hw, out = hardware(plan), {}
    for n, lay in plan["layouts"].items():
        try:
            cut = stage_cut(profile, int(lay["stages"]), int(lay["data_parallel"]), hw.device_memory)
        except PartitionError:
            continue
        out[int(n)] = estimate_step(profile, cut, lay["micro_batches"], lay["micro_batch_size"],
                                    int(lay["data_parallel"]), lay["tasks_per_node"], hw, plan["schedule"]).step_s
    return out


def propose(plan: Plan, layout: LayoutSpec, boundaries: list[int], profiled: dict[str, Any],
            step_times: Sequence[float], step: int, launch_cost_s: float, ckpt_s: float | None,
            done: int) -> Proposal:
    """Whether to re-lay out now, and why (rank 0; the numbers go into the event and the log)."""
    keep = Proposal(False, "", list(boundaries))
    profile = measured_profile(plan, layout, profiled, boundaries)
    if profile is None or not step_times:
        keep.why = "no complete layer profile"
        return keep
    hw, P, dp = hardware(plan), int(layout["stages"]), int(layout["data_parallel"])
    try:
        new = stage_cut(profile, P, dp, hw.device_memory)
    except PartitionError as e:
        keep.why = f"no cut fits ({e})"
        return keep
    args = (layout["micro_batches"], layout["micro_batch_size"], dp, layout["tasks_per_node"], hw, plan["schedule"])
    old_s, new_s = estimate_step(profile, boundaries, *args).step_s, estimate_step(profile, new, *args).step_s
    p = Proposal(False, "", new, step_s=median_of(step_times),
                 remaining=max(0, int(plan["training"]["steps"]) - step))
    p.predicted_step_s = p.step_s * new_s / old_s if old_s > 0 else p.step_s
    p.gain_s = (p.step_s - p.predicted_step_s) * p.remaining
    p.cost_s = launch_cost_s + LAUNCH_S + (ckpt_s if ckpt_s is not None else checkpoint_seconds(profile.param_bytes))
    p.go, p.why = _verdict(p, list(boundaries), done)
    return p


def _verdict(p: Proposal, old: list[int], done: int) -> tuple[bool, str]:
    if p.boundaries == old:
        return False, "the measured cut is the one in use"
    if done >= MAX_RELAYOUTS:
        return False, f"already re-laid out {done} time(s) in this attempt (at most {MAX_RELAYOUTS})"
    if p.predicted_step_s > (1 - MIN_GAIN) * p.step_s:
        return False, (f"predicted step {p.predicted_step_s:.4g} s vs {p.step_s:.4g} s now: "
                       f"under {MIN_GAIN:.0%} faster")
    if p.gain_s < COST_MARGIN * p.cost_s:
        return False, (f"saves {p.gain_s:.1f} s over {p.remaining} step(s), under {COST_MARGIN:g}x "
                       f"its cost {p.cost_s:.1f} s")
    return True, (f"step {p.step_s:.4g} s -> {p.predicted_step_s:.4g} s predicted: saves {p.gain_s:.1f} s "
                  f"over {p.remaining} step(s) for {p.cost_s:.1f} s")


def cuts_for_all(plan: Plan, profile: Profile) -> dict[str, list[int]]:
    """Every node count's layout cut from the measured profile (its own stages and DP); a count
    whose cut does not fit keeps its boundaries."""
    hw, cuts = hardware(plan), {}
    for n, lay in plan["layouts"].items():
        try:
            cuts[n] = stage_cut(profile, int(lay["stages"]), int(lay["data_parallel"]), hw.device_memory)
        except PartitionError:
            continue
    return cuts


def growth_cuts(plan: Plan, profile: Profile, nodes_now: int) -> dict[str, list[int]]:
    """The node counts other than ``nodes_now`` whose cut from the measured profile differs
    from plan.json's: what a growing job writes before its requeue, so that the grown attempt
    starts from what this one measured rather than from the planner's layer costs. A TOML's
    explicit cut stays the user's."""
    cuts = cuts_for_all(plan, profile)
    return {n: list(c) for n, c in cuts.items()
            if n != str(nodes_now) and plan["layouts"][n]["partition"] != "explicit"
            and list(c) != list(plan["layouts"][n]["boundaries"] or [])}


class Drift:
    """When the stage times drift: rank 0 compares the recent step times with the steady ones
    after the last profile (the launch then profiles again, every rank together, and proposes
    again). The base is the ``DRIFT_WINDOW`` steps after a profile, not the profiled steps: the
    first of those are still warming up and the profile's hooks slow the steps they time, so
    the steady steps after them read as drift and profiled again inside steady training."""

    def __init__(self) -> None:
        self.base: float | None = None
        self.at: int | None = None
        self.profiles = 0

    def settle(self, step: int) -> None:
        """A profile ended at ``step``: the steps that follow set the base."""
        self.base, self.at, self.profiles = None, step, self.profiles + 1

    def drifted(self, step: int, step_times: Sequence[float]) -> bool:
        """Called at every unprofiled step's end with this launch's step times so far."""
        if self.at is None or self.profiles >= MAX_PROFILES:
            return False
        if self.base is None:
            if step - self.at >= DRIFT_WINDOW:
                self.base = median(step_times[-DRIFT_WINDOW:])
            return False
        if step - self.at < DRIFT_STEPS:
            return False
        now = median(step_times[-DRIFT_WINDOW:])
        return now is not None and abs(now - self.base) > DRIFT * self.base

