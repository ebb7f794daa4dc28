"""The JCT planner: estimate every candidate layout, then choose (pure: no I/O).

A candidate is (nodes, tasks per node, stages P, data-parallel DP, micro-batch size, m,
boundaries). Each gets an estimate: queue wait (live cluster state) + setup + training
(steps x step time from the cost model, calibrated by history) + checkpoints + expected
preemption loss = JCT; or a reason why it was rejected. The lowest JCT wins.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .config import TrainConfig
from .costmodel import Calibration, Hardware, Profile, calibrate, checkpoint_seconds, estimate_step
from .fmt import duration
from .partition import PartitionError, balanced_boundaries
from .plan import Layout
from .queue import ClusterState, WaitEstimate, estimate_wait

DEFAULT_SETUP_S = 30.0


@dataclass
class Estimate:
    queue_s: float
    setup_s: float
    step_s: float
    train_s: float
    checkpoint_s: float
    preemption_s: float
    jct_s: float
    step_source: str
    queue_why: str = ""


@dataclass
class Candidate:
    nodes: int
    tasks_per_node: int
    stages: int
    data_parallel: int
    micro_batches: int
    micro_batch_size: int
    boundaries: list[int] | None
    partition: str
    estimate: Estimate | None = None
    rejected: str | None = None
    stage_memory: list[float] = field(default_factory=list)

    def layout(self) -> Layout:
        """The layout plan.json records for this candidate."""
        return Layout(nodes=self.nodes, tasks_per_node=self.tasks_per_node,
                      world_size=self.nodes * self.tasks_per_node, stages=self.stages,
                      data_parallel=self.data_parallel, micro_batches=self.micro_batches,
                      micro_batch_size=self.micro_batch_size, boundaries=self.boundaries,
                      partition=self.partition)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.estimate is not None:
            d["estimate"] = {k: (None if isinstance(v, float) and math.isinf(v) else v)
                             for k, v in asdict(self.estimate).items()}
        return d


@dataclass
class PastRuns:
    """What the planner needs from the history store (filled by the caller)."""
    step_times: dict[str, float] = field(default_factory=dict)     # config_key -> measured mean
    setup_s: float | None = None
    preemptions_per_hour: float = 0.0
    waits: dict[int, float] = field(default_factory=dict)          # nodes -> median queue wait


@dataclass
class PlanResult:
    chosen: Candidate | None
    candidates: list[Candidate]
    profile_source: str
    calibration: Calibration
    notes: list[str]

    def best_per_nodes(self) -> dict[int, Candidate]:
        best: dict[int, Candidate] = {}
        for c in self.candidates:
            if c.rejected is None and (c.nodes not in best or c.estimate.jct_s < best[c.nodes].estimate.jct_s):
                best[c.nodes] = c
        return best

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen.to_dict() if self.chosen else None,
                "candidates": [c.to_dict() for c in self.candidates],
                "profile_source": self.profile_source, "calibration": asdict(self.calibration),
                "notes": self.notes}


def _splits(cfg: TrainConfig, world: int, n_layers: int) -> list[tuple[int, int, str | None]]:
    """(P, DP, rejection) pairs allowed by the TOML for ``world`` slots."""
    p = cfg.pipeline
    out = []
    small = [d for d in range(1, math.isqrt(world) + 1) if world % d == 0]
    for P in sorted({*small, *(world // d for d in small)}):
        dp = world // P
        if p.stages != "auto" and P != p.stages:
            continue
        if p.data_parallel is not None and dp != p.data_parallel:
            continue
        out.append((P, dp, f"{P} stages > {n_layers} layers" if P > n_layers else None))
    if not out:
        out.append((int(p.stages) if p.stages != "auto" else world, 1,
                    f"stages {p.stages} x data_parallel {p.data_parallel} does not fit {world} slots"))
    return out


def plan(cfg: TrainConfig, profile: Profile, hw: Hardware, cluster: ClusterState | None,
         history: PastRuns | None = None, step_key: Any = None,
         slurm_starts: dict[int, float | None] | None = None) -> PlanResult:
    """Rank all candidates by estimated JCT. ``step_key(candidate) -> config key`` links
    candidates to measured step times in ``history``."""
    history = history or PastRuns()
    t, r = cfg.training, cfg.resources
    n_layers = len(profile.costs)
    notes: list[str] = []
    cands: list[Candidate] = []
    cap = hw.device_memory / 4 if profile.param_bytes else None  # weights x 4 (grads, Adam)
    for nodes in r.node_counts:
        world = nodes * r.tasks_per_node
        for P, dp, why in _splits(cfg, world, n_layers):
            mbs = t.micro_batch_size
            m = t.global_batch_size // (mbs * dp) if t.global_batch_size % (mbs * dp) == 0 else 0
            if cfg.pipeline.micro_batches != "auto" and m != cfg.pipeline.micro_batches:
                why = why or (f"micro_batch_size {mbs} x micro_batches {cfg.pipeline.micro_batches} x dp {dp}"
                              f" != global batch {t.global_batch_size}")
            if m == 0:
                why = why or f"global batch {t.global_batch_size} not divisible by {mbs} x dp {dp}"
            c = Candidate(nodes, r.tasks_per_node, P, dp, max(m, 0), mbs, None, "cost")
            if why is None:
                part = cfg.pipeline.partition
                try:
                    if isinstance(part, tuple):
                        if len(part) - 1 != P:
                            raise PartitionError(f"explicit boundaries have {len(part) - 1} stages, not {P}")
                        c.boundaries, c.partition = list(part), "explicit"
                    else:
                        c.boundaries = balanced_boundaries(profile.costs, P, profile.param_bytes, cap)
                except PartitionError as e:
                    why = f"does not fit: {e}"
            if why is not None:
                c.rejected = why
                cands.append(c)
                continue
            est = estimate_step(profile, c.boundaries, m, mbs, dp, r.tasks_per_node, hw)
            c.stage_memory = list(est.stage_memory)
            if not est.fits:
                s = max(range(P), key=lambda i: est.stage_memory[i])
                c.rejected = (f"stage {s} needs {est.stage_memory[s] / 1e9:.2f} GB > device memory "
                              f"{hw.device_memory / 1e9:.2f} GB")
                cands.append(c)
                continue
            c.estimate = Estimate(0, 0, est.step_s, 0, 0, 0, 0, "model")
            cands.append(c)

    # calibration: measured configs replace their estimate, and the ratio measured / estimated
    # (this host, this software, the profiling hooks' cost) scales every other candidate
    measured = []
    for c in cands:
        if c.estimate is not None and step_key is not None:
            got = history.step_times.get(step_key(c))
            if got:
                measured.append((c, got))
    calibration = Calibration()
    if measured:
        calibration = calibrate(profile, [(c.boundaries, c.micro_batches, c.micro_batch_size,
                                           c.data_parallel, c.tasks_per_node, got)
                                          for c, got in measured], hw)
        tuned = profile.scaled(calibration.scale)
        tuned_hw = replace(hw, shared_efficiency=calibration.shared_efficiency)
        note = (f"calibrated by {len(measured)} measured config(s): measured / estimated step time = "
                f"{calibration.scale:.3f}, applied to the others")
        if 0 < calibration.oversubscribed < calibration.measured:
            note += (f"; {calibration.oversubscribed} with more ranks than cores: an oversubscribed "
                     f"host delivers {calibration.shared_efficiency:.0%} of ideal core sharing")
        notes.append(note)
        for c in cands:
            if c.estimate is not None:
                c.estimate.step_s = estimate_step(tuned, c.boundaries, c.micro_batches, c.micro_batch_size,
                                                  c.data_parallel, c.tasks_per_node, tuned_hw).step_s
                c.estimate.step_source = "calibrated"
        for c, got in measured:
            c.estimate.step_s, c.estimate.step_source = got, "measured"
    ckpt_s = checkpoint_seconds(profile.param_bytes)
    n_ckpt = (t.steps // t.checkpoint_interval if t.checkpoint_interval else 0) + 1
    setup = history.setup_s if history.setup_s is not None else DEFAULT_SETUP_S
    for c in cands:
        e = c.estimate
        if e is None:
            continue
        w = (estimate_wait(cluster, c.nodes, c.tasks_per_node * cfg.resources.cpus_per_task,
                           cfg.job.partition) if cluster is not None else
             WaitEstimate(history.waits.get(c.nodes, 0.0), 0, 0, "no live cluster state"))
        if slurm_starts is not None and c.nodes in slurm_starts and cluster is not None:
            start = slurm_starts[c.nodes]
            w = (WaitEstimate(math.inf, w.free_now, w.usable, "sbatch --test-only: cannot start")
                 if start is None else
                 WaitEstimate(max(0.0, start - cluster.now), w.free_now, w.usable,
                              f"sbatch --test-only: starts in {duration(max(0.0, start - cluster.now))}"))
        if math.isinf(w.seconds):
            c.rejected, c.estimate = f"never starts: {w.why}", None
            continue
        e.queue_s, e.queue_why = w.seconds, w.why
        e.setup_s = setup
        e.train_s = t.steps * e.step_s
        e.checkpoint_s = n_ckpt * ckpt_s
        # each preemption loses half a checkpoint interval of work (or the whole run without
        # periodic checkpoints: signals save it) plus a restart's setup
        lost_per = setup + (t.checkpoint_interval * e.step_s / 2 if t.checkpoint_interval else 0.0)
        e.preemption_s = history.preemptions_per_hour * (e.train_s / 3600) * lost_per
        e.jct_s = e.queue_s + e.setup_s + e.train_s + e.checkpoint_s + e.preemption_s
    ok = sorted((c for c in cands if c.rejected is None), key=lambda c: (c.estimate.jct_s, -c.nodes))
    bad = [c for c in cands if c.rejected is not None]
    return PlanResult(chosen=ok[0] if ok else None, candidates=ok + bad,
                      profile_source=profile.source, calibration=calibration, notes=notes)


def explain(res: PlanResult) -> str:
    """Why the winner won, with the numbers."""
    c = res.chosen
    if c is None:
        return "no feasible candidate: " + "; ".join(sorted({x.rejected or "" for x in res.candidates}))
    e = c.estimate
    lines = [f"chosen: {c.nodes} node(s), {c.stages} stage(s) x {c.data_parallel} dp, m={c.micro_batches}, "
             f"boundaries {c.boundaries}: JCT {duration(e.jct_s)} = queue {duration(e.queue_s)} + setup {duration(e.setup_s)} "
             f"+ train {duration(e.train_s)} ({e.step_s:.4g} s/step, {e.step_source}) + checkpoints "
             f"{duration(e.checkpoint_s)} + preemption {duration(e.preemption_s)}"]
    best = res.best_per_nodes()
    for n, o in sorted(best.items()):
        if n == c.nodes:
            continue
        d = o.estimate.jct_s - e.jct_s
        lines.append(f"vs {n} node(s): JCT {duration(o.estimate.jct_s)} ({'+' if d >= 0 else ''}{duration(d)}): "
                     f"queue {duration(o.estimate.queue_s)} ({o.estimate.queue_why}), train {duration(o.estimate.train_s)}")
    return "\n".join(lines)
