"""Feed the pure planner: profile (history, else TOML hints), hardware, live cluster, past runs.

Everything that can fail here degrades with a warning: no Slurm -> no live queue estimate; a
missing or corrupt history DB -> TOML hints and defaults; no per-layer costs at all -> the
simple layout rule of :mod:`plan` (one stage per slot / data_parallel).
"""

from __future__ import annotations

# Imports inside functions: the history's run-directory reader and the plan, only when the planner
# reads a measured profile

import math
import os
from pathlib import Path
from typing import Any, Callable

from pipeswift_slurm import runfiles
from pipeswift_slurm.history import store as hist_mod
from pipeswift_slurm.planning import interval
from pipeswift_slurm.history import rows as runrows
from pipeswift_slurm.slurm import client as slurm
from pipeswift_slurm.config import TrainConfig
from pipeswift_slurm.planning.costmodel import DEFAULT_DEVICE_MEMORY, Hardware, Profile, every_known
from pipeswift_slurm.errors import ConfigError, PswiftError
from pipeswift_slurm.planning.risk import step_rel_sd
from pipeswift_slurm.planning.planner import Candidate, PartitionChoice, PastRuns, PlanResult, plan, score
from pipeswift_slurm.slurm.cluster import (MIN_SHARES, ClusterState, PendingJob, RunningJob, RuntimeShares, expected_ends,
                                         partition_problem)
from pipeswift_slurm.durations import duration
from pipeswift_slurm.stats import median, median_of

Warn = Callable[[str], None]


def _model_key(cfg: TrainConfig) -> str:
    """This user's key of the model (profiles are per user: another's cannot steer this plan)."""
    model = {"entry": cfg.model.entry, "kwargs": cfg.model.kwargs, "num_layers": cfg.layer_count}
    return runrows.model_key(model, runrows.current_user())


def load_profile(cfg: TrainConfig, h: hist_mod.History | None) -> Profile | None:
    """Per-layer costs (the history's profile, else the TOML's) with how the job trains."""
    got = _layer_costs(cfg, h)
    t = cfg.training
    return None if got is None else got._replace(precision=t.precision, zero_stage=t.zero_stage,
                                                 recompute_interval=t.activation_checkpoint_interval)


def read_profile(cfg: TrainConfig, db: Path | str | None, warn: Warn) -> Profile | None:
    """:func:`load_profile` for a read-only command: no database is made where there is none."""
    h = hist_mod.safe_open(db, warn, create=False)
    try:
        return load_profile(cfg, h)
    finally:
        if h is not None:
            h.close()


def _layer_costs(cfg: TrainConfig, h: hist_mod.History | None) -> Profile | None:
    if h is not None:
        got = h.layer_profile(_model_key(cfg))
        n = cfg.layer_count
        if got is not None and (n is None or len(got[1]) == n):
            mbs, secs, params, acts, saved, weight = got
            over = h.pipe_overheads(_model_key(cfg), mbs) or {}
            return Profile(tuple(secs), tuple(params) if any(params) else None,
                           tuple(acts) if any(acts) else None, mbs, "history",
                           overhead_s=over.get("overhead_s", 0.0),
                           last_stage_overhead_s=over.get("last_stage_overhead_s", 0.0),
                           send_s=over.get("send_s", 0.0), step_overhead_s=over.get("step_overhead_s"),
                           saved_bytes=every_known(saved), weight_fraction=tuple(weight))
    if cfg.model.layer_costs is not None:
        return Profile(cfg.model.layer_costs, cfg.model.layer_memory, None,
                       cfg.training.micro_batch_size, "toml")
    return None


def hardware(cfg: TrainConfig, cluster: ClusterState | None, h: hist_mod.History | None = None) -> Hardware:
    """The hardware the estimate assumes: the links and device memory this user's recent
    launches on the partition measured (pipeswift_launch.probe), else the defaults;
    PSWIFT_DEVICE_MEMORY overrides the memory. CPU: the cores of a host and the ranks that
    share it as those launches found them (virtual nodes on one machine: Slurm's CPU count of a
    node says nothing of it), else Slurm's CPUs of a node; PSWIFT_HOST_CORES and
    PSWIFT_RANKS_PER_HOST override."""
    r = cfg.resources
    got = h.measured_hardware(cfg.job.partition, r.device, runrows.current_user()) if h is not None else None
    links: dict[str, float] = {}
    if got is not None and got.p2p_latency_s is not None:
        links["p2p_latency"] = got.p2p_latency_s
    if got is not None and got.p2p_bandwidth is not None:
        links["p2p_bandwidth"] = got.p2p_bandwidth
    mem = (float(os.environ.get("PSWIFT_DEVICE_MEMORY", 0))
           or (got.device_memory if got is not None and got.device_memory else DEFAULT_DEVICE_MEMORY[r.device]))
    cores = sharing = None
    if r.device == "cpu":
        cores = int(os.environ.get("PSWIFT_HOST_CORES", 0)) or (got.host_cores if got is not None else None)
        if cores is None and cluster is not None:
            part = [n for n in cluster.nodes if cfg.job.partition is None or cfg.job.partition in n.partitions]
            cores = min((n.cpus for n in part), default=None)
        sharing = int(os.environ.get("PSWIFT_RANKS_PER_HOST", 0)) or (
            got.nodes_per_host * r.tasks_per_node if got is not None and got.nodes_per_host else None)
    return Hardware(device=r.device, device_memory=mem, host_cores=cores, ranks_per_host=sharing,
                    threads_per_rank=r.cpus_per_task, measured=got.launches if got is not None else 0,
                    **links)


