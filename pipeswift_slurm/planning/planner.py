"""The JCT planner: estimate every candidate layout, then choose (pure: no I/O).

A candidate is a layout (nodes, tasks per node, stages P, data-parallel DP, micro-batch size, m,
boundaries) that the rules of :mod:`layouts` allow, cut by the profile's costs. Each gets an estimate: queue wait (live cluster state) + setup + training
(steps x step time from the cost model, calibrated by history) + checkpoints + expected
interruption loss (preemptions and failures: pipeswift_slurm.planning.interval) = JCT; or a reason why it
was rejected. The lowest JCT wins.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from pipeswift_slurm.planning import layouts
from pipeswift_slurm.planning import interval
from pipeswift_slurm.planning import limits
from pipeswift_slurm.planning import risk
from pipeswift_slurm.config import TrainConfig
from pipeswift_slurm.planning.costmodel import (STATE_BYTES, WEIGHT_FRACTION_ASSUMED, Calibration, Hardware, Measured,
                                                Profile, calibrate, checkpoint_seconds, estimate_step, stage_cut, state_factor)
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.durations import duration
from pipeswift_slurm.planning.layouts import Layout
from pipeswift_slurm.planning.partition import PartitionError
from pipeswift_slurm.slurm.cluster import ClusterState, WaitEstimate, estimate_wait

DEFAULT_SETUP_S = 30.0


@dataclass
class Estimate:
    queue_s: float
    setup_s: float
    step_s: float
    train_s: float
    checkpoint_s: float
    #: expected seconds lost to interruptions (preemptions and failures)
    interruption_s: float
    jct_s: float
    step_source: str
    queue_why: str = ""
    #: seconds of training between periodic checkpoints (inf: none; pipeswift_slurm.planning.interval)
    checkpoint_every_s: float = math.inf
    #: which bound decided that interval, with both ("" when the TOML gave one)
    checkpoint_why: str = ""
    #: expected interruptions over the run
    interruptions: float = 0.0
    #: the JCT's 10th / 50th / 90th percentiles (pipeswift_slurm.planning.risk)
    jct_p10_s: float | None = None
    jct_p50_s: float | None = None
    jct_p90_s: float | None = None
    #: the 90th percentile of the time on the nodes (setup, training, checkpoints, interruptions):
    #: what [job] time_policy = "predicted" asks Slurm for (pipeswift_slurm.planning.limits)
    run_p90_s: float | None = None
    #: nodes x the hours they are held (setup, training, checkpoints, interruptions; not the queue)
    node_hours: float = 0.0
    #: the step model's step time of this layout under its schedule: ``step_s`` itself unless a
    #: measured step replaced (or scaled) it; beside a measured one, what the model predicts
    #: without that measurement (:func:`_predicted_unmeasured`)
    model_step_s: float | None = None


@dataclass
class Candidate:
    """A layout the planner weighed: its estimate, or why it was rejected. The layout's fields
    (nodes, stages, data_parallel, micro_batches, boundaries, ...) read through."""
    layout: Layout
    estimate: Estimate | None = None
    rejected: str | None = None
    stage_memory: list[float] = field(default_factory=list)
    #: rejected only because the cluster as it is now would never start it (it may later)
    never_starts: bool = False
    #: the pipeline schedule it runs ([pipeline] schedule; "auto" resolved: :func:`_pick_schedules`)
    schedule: str = "1f1b"

    @property
    def est(self) -> Estimate:
        """The estimate of a candidate the planner kept (a rejected one has none)."""
        if self.estimate is None:
            raise ValueError(f"{self.layout.nodes} node(s): rejected ({self.rejected}), no estimate")
        return self.estimate

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "layout":
            raise AttributeError(name)
        return getattr(self.layout, name)

    def to_dict(self) -> dict[str, Any]:
        """The layout's fields flat, with the estimate, the rejection and the stage memory."""
        est = None if self.estimate is None else {
            k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(self.estimate).items()}
        return {**self.layout._asdict(), "estimate": est, "rejected": self.rejected,
                "stage_memory": list(self.stage_memory), "schedule": self.schedule}


