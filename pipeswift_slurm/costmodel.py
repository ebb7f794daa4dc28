"""Step time and memory of a pipeline layout, from per-layer costs (pure functions).

step = 1F1B makespan from the schedule simulator (bottleneck stage x (m + P - 1) for balanced
stages, plus point-to-point activation transfers) + data-parallel gradient all-reduce + the
optimizer step, times a CPU-contention factor when more ranks than cores share a host.
Memory per stage = weights + gradients + Adam state + activations of the micro-batches in
flight, against the device memory. Calibrated by history: a measured config's step time
replaces the estimate, and measured configs of the same model scale the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .simulate import simulate, simulate_shared_1f1b, stage_times

#: bytes per parameter byte held by training: weights + gradients + Adam's two moments (fp32)
TRAIN_STATE_FACTOR = 4


@dataclass(frozen=True)
class Hardware:
    device: str = "cpu"
    device_memory: float = 16e9          # bytes per task slot
    p2p_bandwidth: float = 1e9           # bytes/s between adjacent stages
    p2p_latency: float = 50e-6           # seconds per transfer
    allreduce_bandwidth: float = 1e9     # bytes/s per rank in a ring all-reduce
    optimizer_bandwidth: float = 2e9     # bytes/s of optimizer state streamed in the step
    host_cores: int | None = None        # CPU: cores the ranks of one host share
    ranks_per_host: int | None = None    # CPU: ranks placed on one host (default tasks/node)
    threads_per_rank: int = 1


@dataclass(frozen=True)
class Profile:
    """Per-layer forward+backward seconds per micro-batch of ``micro_batch_size`` on one device."""
    costs: tuple[float, ...]
    param_bytes: tuple[int, ...] | None = None
    activation_bytes: tuple[int, ...] | None = None
    micro_batch_size: int = 1
    source: str = "toml"
    #: seconds per micro-batch per stage outside the layers (engine dispatch, p2p send/recv,
    #: data, loss), fitted from measured runs by :func:`fit_overhead`
    overhead_s: float = 0.0


@dataclass(frozen=True)
class StepEstimate:
    step_s: float
    compute_s: float
    p2p_s: float
    allreduce_s: float
    optimizer_s: float
    contention: float
    bubble_ratio: float
    stage_memory: tuple[float, ...]
    fits: bool


def _scaled(profile: Profile, mbs: int) -> list[float]:
    f = mbs / profile.micro_batch_size
    return [c * f for c in profile.costs]


def estimate_step(profile: Profile, boundaries: Sequence[int], micro_batches: int,
                  micro_batch_size: int, data_parallel: int, tasks_per_node: int,
                  hw: Hardware) -> StepEstimate:
    costs = _scaled(profile, micro_batch_size)
    P = len(boundaries) - 1
    fwd, bwd = stage_times(costs, boundaries)
    o = profile.overhead_s
    fwd, bwd = [f + o / 3 for f in fwd], [b + 2 * o / 3 for b in bwd]
    act = profile.activation_bytes
    p2p = 0.0
    if P > 1:
        scale = micro_batch_size / profile.micro_batch_size
        sent = max((act[b - 1] * scale for b in boundaries[1:-1]), default=0.0) if act else 0.0
        p2p = hw.p2p_latency + sent / hw.p2p_bandwidth
    sim = simulate(fwd, bwd, micro_batches, "1f1b", p2p=p2p, keep_ops=False)
    params = [sum(profile.param_bytes[a:b]) for a, b in zip(boundaries, boundaries[1:])] \
        if profile.param_bytes else [0] * P
    allreduce = (2 * (data_parallel - 1) / data_parallel * max(params) / hw.allreduce_bandwidth
                 if data_parallel > 1 else 0.0)
    optimizer = TRAIN_STATE_FACTOR * max(params) / hw.optimizer_bandwidth
    makespan = sim.step_time
    ranks = hw.ranks_per_host or tasks_per_node
    if (hw.device == "cpu" and hw.host_cores and data_parallel == 1
            and min(ranks, P) * hw.threads_per_rank > hw.host_cores):
        # more busy ranks than cores on a host: the stages sharing it slow each other down
        # while they overlap (processor sharing over the same 1F1B graph)
        host_of = [d // max(1, ranks) for d in range(P)]
        makespan = simulate_shared_1f1b(fwd, bwd, micro_batches, p2p, host_of, hw.host_cores,
                                        hw.threads_per_rank)
    elif hw.device == "cpu" and hw.host_cores:
        # data-parallel replicas on a host: all ranks busy at once, averaged
        demand = min(ranks, P * data_parallel) * (sum(sim.busy) / (P * sim.step_time or 1.0))
        makespan *= max(1.0, demand * hw.threads_per_rank / hw.host_cores)
    contention = makespan / sim.step_time if sim.step_time else 1.0
    compute = makespan - 2 * (P - 1) * p2p if P > 1 else makespan
    step = makespan + allreduce + optimizer
    memory = []
    for s in range(P):
        a = (act[boundaries[s + 1] - 1] * micro_batch_size / profile.micro_batch_size) if act else 0.0
        in_flight = sim.peak_in_flight[s]
        memory.append(TRAIN_STATE_FACTOR * params[s] + in_flight * a * (boundaries[s + 1] - boundaries[s]))
    return StepEstimate(step_s=step, compute_s=compute * contention, p2p_s=2 * (P - 1) * p2p,
                        allreduce_s=allreduce, optimizer_s=optimizer, contention=contention,
                        bubble_ratio=sim.bubble_ratio, stage_memory=tuple(memory),
                        fits=max(memory) <= hw.device_memory)


def fit_overhead(profile: Profile, measured: list[tuple[Sequence[int], int, int, int, int, float]],
                 hw: Hardware) -> float:
    """The per-micro-batch overhead that makes the model match measured step times.

    ``measured``: (boundaries, micro_batches, micro_batch_size, data_parallel, tasks_per_node,
    seconds) per measured config; each is solved by bisection, the median is returned."""
    from dataclasses import replace

    fits = []
    for bounds, m, mbs, dp, tpn, seconds in measured:
        def step(o: float) -> float:
            return estimate_step(replace(profile, overhead_s=o), bounds, m, mbs, dp, tpn, hw).step_s
        if step(0.0) >= seconds:
            fits.append(0.0)
            continue
        lo, hi = 0.0, seconds
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if step(mid) < seconds else (lo, mid)
        fits.append((lo + hi) / 2)
    fits.sort()
    return fits[len(fits) // 2] if fits else 0.0


def checkpoint_seconds(profile: Profile, bandwidth: float = 200e6, fixed: float = 2.0) -> float:
    """Seconds to write a checkpoint (weights + Adam state) at a conservative bandwidth."""
    total = sum(profile.param_bytes) if profile.param_bytes else 0
    return fixed + (TRAIN_STATE_FACTOR - 1) * total / bandwidth