def past_runs(cfg: TrainConfig, h: hist_mod.History | None) -> PastRuns:
    if h is None:
        return PastRuns()
    mkey = _model_key(cfg)
    measured = h.config_step_times(mkey)
    setups = h.setup_times(mkey)
    samples = {n: w for n in cfg.resources.node_counts if (w := h.partition_waits(cfg.job.partition, n))}
    errors = [(e["predicted_step_s"], e["actual_step_s"]) for e in h.recent_errors(user=runrows.current_user())]
    return PastRuns(step_times={k: v["mean"] for k, v in measured.items()},
                    step_vars={k: v["var"] for k, v in measured.items()},
                    setup_s=median(setups) if setups else None, setup_samples=setups,
                    waits={n: median_of(w) for n, w in samples.items() if w}, wait_samples=samples,
                    interruptions=interval.smoothed(*h.failures(cfg.job.partition, user=runrows.current_user()),
                                                    h.preemptions_per_hour(cfg.job.partition)),
                    step_rel_sd=step_rel_sd(errors))


def runtime_shares(cluster: ClusterState, h: hist_mod.History) -> RuntimeShares:
    """What the history knows of how long the running and pending jobs will hold their nodes:
    the share of their limit jobs of each user and partition really ran, and this user's pswift
    jobs' predictions (their plan.json: the predicted time on the nodes; a running one's end is
    its attempt's start + that)."""
    jobs: list[RunningJob | PendingJob] = [*cluster.running, *cluster.pending]
    parts = sorted({j.partition for j in jobs if j.partition})
    by_user, by_part = h.limit_shares(parts, MIN_SHARES) if parts else ({}, {})
    names = {uid: runrows.user_name(uid) for uid in {j.user_id for j in jobs} if uid is not None}
    by_job = {j.job_id: by_user[names[j.user_id]] for j in jobs
              if j.user_id is not None and names[j.user_id] in by_user}
    ends, holds = {}, {}
    for j in cluster.running:
        if j.user_id == os.getuid() and j.start_time is not None:
            held = _predicted_hold(j.job_id)
            if held is not None:
                ends[j.job_id] = j.start_time + held
    for p in cluster.pending:
        if p.user_id == os.getuid() and (held := _predicted_hold(p.job_id)) is not None:
            holds[p.job_id] = held
    return RuntimeShares(by_job, by_part, ends, holds)


def _predicted_hold(job_id: str) -> float | None:
    """Seconds the pswift job ``job_id`` (registered by this user) is predicted to hold its nodes."""
    from pipeswift_slurm.history.rundir import lookup_job
    from pipeswift_slurm.plan import read_plan
    run = lookup_job(job_id)
    if run is None:
        return None
    try:
        pred = read_plan(run / runfiles.PLAN).get("prediction") or {}
    except (PswiftError, OSError):
        return None
    jct, queue = pred.get("jct_s"), pred.get("queue_s")
    return float(jct) - float(queue or 0.0) if isinstance(jct, (int, float)) else None


def step_key_for(cfg: TrainConfig) -> Callable[[Candidate], str]:
    mkey = _model_key(cfg)

    def key(c: Candidate) -> str:
        return runrows.config_key(mkey, {"nodes": c.nodes, "tasks_per_node": c.tasks_per_node,
                                          "stages": c.stages, "data_parallel": c.data_parallel,
                                          "micro_batches": c.micro_batches,
                                          "micro_batch_size": c.micro_batch_size,
                                          "boundaries": c.boundaries}, c.schedule)
    return key


def make_plan(cfg: TrainConfig, db: Path | str | None, live: bool, warn: Warn,
              test_only: bool = False, learn: bool = True) -> tuple[PlanResult | None, list[dict[str, Any]]]:
    """The planner's result (None without any per-layer costs) and the model's recent errors.
    ``learn``: first ingest the runs that ended since (a submission); a read-only command (plan,
    a dry run) writes nothing and makes no database."""
    h = hist_mod.safe_open(db, warn, create=learn)
    errors: list[dict[str, Any]] = []
    try:
        if h is not None:
            try:
                if learn:
                    h.ingest_registered(measured_only=True)  # what ran since: the planner learns
                errors = h.recent_errors(user=runrows.current_user())
            except (PswiftError, OSError, ValueError) as e:
                warn(f"warning: could not ingest finished runs ({e}); using the history as it is")
        cluster = None
        if live:
            try:
                cluster = slurm.cluster_state()
            except PswiftError as e:
                warn(f"warning: no live cluster state (Slurm: {slurm.brief(e)}); queue waits from history")
            if cluster is not None and h is not None:
                cluster = expected_ends(cluster, runtime_shares(cluster, h))
        # a job that can never run is refused whether or not there is anything to plan with
        usable = _usable_partitions(cfg, cluster)
        profile = load_profile(cfg, h)
        if profile is None:
            warn("warning: no per-layer costs (no [model] layer_costs and no profile in the "
                 "history): using one stage per task slot; run the job once to profile it")
            return None, errors
        if len(cfg.job.partitions) <= 1:
            return _plan_in(cfg, profile, h, cluster, test_only, warn), errors
        return by_partition(cfg, usable, lambda c: _plan_in(c, profile, h, cluster, test_only, warn)), errors
    finally:
        if h is not None:
            h.close()