@dataclass
class PastRuns:
    """What the planner needs from the history store (filled by the caller)."""
    step_times: dict[str, float] = field(default_factory=dict)     # config_key -> measured mean
    setup_s: float | None = None
    #: preemptions (the partition's) and failures (per node-hour) the job can expect
    interruptions: interval.Interruptions = field(default_factory=interval.Interruptions)
    waits: dict[int, float] = field(default_factory=dict)          # nodes -> median queue wait
    wait_samples: dict[int, list[float]] = field(default_factory=dict)   # nodes -> past waits
    setup_samples: list[float] = field(default_factory=list)      # this model's past setups
    step_vars: dict[str, float] = field(default_factory=dict)      # config_key -> per-step variance
    #: the step model's relative error measured on past jobs (None: too few to say)
    step_rel_sd: float | None = None


class PartitionChoice(NamedTuple):
    """One partition of [job] partition's list: its chosen layout's objective and node count
    (None: nothing can start there now, ``why``); ``usable``: the job is submitted to it."""
    name: str
    score_s: float | None
    nodes: int | None
    why: str | None
    usable: bool

    def line(self, objective: str) -> str:
        if self.score_s is None:
            return f"{self.name}: left out ({self.why})"
        return f"{self.name}: {_OBJECTIVE_NAMES[objective]} {duration(self.score_s)} on {self.nodes} node(s)"


@dataclass
class PlanResult:
    chosen: Candidate | None
    candidates: list[Candidate]
    profile_source: str
    calibration: Calibration
    notes: list[str]
    hardware: Hardware | None = None
    objective: str = "mean"
    #: what the checkpoint interval was chosen from (pipeswift_slurm.planning.interval)
    interruptions: interval.Interruptions = field(default_factory=interval.Interruptions)
    checkpoint_cost_s: float = 0.0
    #: why the chosen layout won (choose): the best objective, or the fewest node-hours near it
    choice: str = ""
    #: [job] partition's list, soonest-finishing first (autoplan.by_partition); empty for one
    partitions: list[PartitionChoice] = field(default_factory=list)
    #: the other usable partitions' own results (their layouts travel in plan.json)
    other_partitions: dict[str, "PlanResult"] = field(default_factory=dict)
    #: Slurm itself requeues a job preempted in this partition, with the request it was
    #: submitted with (PreemptMode=REQUEUE, Slurm 24.05 on): autoplan asks the live cluster
    requeued_as_submitted: bool = False

    def request_bottom(self, lo: int) -> int:
        """The fewest nodes the job asks Slurm for, from the range's bottom ``lo``: ``lo`` when
        the chosen layout starts now (Slurm gives it what is free up to its count); when it waits
        for its count, that count, unless Slurm requeues a preemption with the submitted request
        (``requeued_as_submitted``): an exact count then waits for as many nodes again after each
        preemption, so the request goes down to the fewest nodes whose objective is no worse than
        the chosen layout's with its queue wait paid once more."""
        ch = self.chosen
        if ch is None or ch.est.queue_s <= 0:
            return lo
        count = int(ch.nodes)
        if not self.requeued_as_submitted:
            return count
        worst = score(ch, self.objective) + ch.est.queue_s
        ok = [n for n, c in self.best_per_nodes().items() if lo <= n <= count and score(c, self.objective) <= worst]
        return min(ok, default=count)

    def partition_order(self) -> tuple[str, ...]:
        """The partitions the job is submitted to, soonest-finishing first (empty: one or none)."""
        return tuple(p.name for p in self.partitions if p.usable)

    def fits_nowhere(self) -> bool:
        """No layout passes the rules and the cost model (memory): not one that only the queue,
        as it is now, rules out (Slurm may still start that one later)."""
        return self.chosen is None and not any(c.never_starts for c in self.candidates)

    def best_per_nodes(self) -> dict[int, Candidate]:
        best: dict[int, Candidate] = {}
        for c in self.candidates:
            if c.rejected is None and (c.nodes not in best or score(c, self.objective) < score(best[c.nodes], self.objective)):
                best[c.nodes] = c
        return best

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen.to_dict() if self.chosen else None,
                "candidates": [c.to_dict() for c in self.candidates],
                "profile_source": self.profile_source, "calibration": self.calibration._asdict(),
                "notes": self.notes, "choice": self.choice,
                "partitions": [p._asdict() for p in self.partitions],
                "hardware": self.hardware._asdict() if self.hardware is not None else None}


