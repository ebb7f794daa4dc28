"""Step time and memory of a pipeline layout, from per-layer costs (pure functions).

step = 1F1B makespan from the schedule simulator (bottleneck stage x (m + P - 1) for balanced
stages, plus point-to-point activation transfers) + data-parallel gradient all-reduce + the
fixed per-step work (optimizer step, gradient bookkeeping, loss broadcast), times a
CPU-contention factor when more ranks than cores share a host. Stage times are the layers'
forward+backward plus what the engine spends per micro-batch outside them: the launcher times
each DeepSpeed pipeline instruction, and :func:`overheads_from_instructions` turns that into a
per-stage overhead, the last stage's extra (the loss), the cost of one send, and the per-step
work, so that one profiled layout predicts the others (a single stage pays no sends).
Memory per stage = weights + gradients + fp32 master weights and Adam state (at the training's
precision, sharded over the data-parallel ranks where DeepSpeed shards them: :func:`state_factor`)
+ activations of the micro-batches in flight (with activation checkpointing: one per chunk of
layers, plus one chunk's during its recomputation, which costs the forward once more), against
the device memory. Calibrated by history: a measured config's step time
replaces the estimate, and the ratio measured / estimated of the measured configs scales the
others (:func:`calibrate`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from pipeswift_slurm.planning.partition import balanced_boundaries
from pipeswift_slurm.planning.simulate import SimResult, closed_form_1f1b, simulate, simulate_shared, stage_times
from pipeswift_slurm.stats import median_of

#: bytes per parameter byte held by training: weights + gradients + Adam's two moments (fp32)
TRAIN_STATE_FACTOR = 4
#: bytes per parameter on one rank, by (precision, ZeRO stage): (weights, gradients, fp32 master
#: weights + Adam's two moments, whether DeepSpeed shards the last over data-parallel ranks).
#: fp32 ZeRO-0 steps the weights themselves; ZeRO-1 keeps a separate fp32 partition; the bf16
#: optimizer partitions its fp32 state even at ZeRO-0 and, at ZeRO-1, accumulates gradients in
#: fp32 (pipeswift_launch/train.py) beside the bf16 ones the pipeline engine keeps (2 + 4, seen
#: by gpu-check); fp16 without ZeRO keeps a full fp32 copy. What the optimizers hold beyond
#: this: optimizer_extra_bytes (the stage cut's memory cap does not count it yet).
STATE_BYTES = {("fp32", 0): (4, 4, 8, False), ("fp32", 1): (4, 4, 12, True),
               ("bf16", 0): (2, 2, 12, True), ("bf16", 1): (2, 6, 12, True),
               ("fp16", 0): (2, 2, 12, False), ("fp16", 1): (2, 2, 12, True)}
#: stage x micro-batch operations simulated exactly while planning (about 10 ms); larger
#: pipelines use the 1F1B closed form, so planning any valid config stays well under a second
SIMULATED_OPS_MAX = 2048


#: DeepSpeed's ZeRO reduce_bucket_size (elements): see zero_bucket_elements
ZERO_BUCKET_ELEMENTS = 500_000_000
#: the share of a layer's forward + backward that is its weight gradient W where no ZB-H1 run
#: measured it: a third when F = B = W (the zero-bubble paper's transformer layer), about 0.27
#: measured on the example on CPU; a quarter, so that ZB-H1 is not chosen on a hopeful guess
WEIGHT_FRACTION_ASSUMED = 0.25
#: bytes per task slot assumed when neither PSWIFT_DEVICE_MEMORY nor plan.json says
DEFAULT_DEVICE_MEMORY = {"cuda": 80e9, "cpu": 16e9}


class Hardware(NamedTuple):
    device: str = "cpu"
    device_memory: float = 16e9          # bytes per task slot
    p2p_bandwidth: float = 1e9           # bytes/s between adjacent stages
    p2p_latency: float = 50e-6           # seconds per transfer
    allreduce_bandwidth: float = 1e9     # bytes/s per rank in a ring all-reduce
    optimizer_bandwidth: float = 2e9     # bytes/s of optimizer state streamed in the step
    host_cores: int | None = None        # CPU: cores the ranks of one host share
    ranks_per_host: int | None = None    # CPU: ranks placed on one host (default tasks/node)
    threads_per_rank: int = 1
    #: CPU: fraction of ideal processor sharing an oversubscribed host delivers (context
    #: switches, wake-up delays on every hand-off); divides the step's shared makespan;
    #: 1.0 = ideal, calibrated from measured oversubscribed runs
    shared_efficiency: float = 1.0
    #: how many recent launches the links and device memory were measured from (0: assumed)
    measured: int = 0

    def crowded(self, ranks: int) -> bool:
        """Do ``ranks`` busy CPU ranks (x their threads) on one host outnumber its cores?"""
        return bool(self.device == "cpu" and self.host_cores and ranks * self.threads_per_rank > self.host_cores)

    def line(self) -> str:
        """The links and memory the estimate assumes, and where they come from."""
        where = f"measured by {self.measured} recent launch(es)" if self.measured else "assumed"
        ranks = self.ranks_per_host or 0
        shared = (f"; up to {ranks} ranks x {self.threads_per_rank} thread(s) share a host's {self.host_cores} cores"
                  if self.crowded(ranks) else "")
        return (f"hardware: links {self.p2p_latency * 1e6:.0f} us + {self.p2p_bandwidth / 1e9:.2f} GB/s between "
                f"stages, {self.device_memory / 1e9:.2f} GB per {self.device} rank ({where}){shared}")


def every_known(values: Sequence[int | None]) -> tuple[int, ...] | None:
    """Per-layer byte counts as a Profile holds them: all of them, or None when any is unknown."""
    known = tuple(int(v) for v in values if v is not None)
    return known if len(known) == len(values) else None


class Profile(NamedTuple):
    """Per-layer forward+backward seconds per micro-batch of ``micro_batch_size`` on one device.

    Layer costs scale with the micro-batch size of a candidate; the engine's overheads below
    are per micro-batch or per step, whatever their size."""
    costs: tuple[float, ...]
    param_bytes: tuple[int, ...] | None = None
    activation_bytes: tuple[int, ...] | None = None
    micro_batch_size: int = 1
    source: str = "toml"
    #: seconds per micro-batch per stage outside the layers (engine dispatch, data loading)
    overhead_s: float = 0.0
    #: extra seconds per micro-batch on the last stage (the loss and its backward)
    last_stage_overhead_s: float = 0.0
    #: seconds the sending stage spends on one point-to-point send (activation or gradient)
    send_s: float = 0.0
    #: seconds per step outside the micro-batches (optimizer step, gradient bookkeeping, loss
    #: broadcast); None: estimated from the optimizer state and ``Hardware.optimizer_bandwidth``
    step_overhead_s: float | None = None
    #: how the job trains ([training] precision, zero_stage, activation_checkpoint_interval);
    #: ``param_bytes`` are fp32 bytes (4 a parameter) whatever the precision
    precision: str = "fp32"
    zero_stage: int = 0
    recompute_interval: int = 0
    #: bytes each layer keeps for its backward per micro-batch (autograd's saved tensors,
    #: parameters left out), measured by the launcher; None: estimated from layer outputs
    saved_bytes: tuple[int, ...] | None = None
    #: the share of each layer's seconds that is its weight-gradient pass W, as a ZB-H1 run
    #: measured it (None where no run did: :data:`WEIGHT_FRACTION_ASSUMED`)
    weight_fraction: tuple[float | None, ...] | None = None

    def weight_fractions(self) -> tuple[list[float], bool]:
        """Each layer's W share of its seconds, and whether all of them were measured."""
        known = self.weight_fraction or ()
        got = [known[i] if i < len(known) and known[i] is not None else None for i in range(len(self.costs))]
        return [WEIGHT_FRACTION_ASSUMED if f is None else float(f) for f in got], None not in got

    def scaled(self, factor: float) -> "Profile":
        """Every time in the profile times ``factor`` (a calibration: this host runs slower)."""
        return self._replace(costs=tuple(c * factor for c in self.costs),
                       overhead_s=self.overhead_s * factor,
                       last_stage_overhead_s=self.last_stage_overhead_s * factor,
                       send_s=self.send_s * factor,
                       step_overhead_s=None if self.step_overhead_s is None else self.step_overhead_s * factor)