def _usable_partitions(cfg: TrainConfig, cluster: ClusterState | None) -> dict[str, str | None]:
    """[job] partition's names, each with why the job can never run there (None: it can).
    ConfigError when that is every one of them."""
    fewest = min(cfg.resources.node_counts)
    why = {p: None if cluster is None else partition_problem(cluster, p, fewest) for p in cfg.job.partitions}
    if why and all(why.values()):
        raise ConfigError("; ".join(str(w) for w in why.values()))
    return why


def planned_in(cfg: TrainConfig, name: str) -> TrainConfig:
    """``cfg`` planned for partition ``name`` alone."""
    return cfg._replace(job=cfg.job._replace(partition=name))


def by_partition(cfg: TrainConfig, usable: dict[str, str | None],
                 plan_in: Callable[[TrainConfig], PlanResult]) -> PlanResult:
    """Each usable partition planned alone; the result of the one whose chosen layout finishes
    soonest (by [job] objective; ties: the TOML's order), with every partition in the order
    Slurm is given them (it starts the job in whichever can first, the first preferred)."""
    scored: list[tuple[float, int, PartitionChoice, PlanResult | None]] = []
    for i, (name, why) in enumerate(usable.items()):
        res = plan_in(planned_in(cfg, name)) if why is None else None
        if res is not None and res.chosen is not None:
            s = score(res.chosen, res.objective)
            scored.append((s, i, PartitionChoice(name, s, res.chosen.nodes, None, True), res))
        else:
            fits = res is not None and not res.fits_nowhere()
            reason = why or ("no layout can start now" if fits else "no layout fits")
            scored.append((math.inf, i, PartitionChoice(name, None, None, reason, fits), res))
    scored.sort(key=lambda x: (x[0], x[1]))
    kept = [(p, r) for _, _, p, r in scored if p.usable and r is not None]
    # none usable (no layout fits in any): the first planned partition's result says why
    best = kept[0][1] if kept else next(r for _, _, _, r in scored if r is not None)
    best.partitions = [p for _, _, p, _ in scored]
    best.other_partitions = {p.name: r for p, r in kept[1:]}
    return best


def _plan_in(cfg: TrainConfig, profile: Profile, h: hist_mod.History | None, cluster: ClusterState | None,
             test_only: bool, warn: Warn) -> PlanResult:
    """The planner's result for cfg's one partition (``test_only``: Slurm's start estimates)."""
    starts: dict[int, float | None] | None = None
    if test_only and cluster is not None:
        r = cfg.resources
        starts = {}
        for n in r.node_counts:
            try:
                starts[n] = slurm.test_only_start(n, r.tasks_per_node * r.cpus_per_task,
                                                  cfg.job.partition, cfg.job.time)
            except PswiftError as e:
                warn(f"warning: sbatch --test-only failed ({e}); using the backfill estimate")
                starts = None
                break
    res = plan(cfg, profile, hardware(cfg, cluster, h), cluster, past_runs(cfg, h), step_key_for(cfg), starts)
    _hedge_for_requeues(cfg, res, cluster, warn)
    return res


def _hedge_for_requeues(cfg: TrainConfig, res: PlanResult, cluster: ClusterState | None, warn: Warn) -> None:
    """A chosen layout that waits for its node count, in a partition whose preemptions Slurm
    requeues with the submitted request: mark the result so (PlanResult.request_bottom) and say
    what the request becomes. One Slurm question (cached), asked only then."""
    r, ch = cfg.resources, res.chosen
    if cluster is None or ch is None or ch.est.queue_s <= 0 or r.nodes_min == r.nodes_max:
        return
    try:
        res.requeued_as_submitted = slurm.requeues_as_submitted(cfg.job.partition)
    except PswiftError as e:
        warn(f"warning: cannot tell how Slurm requeues a preempted job here ({slurm.brief(e)}); asking for exactly "
             f"{ch.nodes} node(s)")
        return
    bottom = res.request_bottom(r.nodes_min)
    if bottom < ch.nodes:
        res.notes.append(f"asks for {bottom}-{ch.nodes} node(s), not exactly {ch.nodes}: Slurm requeues a job "
                         f"preempted in this partition with the request it was submitted with, and "
                         f"{bottom} node(s) finish no later than {ch.nodes} would after its queue wait "
                         f"({duration(ch.est.queue_s)}) once more")