def _layout(cfg: TrainConfig, profile: Profile, hw: Hardware, nodes: int, P: int,
            dp: int, mbs: int) -> tuple[Layout, str | None]:
    """The layout (nodes, P, DP) cut by the profile's costs (no stage's training state over the
    device memory), or why the rules refuse it."""
    r, part = cfg.resources, cfg.pipeline.partition
    layout = Layout(nodes, r.tasks_per_node, nodes * r.tasks_per_node, P, dp, 0, mbs, None, "cost")
    try:
        m = layouts.check(cfg, nodes, P, dp, len(profile.costs), mbs)
    except ConfigError as e:
        return layout, str(e)
    try:
        bounds, how = ((list(part), "explicit") if isinstance(part, tuple) else
                       (stage_cut(profile, P, dp, hw.device_memory), "cost"))
    except PartitionError as e:
        why = f"does not fit: {e}"
        if profile.param_bytes and max(profile.param_bytes) * state_factor(profile, dp) > 0:
            state = sum(profile.param_bytes) * state_factor(profile, dp)
            why = (f"does not fit: training state {state / 1e9:.2f} GB over {P} stage(s) x {dp} dp, "
                   f"device memory {hw.device_memory / 1e9:.2f} GB ({e}){_memory_fix(profile, dp)}")
        return layout._replace(micro_batches=m), why
    return layout._replace(micro_batches=m, boundaries=bounds, partition=how), None


def _candidates(cfg: TrainConfig, profile: Profile, hw: Hardware) -> list[Candidate]:
    """Every layout the TOML allows, each with its model step time or its rejection."""
    cands: list[Candidate] = []
    for nodes in cfg.resources.node_counts:
        pairs = layouts.splits(cfg, nodes)
        if not pairs:  # the TOML's stages / data_parallel do not fit these slots: its rule says why
            try:
                layouts.layout_for(cfg, nodes)
            except ConfigError as e:
                world = nodes * cfg.resources.tasks_per_node
                lay = Layout(nodes, cfg.resources.tasks_per_node, world, world, 1, 0,
                             cfg.training.micro_batch_size, None, "cost")
                cands.append(Candidate(lay, rejected=str(e)))
            continue
        for P, dp, mbs in ((P, dp, mbs) for P, dp in pairs for mbs in layouts.micro_batch_sizes(cfg, dp)):
            layout, why = _layout(cfg, profile, hw, nodes, P, dp, mbs)
            c = Candidate(layout, rejected=why, schedule="1f1b" if cfg.pipeline.schedule == "auto"
                          else cfg.pipeline.schedule)
            cands.append(c)
            if why is not None:
                continue
            est = estimate_step(profile, c.boundaries, c.micro_batches, c.micro_batch_size, dp,
                                c.tasks_per_node, hw, c.schedule)
            c.stage_memory = list(est.stage_memory)
            if not est.fits:
                s = max(range(P), key=lambda i: est.stage_memory[i])
                c.rejected = (f"stage {s} needs {est.stage_memory[s] / 1e9:.2f} GB > device memory "
                              f"{hw.device_memory / 1e9:.2f} GB{_memory_fix(profile, dp)}")
                continue
            c.estimate = Estimate(0, 0, est.step_s, 0, 0, 0, 0, "model", model_step_s=est.step_s)
    return cands