class StepEstimate(NamedTuple):
    step_s: float
    compute_s: float
    p2p_s: float
    allreduce_s: float
    optimizer_s: float
    contention: float
    bubble_ratio: float
    stage_memory: tuple[float, ...]
    fits: bool


def state_factor(profile: Profile, data_parallel: int) -> float:
    """Training state on one rank per fp32 parameter byte (4 for fp32 without ZeRO)."""
    weights, grads, rest, sharded = STATE_BYTES[(profile.precision, profile.zero_stage)]
    return (weights + grads + rest / (data_parallel if sharded else 1)) / 4


def zero_bucket_elements(stage_elements: int) -> int:
    """The gradient bucket of DeepSpeed's ZeRO optimizer (fp16 and fp32 with zero_stage >= 1)
    pswift asks for: DeepSpeed's default, no larger than the stage's parameters. A stage smaller
    than the default fills one bucket either way, and DeepSpeed allocates the whole bucket twice
    on the device: 2 GB for fp16 whatever the model's size (gpu-check: a 1M-parameter stage
    peaked at 2082 MB)."""
    return max(1, min(ZERO_BUCKET_ELEMENTS, int(stage_elements)))


def optimizer_extra_bytes(profile: Profile, stage_param_bytes: float, data_parallel: int, device: str) -> float:
    """Bytes a stage's optimizers hold beyond the training state (state_factor): the two gradient
    buckets of DeepSpeed's ZeRO optimizer (fp16 and fp32 with ZeRO; bf16's optimizer has none),
    and on CUDA the one fp32 temporary a parameter that torch's AdamW (foreach, its default
    there) makes while it updates this rank's share. Measured by gpu-check on an H200, one
    stage of 113M parameters: bf16 + ZeRO-1 peaked at 2802 MB, fp16 + ZeRO-1 at 2571 MB."""
    if not stage_param_bytes:
        return 0.0
    buckets = 0.0
    if profile.zero_stage >= 1 and profile.precision != "bf16":
        buckets = 2.0 * zero_bucket_elements(int(stage_param_bytes / 4)) * (2 if profile.precision == "fp16" else 4)
    sharded = STATE_BYTES[(profile.precision, profile.zero_stage)][3]
    return buckets + (stage_param_bytes / (data_parallel if sharded else 1) if device == "cuda" else 0.0)