def _memory_fix(profile: Profile, dp: int) -> str:
    """What [training] settings would shrink a stage, for a rejection's message."""
    fixes = []
    if profile.zero_stage == 0 and dp > 1 and STATE_BYTES[(profile.precision, 0)][3] is False:
        fixes.append(f"zero_stage = 1 (optimizer state over the {dp} data-parallel ranks)")
    if profile.precision == "fp32":
        fixes.append('precision = "bf16"')
    if not profile.recompute_interval:
        fixes.append("activation_checkpoint_interval = 1 (recompute activations)")
    return f"; try [training] {' or '.join(fixes)}" if fixes else ""


def _measured_step(c: Candidate, schedule: str, history: PastRuns, step_key: Any) -> float | None:
    """The history's step time of candidate ``c``'s layout run under ``schedule``."""
    if step_key is None:
        return None
    was, c.schedule = c.schedule, schedule
    try:
        return history.step_times.get(step_key(c)) or None
    finally:
        c.schedule = was


def _measured(cands: list[Candidate], history: PastRuns, step_key: Any, schedules: tuple[str, ...]
              ) -> tuple[list[tuple[Candidate, float, str]], list[Measured]]:
    """The candidates the history measured under any of ``schedules``: (candidate, step time,
    schedule), and the same as calibration rows."""
    measured = [(c, got, s) for c in cands if c.estimate is not None for s in schedules
                if (got := _measured_step(c, s, history, step_key))]
    return measured, [(c.boundaries, c.micro_batches, c.micro_batch_size, c.data_parallel, c.tasks_per_node,
                       got, s) for c, got, s in measured]


def _calibrate(cands: list[Candidate], profile: Profile, hw: Hardware, history: PastRuns,
               step_key: Any, notes: list[str], schedules: tuple[str, ...]) -> Calibration:
    """Measured configs (under any of ``schedules``) replace their estimate, and the ratio
    measured / estimated (this host, this software, the profiling hooks' cost) scales every
    other candidate."""
    measured, rows = _measured(cands, history, step_key, schedules)
    if not measured:
        return Calibration()
    calibration = calibrate(profile, rows, hw)
    tuned, tuned_hw = _tuned(profile, hw, calibration)
    note = (f"calibrated by {len(measured)} measured config(s): measured / estimated step time = "
            f"{calibration.scale:.3f}, applied to the others")
    if 0 < calibration.oversubscribed < calibration.measured:
        note += (f"; {calibration.oversubscribed} with more ranks than cores: an oversubscribed "
                 f"host delivers {calibration.shared_efficiency:.0%} of ideal core sharing")
    notes.append(note)
    for c in cands:
        if c.estimate is not None:
            c.estimate.step_s = c.estimate.model_step_s = _modelled(tuned, tuned_hw, c, c.schedule).step_s
            c.estimate.step_source = "calibrated"
    for c, got, s in measured:
        if s == c.schedule:
            c.est.step_s, c.est.step_source = got, "measured"
    return calibration


#: measured configs up to which each one's model step is predicted without its own measurement
#: (:func:`_predicted_unmeasured`); beyond, one config moves the calibration's medians little
#: and the calibrated model's step is shown beside the measured one
LEAVE_ONE_OUT_MAX = 4


def _predicted_unmeasured(cands: list[Candidate], profile: Profile, hw: Hardware, history: PastRuns,
                          step_key: Any, schedules: tuple[str, ...]) -> None:
    """Each candidate whose step was measured gets the step the model predicts for it without
    that measurement (``model_step_s``: calibrated on the other measured configs, none: the
    profile as it is), to show beside the measured one."""
    measured, rows = _measured(cands, history, step_key, schedules)
    if len(measured) > LEAVE_ONE_OUT_MAX:
        return
    for i, (c, _, s) in enumerate(measured):
        if s == c.schedule and c.est.step_source == "measured":
            tuned, tuned_hw = _tuned(profile, hw, calibrate(profile, rows[:i] + rows[i + 1:], hw))
            c.est.model_step_s = _modelled(tuned, tuned_hw, c, s).step_s


def _tuned(profile: Profile, hw: Hardware, calibration: Calibration) -> tuple[Profile, Hardware]:
    """The profile and hardware as the calibration corrects them."""
    return profile.scaled(calibration.scale), hw._replace(shared_efficiency=calibration.shared_efficiency)


def _modelled(profile: Profile, hw: Hardware, c: Candidate, schedule: str) -> Any:
    return estimate_step(profile, c.boundaries, c.micro_batches, c.micro_batch_size, c.data_parallel,
                         c.tasks_per_node, hw, schedule)


#: the least share of the step ZB-H1's model must save to be chosen unmeasured: the model counts
#: what the split costs on CPU (costmodel.ZB_SPLIT_COST_CPU, a share of the passes), measured
#: within about 1 % of the step
ZB_MODEL_MIN_GAIN = 0.01


def _pick_schedules(cands: list[Candidate], profile: Profile, hw: Hardware, calibration: Calibration,
                    history: PastRuns, step_key: Any, notes: list[str]) -> None:
    """[pipeline] schedule = "auto": each candidate (planned under 1F1B) runs ZB-H1 where the
    history measured ZB-H1 on its layout faster than its 1F1B step (measured, else estimated),
    or, unmeasured, where the step model says ZB-H1 saves at least ZB_MODEL_MIN_GAIN of it
    (1F1B's step times the modelled ZB-H1 / 1F1B ratio) and its stages still fit; else 1F1B.
    The model's weight passes are the W shares a ZB-H1 run measured, or assumed (said so)."""
    tuned, tuned_hw = _tuned(profile, hw, calibration)
    by: dict[str, int] = {"measured": 0, "modelled": 0}
    for c in cands:
        if c.estimate is None:
            continue
        zb = _modelled(tuned, tuned_hw, c, "zb-h1")
        ratio = zb.step_s / (_modelled(tuned, tuned_hw, c, "1f1b").step_s or 1.0)
        seen = _measured_step(c, "zb-h1", history, step_key)
        if not zb.fits or (seen is None and ratio > 1 - ZB_MODEL_MIN_GAIN) or (seen or 0) >= c.est.step_s:
            continue
        how = "measured" if seen is not None else "modelled"
        c.schedule, c.stage_memory, by[how] = "zb-h1", list(zb.stage_memory), by[how] + 1
        c.est.model_step_s = zb.step_s
        c.est.step_s = seen if seen is not None else c.est.step_s * ratio
        c.est.step_source = ("measured" if seen is not None else   # a measured 1F1B step x the model's ratio
                             "model" if c.est.step_source == "model" else "calibrated")
    _, all_measured = profile.weight_fractions()
    w = ("the weight-gradient shares a ZB-H1 run measured" if all_measured else
         f"weight passes assumed {WEIGHT_FRACTION_ASSUMED:.0%} of each unmeasured layer's time "
         f"(run once with schedule = \"zb-h1\" to measure them)")
    notes.append(f'schedule "auto": ZB-H1 on {by["measured"] + by["modelled"]} layout(s) '
                 f'({by["measured"]} measured faster than 1F1B, {by["modelled"]} modelled at least '
                 f'{ZB_MODEL_MIN_GAIN:.0%} faster with {w}), 1F1B elsewhere')