def stage_activations(profile: Profile, a: int, b: int, micro_batch_size: int, in_flight: int) -> float:
    """Bytes of activations the stage of layers [a, b) keeps at its peak: ``in_flight``
    micro-batches' saved tensors (measured), or the layer-output estimate without them."""
    scale = micro_batch_size / profile.micro_batch_size
    saved, act, r = profile.saved_bytes, profile.activation_bytes, profile.recompute_interval
    if saved is None:
        out = (act[b - 1] * scale) if act else 0.0
        return activation_memory(out, b - a, in_flight, r)
    if not r:
        return in_flight * sum(saved[a:b]) * scale
    # recompute: each chunk keeps its input; one chunk's saved tensors live while it recomputes
    chunks = range(a, b, r)
    kept = sum((act[c - 1] if c > 0 and act else 0.0) for c in chunks)
    return (in_flight * kept + max(sum(saved[c:min(c + r, b)]) for c in chunks)) * scale


def activation_memory(act: float, layers: int, in_flight: int, recompute_interval: int) -> float:
    """Bytes of activations a stage of ``layers`` layers keeps with ``in_flight`` micro-batches
    (``act``: one layer's output for one micro-batch)."""
    if not recompute_interval:
        return in_flight * act * layers
    chunks = -(-layers // recompute_interval)
    return in_flight * act * chunks + act * min(recompute_interval, layers)


def stage_cut(profile: Profile, stages: int, data_parallel: int, device_memory: float) -> list[int]:
    """The min-max cut of the profile's layers into ``stages``, no stage's training state over
    ``device_memory``: the one rule the planner and the job's re-balance (pipeswift_launch)
    share. PartitionError when no cut fits."""
    cap = device_memory / state_factor(profile, data_parallel) if profile.param_bytes else None
    return balanced_boundaries(profile.costs, stages, profile.param_bytes, cap)


def _scaled(profile: Profile, mbs: int) -> list[float]:
    f = mbs / profile.micro_batch_size
    return [c * f for c in profile.costs]


def oversubscribed(stages: int, data_parallel: int, tasks_per_node: int, hw: Hardware) -> bool:
    """Do more CPU ranks (x threads) than cores share a host in this layout?"""
    return hw.crowded(min(hw.ranks_per_host or tasks_per_node, stages * data_parallel))


def held_micro_batches(schedule: str, stages: int, micro_batches: int, stage: int, in_1f1b: int) -> int:
    """Micro-batches whose activations stage ``stage`` may hold at once: 1F1B's ``in_1f1b``;
    under pswift's ZB-H1 (pipeswift_launch.zerobubble) up to the first stage's 1F1B count on
    every stage, one more where a weight pass waits for the next stage's gradient (counted
    whole, though a weight pass keeps only its Linear inputs and output gradients)."""
    if schedule != "zb-h1":
        return in_1f1b
    return max(in_1f1b, min(stages, micro_batches) + (stage < stages - 1))


def estimate_step(profile: Profile, boundaries: Sequence[int], micro_batches: int,
                  micro_batch_size: int, data_parallel: int, tasks_per_node: int,
                  hw: Hardware, schedule: str = "1f1b") -> StepEstimate:
    """The step time and each stage's memory of this layout under ``schedule`` ("zb-h1": each
    stage's weight passes, :meth:`Profile.weight_fractions` of its layers, fill its bubbles;
    simulated where the pipeline is small enough, else 1F1B's time)."""
    costs = _scaled(profile, micro_batch_size)
    P = len(boundaries) - 1
    fwd, bwd = _engine_passes(profile, costs, boundaries)
    p2p = _p2p_seconds(profile, boundaries, micro_batch_size, hw)
    exact = P * micro_batches <= SIMULATED_OPS_MAX
    sim = (simulate(fwd, bwd, micro_batches, "1f1b", p2p=p2p, keep_ops=False) if exact
           else closed_form_1f1b(fwd, bwd, micro_batches, p2p))
    # ZB-H1 against 1F1B on the same stage times: the share of the makespan it leaves (above 1
    # where the split costs more than the bubble it fills); where more ranks than cores share a
    # host, with them sharing its cores; none with data-parallel replicas sharing it
    crowded = oversubscribed(P, data_parallel, tasks_per_node, hw)
    shared = bool(exact and hw.host_cores and crowded and data_parallel == 1)
    zb_passes = (_split_passes(profile, costs, boundaries, fwd, bwd, ZB_SPLIT_COST_CPU if hw.device == "cpu" else 0.0)
                 if schedule == "zb-h1" and exact and P > 1 and (shared or not crowded) else None)
    zero_bubble, bubble = (_zero_bubble(zb_passes, micro_batches, p2p, sim.step_time) if zb_passes
                           else (1.0, sim.bubble_ratio))
    params = [sum(profile.param_bytes[a:b]) for a, b in zip(boundaries, boundaries[1:])] \
        if profile.param_bytes else [0] * P
    allreduce = (2 * (data_parallel - 1) / data_parallel * max(params) / hw.allreduce_bandwidth
                 if data_parallel > 1 else 0.0)
    optimizer = (profile.step_overhead_s if profile.step_overhead_s is not None
                 else TRAIN_STATE_FACTOR * max(params) / hw.optimizer_bandwidth)
    ranks = hw.ranks_per_host or tasks_per_node
    if shared:
        makespan, zero_bubble = _sharing_cores(fwd, bwd, zb_passes, micro_batches, p2p, ranks, hw)
    else:
        makespan = sim.step_time * _replicas_sharing(sim, P, data_parallel, ranks, hw)
    contention = makespan / sim.step_time if sim.step_time else 1.0
    makespan *= zero_bubble
    compute = makespan - 2 * (P - 1) * p2p if P > 1 else makespan
    held = [held_micro_batches(schedule, P, micro_batches, s, sim.peak_in_flight[s]) for s in range(P)]
    memory = [state_factor(profile, data_parallel) * params[s]
              + optimizer_extra_bytes(profile, params[s], data_parallel, hw.device)
              + stage_activations(profile, boundaries[s], boundaries[s + 1], micro_batch_size, held[s])
              for s in range(P)]
    return StepEstimate(step_s=makespan + allreduce + optimizer, compute_s=compute * contention,
                        p2p_s=2 * (P - 1) * p2p, allreduce_s=allreduce, optimizer_s=optimizer,
                        contention=contention, bubble_ratio=bubble, stage_memory=tuple(memory),
                        fits=max(memory) <= hw.device_memory)


def _engine_passes(profile: Profile, costs: Sequence[float], boundaries: Sequence[int]
                   ) -> tuple[list[float], list[float]]:
    """Each stage's forward and backward seconds per micro-batch: its layers' (the backward
    running each layer's forward again first under activation checkpointing) plus the engine's
    work outside them, one third in the forward and two in the backward as for the layers; the
    sender pays for its sends (activations forward, gradients back)."""
    P = len(boundaries) - 1
    fwd, bwd = stage_times(costs, boundaries)
    if profile.recompute_interval:
        bwd = [b + f for f, b in zip(fwd, bwd)]
    o, last, snd = profile.overhead_s, profile.last_stage_overhead_s, profile.send_s
    fwd = [f + o / 3 + (last / 3 if s == P - 1 else 0.0) + (snd if s < P - 1 else 0.0)
           for s, f in enumerate(fwd)]
    bwd = [b + 2 * o / 3 + (2 * last / 3 if s == P - 1 else 0.0) + (snd if s > 0 else 0.0)
           for s, b in enumerate(bwd)]
    return fwd, bwd


def _p2p_seconds(profile: Profile, boundaries: Sequence[int], micro_batch_size: int, hw: Hardware) -> float:
    """One transfer between adjacent stages: the link's latency plus the largest activation a
    stage sends over its bandwidth (0 with a single stage)."""
    if len(boundaries) <= 2:
        return 0.0
    act, scale = profile.activation_bytes, micro_batch_size / profile.micro_batch_size
    sent = max((act[b - 1] * scale for b in boundaries[1:-1]), default=0.0) if act else 0.0
    return hw.p2p_latency + sent / hw.p2p_bandwidth


def _sharing_cores(fwd: Sequence[float], bwd: Sequence[float],
                   zb_passes: tuple[list[float], list[float], list[float]] | None, micro_batches: int,
                   p2p: float, ranks: int, hw: Hardware) -> tuple[float, float]:
    """The 1F1B makespan where more busy ranks than cores share a host, and ZB-H1's share of it
    (1 without ZB-H1's passes). The stages sharing a host slow each other down while they
    overlap (processor sharing over the same 1F1B graph), and the host loses some of its time
    to switching between them (measured: roughly a constant share, ``hw.shared_efficiency``)."""
    host_of, cores = [d // max(1, ranks) for d in range(len(fwd))], hw.host_cores or 1
    makespan = simulate_shared(fwd, bwd, micro_batches, p2p, host_of, cores, hw.threads_per_rank)
    zero_bubble = 1.0
    if zb_passes:
        # a stage's bubble is partly another's work there: ZB-H1 gains only the time no rank
        # of the host can run (simulated 0.94x of 1F1B at 4 uniform stages x 4 on 2 cores, 0.97x
        # with the split's cost, 0.81x on 4 cores; measured 0.96x, bench/schedules.py)
        f, b, w = zb_passes
        zero_bubble = simulate_shared(f, b, micro_batches, p2p, host_of, cores, hw.threads_per_rank,
                                      wgrad=w) / makespan if makespan > 0 else 1.0
    return makespan / hw.shared_efficiency, zero_bubble


def _replicas_sharing(sim: SimResult, stages: int, data_parallel: int, ranks: int, hw: Hardware) -> float:
    """How much longer the step runs where a CPU host's ranks (data-parallel replicas of the
    pipeline) outnumber its cores, all of them busy at once, averaged; 1 elsewhere."""
    if hw.device != "cpu" or not hw.host_cores:
        return 1.0
    demand = min(ranks, stages * data_parallel) * (sum(sim.busy) / (stages * sim.step_time or 1.0))
    over = demand * hw.threads_per_rank / hw.host_cores
    return over / hw.shared_efficiency if over > 1.0 else 1.0


#: what pswift's ZB-H1 itself costs a CPU stage, as a share of its F and B + W: the autograd
#: function around each Linear and the weight product computed apart. Measured +2.4 % of F + B at
#: 2 stages x 4 micro-batches of 8 and +3.5 % at x 8 of 4, hidden 256 (bench/schedules.py
#: `split_cost`, 12 rounds; -1.5 % and +5.8 % in 8 later rounds, +5 % at hidden 128; in the
#: passes' CPU time +1.5 % and +2.3 %, and +3.7 % and +6.4 % on 4 stages sharing 2 cores, whose
#: wall time grows 14 %: stretched by the sharing, not the split's work). Not measured
#: on a GPU (its kernels run behind the Python that launches them): 0 there. Nothing else is
#: counted: a ZB-H1 step lost 0.7-1.2 ms a stage slot beyond the one simulated on its own passes
#: while its receives were posted late (gloo then waits for the sender's thread); with them posted
#: as soon as their buffer is free it is 0.33 and 0.11 ms at 2 x 4 and 2 x 8, hidden 256, 0.41 and
#: -0.17 ms at hidden 128, within the noise of a step
ZB_SPLIT_COST_CPU = 0.03


def model_passes(profile: Profile, boundaries: Sequence[int], micro_batch_size: int
                 ) -> tuple[list[float], list[float], list[float]]:
    """Each stage's forward, whole backward and weight-gradient (W, part of the backward)
    seconds per micro-batch as the step model simulates them: the layers' and the engine's, W
    the weight share of the layers' (measured by a ZB-H1 run, else assumed). For `pswift
    simulate`; the step model adds ZB-H1's own cost (:func:`_split_passes`), the transfers and
    the step's fixed work."""
    costs = _scaled(profile, micro_batch_size)
    fwd, bwd = _engine_passes(profile, costs, boundaries)
    return fwd, bwd, _weight_passes(profile, costs, boundaries, bwd)


def _weight_passes(profile: Profile, costs: Sequence[float], boundaries: Sequence[int],
                   bwd: Sequence[float]) -> list[float]:
    """Each stage's W: the weight share of its layers' seconds, at most its whole backward."""
    share, _ = profile.weight_fractions()
    return [min(b, sum(costs[i] * share[i] for i in range(lo, hi)))
            for b, lo, hi in zip(bwd, boundaries, boundaries[1:])]


def _split_passes(profile: Profile, costs: Sequence[float], boundaries: Sequence[int], fwd: Sequence[float],
                  bwd: Sequence[float], split_cost: float) -> tuple[list[float], list[float], list[float]]:
    """Each stage's F, whole backward and W under pswift's ZB-H1: W the weight share of its
    layers' seconds, every pass of a stage with something split ``split_cost`` longer."""
    wgrad = _weight_passes(profile, costs, boundaries, bwd)
    longer = [1.0 + split_cost if w > 0 else 1.0 for w in wgrad]    # a stage with nothing split: none
    return ([f * x for f, x in zip(fwd, longer)], [b * x for b, x in zip(bwd, longer)],
            [w * x for w, x in zip(wgrad, longer)])


def _zero_bubble(passes: tuple[list[float], list[float], list[float]], micro_batches: int, p2p: float,
                 one_f_one_b: float) -> tuple[float, float]:
    """ZB-H1's simulated makespan on ``passes`` (:func:`_split_passes`, in the order pswift's
    engine runs it) over 1F1B's (``one_f_one_b``), and its bubble ratio. Above 1 where the split
    costs more than the bubble it fills."""
    f, b, w = passes
    zb = simulate(f, b, micro_batches, "zb-h1", p2p=p2p, wgrad=w, keep_ops=False, as_run=True)
    return (zb.step_time / one_f_one_b if one_f_one_b > 0 else 1.0), zb.bubble_ratio


class Calibration(NamedTuple):
    """How far measured step times are from the model: ``scale`` multiplies every time in the
    profile; ``shared_efficiency`` is what an oversubscribed CPU host delivers."""
    scale: float = 1.0
    shared_efficiency: float = 1.0
    measured: int = 0
    oversubscribed: int = 0


#: a measured config: (boundaries, micro_batches, micro_batch_size, data_parallel,
#: tasks_per_node, seconds), and the schedule it ran as a seventh item where not 1F1B
Measured = tuple[Any, ...]


def _estimated(prof: Profile, row: Measured, hw: Hardware) -> float:
    """The model's step time of a measured config (its schedule's)."""
    bounds, m, mbs, dp, tpn = row[:5]
    return estimate_step(prof, bounds, m, mbs, dp, tpn, hw, row[6] if len(row) > 6 else "1f1b").step_s


def calibrate(profile: Profile, measured: list[Measured], hw: Hardware) -> Calibration:
    """Fit the calibration to measured step times.

    ``measured``: :data:`Measured` per measured config. ``scale`` = the median of measured / estimated over the
    configs whose ranks have a core each (all configs when none has); then, if some measured
    configs oversubscribe their host, ``shared_efficiency`` = the median over them of the
    simulated shared makespan / (measured - per-step work), within [0.2, 2]."""
    def ratios(prof: Profile, rows: list[Measured]) -> list[float]:
        return sorted(r[5] / est for r in rows if (est := _estimated(prof, r, hw)) > 0)

    over = [r for r in measured if oversubscribed(len(r[0]) - 1, r[3], r[4], hw)]
    plain = [r for r in measured if r not in over] or over
    first = ratios(profile, plain)
    if not first:
        return Calibration()
    scale = median_of(first)
    again = ratios(profile.scaled(scale), plain)
    scale *= median_of(again) if again else 1.0  # transfer latency does not scale
    effs = []
    if plain is not over:
        # step = shared makespan / efficiency + per-step work: two estimates separate the parts
        tuned = profile.scaled(scale)
        ideal, half = hw._replace(shared_efficiency=1.0), hw._replace(shared_efficiency=0.5)
        for r in over:
            whole = _estimated(tuned, r, ideal)
            shared = _estimated(tuned, r, half) - whole
            if shared > 0 and r[5] > whole - shared:
                effs.append(shared / (r[5] - (whole - shared)))
    eff = min(2.0, max(0.2, median_of(sorted(effs)))) if effs else 1.0
    return Calibration(scale, eff, len(measured), len(over))


def overheads_from_instructions(instructions: dict[str, dict[str, float]], layer_seconds: dict[str, float],
                                boundaries: Sequence[int], micro_batches: int) -> dict[str, float]:
    """Profile overheads from one profiled layout's instruction times (seconds per step per
    stage, as the launcher records them) and its per-layer seconds per micro-batch.

    - per stage: (forward + backward + ZB-H1's weight pass + loading) / m minus the stage's layers;
      ``overhead_s`` = the median over all but the last stage (a single stage: its own), and
      ``last_stage_overhead_s`` = what the last stage pays beyond that (the loss);
    - ``send_s`` = one send: the least a stage spent per send in either direction (a send
      waits for its receiver, as a receive waits for its sender: neither is pure cost);
    - ``step_overhead_s`` = the first stage's optimizer step, gradient reduction and the time
      outside any instruction; in 1F1B the first stage finishes last, so it does not wait there.
    """
    P, m = len(boundaries) - 1, max(1, micro_batches)
    per_mb = []
    for s in range(P):
        ins = instructions.get(str(s)) or {}
        layers = sum(layer_seconds.get(str(i), 0.0) for i in range(boundaries[s], boundaries[s + 1]))
        # ZB-H1's WeightPass: the layers' weight gradients (their seconds include them)
        busy = sum(ins.get(k, 0.0) for k in ("ForwardPass", "BackwardPass", "WeightPass", "LoadMicroBatch"))
        per_mb.append(max(0.0, busy / m - layers))
    common = sorted(per_mb[:-1] or per_mb)
    overhead = common[len(common) // 2]
    # a send returns when its receiver has taken it: behind a slow stage it includes waiting,
    # so the cheapest stage's sends (per micro-batch, each direction) are the cost of one
    sends = [ins[k] / m for s in range(P) for k in ("SendActivation", "SendGrad")
             if k in (ins := instructions.get(str(s)) or {})]
    first = instructions.get("0") or {}
    inside = sum(v for k, v in first.items() if k != "step")
    fixed = (first.get("OptimizerStep", 0.0) + first.get("ReduceGrads", 0.0) + first.get("ReduceTiedGrads", 0.0)
             + max(0.0, first.get("step", 0.0) - inside))
    return {"overhead_s": overhead, "last_stage_overhead_s": max(0.0, per_mb[-1] - overhead) if P > 1 else 0.0,
            "send_s": min(sends) if P > 1 and sends else 0.0, "step_overhead_s": fixed}


CHECKPOINT_BYTES_PER_S = 200e6   # a conservative write bandwidth
CHECKPOINT_FIXED_S = 2.0


def checkpoint_seconds(param_bytes: Sequence[float] | None, unknown: float = CHECKPOINT_FIXED_S) -> float:
    """Seconds to write a checkpoint: weights + Adam's two moments at a conservative bandwidth,
    plus a fixed cost; ``unknown`` without per-layer sizes (the planner's JCT takes the fixed
    cost, the USR2 lead something safer)."""
    if not param_bytes:
        return unknown
    return CHECKPOINT_FIXED_S + (TRAIN_STATE_FACTOR - 1) * sum(param_bytes) / CHECKPOINT_BYTES_PER_S