def _wait(cfg: TrainConfig, c: Candidate, cluster: ClusterState | None, history: PastRuns,
          slurm_starts: dict[int, float | None] | None, hold_s: float = math.inf) -> WaitEstimate:
    """The candidate's queue wait: live cluster state (or past waits), or sbatch --test-only's.
    ``hold_s``: the time limit it would ask for (backfill may start it in a hole that long)."""
    w = (estimate_wait(cluster, c.nodes, c.tasks_per_node * cfg.resources.cpus_per_task,
                       cfg.job.partition, hold_s) if cluster is not None else
         WaitEstimate(history.waits.get(c.nodes, 0.0), 0, 0, "no live cluster state"))
    if slurm_starts is None or c.nodes not in slurm_starts or cluster is None:
        return w
    start = slurm_starts[c.nodes]
    if start is None:
        return WaitEstimate(math.inf, w.free_now, w.usable, "sbatch --test-only: cannot start")
    wait = max(0.0, start - cluster.now)
    return WaitEstimate(wait, w.free_now, w.usable, f"sbatch --test-only: starts in {duration(wait)}")


def asked_limit(cfg: TrainConfig, c: Candidate, setup_s: float, checkpoint_s: float) -> float:
    """The time limit the candidate would ask Slurm for, in seconds (inf: none): [job] time as
    written, or (time_policy "predicted") what pipeswift_slurm.planning.limits makes of its
    setup and training at the estimated step time. What backfill fits in a hole."""
    written = cfg.job.time_seconds
    if cfg.job.time_policy == "as_written":
        return math.inf if written is None else float(written)
    lead = limits.lead_wanted(checkpoint_s, c.est.step_s)
    held = setup_s + cfg.training.steps * c.est.step_s
    got = limits.predicted(written, held, setup_s, lead).time_s
    return math.inf if got is None else float(got)


def _band(cfg: TrainConfig, c: Candidate, history: PastRuns, live: bool, step_key: Any) -> None:
    """The candidate's JCT percentiles from its estimate and what the history knows."""
    t, e = cfg.training, c.est
    terms = risk.JctTerms(
        queue_s=e.queue_s, setup_s=e.setup_s, steps=t.steps, step_s=e.step_s,
        checkpoint_s=e.checkpoint_s, step_source=e.step_source,
        step_var=history.step_vars.get(step_key(c)) if step_key is not None else None,
        rel_sd=history.step_rel_sd if e.step_source != "measured" else None,
        queue_samples=() if live else history.wait_samples.get(c.nodes, ()),
        setup_samples=history.setup_samples,
        preemptions_per_s=history.interruptions.per_hour(c.nodes) / 3600,
        checkpoint_interval_s=0.0 if math.isinf(e.checkpoint_every_s) else e.checkpoint_every_s)
    e.jct_p10_s, e.jct_p50_s, e.jct_p90_s, e.run_p90_s = risk.jct_band(terms)


def score(c: Candidate, objective: str) -> float:
    """What the planner minimises for a feasible candidate ([job] objective)."""
    e = c.est
    got = {"mean": e.jct_s, "p50": e.jct_p50_s, "p90": e.jct_p90_s}[objective]
    return e.jct_s if got is None else got


_OBJECTIVE_NAMES = {"mean": "expected JCT", "p50": "median JCT", "p90": "90th-percentile JCT"}


def choose(ranked: list[Candidate], objective: str, slack: float) -> tuple[list[Candidate], str]:
    """The cost-aware choice over candidates in the objective's order: among those whose score
    is within ``slack`` (a fraction) of the best one's, the fewest node-hours (ties: the better
    score). The list with the chosen first, and why it won."""
    if not ranked:
        return ranked, ""
    best, what = ranked[0], _OBJECTIVE_NAMES[objective]
    limit = score(best, objective) * (1 + slack)
    near = [c for c in ranked if (objective == "mean" or getattr(c.est, f"jct_{objective}_s") is not None)
            and score(c, objective) <= limit]
    pick = min(near, key=lambda c: (c.est.node_hours, score(c, objective)))
    if pick is best or pick.est.node_hours >= best.est.node_hours:
        return ranked, (f"the best {what}" + (f"; no layout within {slack:.0%} of it holds fewer node-hours"
                                                 if slack > 0 else " ([job] jct_slack = 0)"))
    over = score(pick, objective) / score(best, objective) - 1 if score(best, objective) > 0 else 0.0
    why = (f"the fewest node-hours within [job] jct_slack = {slack:g} of the best {what}: "
           f"{pick.nodes} node(s), {pick.est.node_hours:.3g} node-h, {what} {duration(score(pick, objective))} "
           f"(+{over:.1%}) vs {best.nodes} node(s), {best.est.node_hours:.3g} node-h, "
           f"{duration(score(best, objective))}")
    return [pick, *(c for c in ranked if c is not pick)], why


#: candidates (best by mean JCT, plus each node count's best) that get a JCT band: sampling
#: every one of a worst-case config's hundreds would cost seconds at submit time
BANDED = 32


def _rank(cfg: TrainConfig, ok: list[Candidate], history: PastRuns, live: bool, step_key: Any) -> list[Candidate]:
    """Feasible candidates in the objective's order; the best by mean get their JCT bands."""
    ok = sorted(ok, key=lambda c: (c.est.jct_s, -c.nodes))
    firsts: dict[int, Candidate] = {}
    for c in ok:
        firsts.setdefault(c.nodes, c)
    top = {id(c) for c in ok[:BANDED]}
    banded = ok[:BANDED] + [c for c in firsts.values() if id(c) not in top]
    for c in banded:
        _band(cfg, c, history, live, step_key)
    if cfg.job.objective == "mean":
        return ok
    ranked = sorted(banded, key=lambda c: (score(c, cfg.job.objective), -c.nodes))
    done = {id(c) for c in banded}
    return ranked + [c for c in ok if id(c) not in done]


def _complete(cfg: TrainConfig, c: Candidate, w: WaitEstimate, setup: float, ckpt_s: float,
              history: PastRuns) -> None:
    """Fill the candidate's JCT terms around its step time."""
    t, e = cfg.training, c.est
    e.queue_s, e.queue_why = w.seconds, w.why
    e.setup_s = setup
    e.train_s = t.steps * e.step_s
    every = (None if t.checkpoint_interval == "auto" else
             int(t.checkpoint_interval) * e.step_s if t.checkpoint_interval else math.inf)
    x = interval.expected(e.train_s, ckpt_s, c.nodes, setup, w.seconds, history.interruptions, every,
                          t.checkpoint_io_share)
    e.checkpoint_every_s, e.interruptions, e.checkpoint_why = x.every_s, x.interruptions, x.why
    e.checkpoint_s = x.checkpoints * ckpt_s
    e.interruption_s = x.loss_s
    e.jct_s = e.queue_s + e.setup_s + e.train_s + e.checkpoint_s + e.interruption_s
    e.node_hours = c.nodes * (e.jct_s - e.queue_s) / 3600


def plan(cfg: TrainConfig, profile: Profile, hw: Hardware, cluster: ClusterState | None,
         history: PastRuns | None = None, step_key: Any = None,
         slurm_starts: dict[int, float | None] | None = None) -> PlanResult:
    """Rank all candidates by estimated JCT. ``step_key(candidate) -> config key`` links
    candidates to measured step times in ``history``."""
    history = history or PastRuns()
    notes: list[str] = []
    cands = _candidates(cfg, profile, hw)
    auto = cfg.pipeline.schedule == "auto"
    schedules = ("1f1b", "zb-h1") if auto else (cfg.pipeline.schedule,)
    calibration = _calibrate(cands, profile, hw, history, step_key, notes, schedules)
    if auto:
        _pick_schedules(cands, profile, hw, calibration, history, step_key, notes)
    _predicted_unmeasured(cands, profile, hw, history, step_key, schedules)
    ckpt_s = checkpoint_seconds(profile.param_bytes)
    setup = history.setup_s if history.setup_s is not None else DEFAULT_SETUP_S
    for c in cands:
        if c.estimate is None:
            continue
        w = _wait(cfg, c, cluster, history, slurm_starts, asked_limit(cfg, c, setup, ckpt_s))
        if math.isinf(w.seconds):
            c.rejected, c.estimate, c.never_starts = f"never starts: {w.why}", None, True
            continue
        _complete(cfg, c, w, setup, ckpt_s, history)
    ok = _rank(cfg, [c for c in cands if c.rejected is None], history, cluster is not None, step_key)
    ok, why = choose(ok, cfg.job.objective, cfg.job.jct_slack)
    bad = [c for c in cands if c.rejected is not None]
    return PlanResult(chosen=ok[0] if ok else None, candidates=ok + bad, choice=why,
                      profile_source=profile.source, calibration=calibration, notes=notes, hardware=hw,
                      objective=cfg.job.objective, interruptions=history.interruptions,
                      checkpoint_cost_s=ckpt_s)


def checkpoint_line(res: PlanResult, c: Candidate) -> str:
    """How often the chosen layout checkpoints, why, and what interruptions are expected to cost."""
    e, inter = c.est, res.interruptions
    every = "only on a signal and at the end" if math.isinf(e.checkpoint_every_s) else \
        f"every {duration(e.checkpoint_every_s)} of training (~{max(1, round(e.checkpoint_every_s / e.step_s))} steps)"
    if e.checkpoint_why:
        every += f" ({e.checkpoint_why})"
    mtbf = inter.mtbf_s(c.nodes)
    return (f"checkpoints: {every}; a checkpoint ~{duration(res.checkpoint_cost_s)}, an interruption every "
            f"{'never' if math.isinf(mtbf) else duration(mtbf)} on {c.nodes} node(s) ({inter.source}); "
            f"expected {e.interruptions:.2g} interruption(s) costing {duration(e.interruption_s)}")


def step_line(e: Estimate) -> str:
    """The step time the JCT counts and where it comes from; a measured one with the model's beside it."""
    line = f"{e.step_s:.4g} s/step, {e.step_source}"
    if e.step_source == "measured" and e.model_step_s is not None:
        line += f"; the model predicts {e.model_step_s:.4g} s ({e.model_step_s / e.step_s - 1:+.1%})"
    return line


def explain(res: PlanResult) -> str:
    """Why the winner won, with the numbers."""
    c = res.chosen
    if c is None:
        return "no feasible candidate: " + "; ".join(sorted({x.rejected or "" for x in res.candidates}))
    e = c.est
    lines = [f"chosen: {c.nodes} node(s), {c.stages} stage(s) x {c.data_parallel} dp, m={c.micro_batches} "
             f"x {c.micro_batch_size}, "
             f"boundaries {c.boundaries}: JCT {duration(e.jct_s)} = queue {duration(e.queue_s)} + setup {duration(e.setup_s)} "
             f"+ train {duration(e.train_s)} ({step_line(e)}) + checkpoints "
             f"{duration(e.checkpoint_s)} + interruptions {duration(e.interruption_s)}; {e.node_hours:.3g} node-h"
             + (f"; p10-p90 {duration(e.jct_p10_s)}-{duration(e.jct_p90_s)}, ranked by "
                f"{'the mean' if res.objective == 'mean' else res.objective}" if e.jct_p90_s is not None else "")]
    if res.partitions:
        lines.append("partitions, in the order Slurm is given them: "
                     + "; ".join(p.line(res.objective) for p in res.partitions))
    if res.choice:
        lines.append(f"why: {res.choice}")
    lines.append(checkpoint_line(res, c))
    if res.hardware is not None:
        lines.append(res.hardware.line())
    best = res.best_per_nodes()
    for n, o in sorted(best.items()):
        if n == c.nodes:
            continue
        oe = o.est
        d = oe.jct_s - e.jct_s
        lines.append(f"vs {n} node(s): JCT {duration(oe.jct_s)} ({'+' if d >= 0 else ''}{duration(d)}): "
                     f"queue {duration(oe.queue_s)} ({oe.queue_why}), train {duration(oe.train_s)}, "
                     f"{oe.node_hours:.3g} node-h")
    return "\n".join(lines)
