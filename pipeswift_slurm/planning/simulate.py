"""Discrete-event simulator of pipeline schedules: GPipe, 1F1B, interleaved 1F1B, zero-bubble
(ZB-H1, ZB-H2).

Pure functions, no I/O. Every device runs its operations in the schedule's fixed order; an
operation starts when its device is free and its inputs have arrived (the producing operation's
end plus the point-to-point transfer time when it ran on another device). The planner uses the
same model for its step-time estimate.

The zero-bubble schedule is a greedy ZB-H1: B and W are split, W runs whenever the next F/B
would wait, and activation memory stays at the 1F1B peak. With uniform stages it gives the
paper's makespan (4 stages x 8 micro-batches, F=B=W=1: 27 vs 1F1B's 33). ``as_run=True``
simulates instead the fixed order pswift's engine runs (:func:`weight_passes_due`, the one
rule pipeswift_launch.zerobubble follows): the paper's on 2 stages, 29 at 4 x 8; the planner's
step model uses it. ZB-H2 holds up to
2p - 1 micro-batches, fills the warm-up with extra forwards and, with the paper's optimizer
post-validation, runs steps back to back: its step time is that period (F=B=W=1: 24, no bubble;
m(F+B+W) + (p-1)(F+B-2W) when the warm-up fills stage 0's wait, as with F = B = W); where its
order loses to H1's (a forward much slower than B + W, few micro-batches), it runs H1's.

Operations (one micro-batch on one virtual stage): ``F`` forward, ``B`` backward (input and
weight gradients; only the input gradient in the zero-bubble schedule), ``W`` weight gradient
(zero-bubble only). Interleaved 1F1B puts ``chunks`` virtual stages on each device: virtual
stage ``c * devices + d`` runs on device ``d``.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Sequence

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")
ZERO_BUBBLE = ("zb-h1", "zb-h2")


class SimulationError(ValueError):
    pass


class Op(NamedTuple):
    kind: str  # F | B | W
    stage: int  # virtual stage
    micro: int
    device: int
    start: float
    end: float


@dataclass
class SimResult:
    schedule: str
    devices: int
    micro_batches: int
    chunks: int
    step_time: float
    busy: list[float]
    idle: list[float]
    bubble_ratio: float
    peak_in_flight: list[int]
    ops: list[Op] = field(repr=False, default_factory=list)

    @property
    def span(self) -> float:
        """Time from the first operation's start to the last one's end: the step time, except
        for ZB-H2, whose stages overlap the steps before and after."""
        return max([self.step_time, *(o.end for o in self.ops)])

    def to_dict(self, with_ops: bool = False) -> dict[str, Any]:
        d = {"schedule": self.schedule, "stages": self.devices, "micro_batches": self.micro_batches,
             "chunks": self.chunks, "step_time": self.step_time, "bubble_ratio": self.bubble_ratio,
             "per_stage": [{"stage": s, "busy": self.busy[s], "idle": self.idle[s],
                            "peak_in_flight": self.peak_in_flight[s]} for s in range(self.devices)]}
        if with_ops:
            d["ops"] = [[o.kind, o.stage, o.micro, o.device, o.start, o.end] for o in self.ops]
        return d


# ----------------------------------------------------------------------------- per-device orders
def _order_gpipe(d: int, devices: int, m: int) -> list[tuple[str, int, int]]:
    return [("F", d, k) for k in range(m)] + [("B", d, k) for k in range(m)]


def _order_1f1b(d: int, devices: int, m: int) -> list[tuple[str, int, int]]:
    """PipeDream-flush 1F1B (DeepSpeed's schedule): warm-up forwards, then one F one B."""
    warm = min(devices - d - 1, m)
    order: list[tuple[str, int, int]] = [("F", d, k) for k in range(warm)]
    nf = warm
    for nb in range(m):
        if nf < m:
            order.append(("F", d, nf))
            nf += 1
        order.append(("B", d, nb))
    return order


def weight_passes_due(op: str, last: bool, owed: int, held: int, stages: int) -> int:
    """pswift's ZB-H1 (pipeswift_launch.zerobubble runs it, the planner simulates it): how many
    of the ``owed`` deferred weight passes a stage runs, oldest first, just before ``op``:

    - "B", a backward (after the gradient's receive is posted) on every stage but the last: all
      of them; they fill the wait for the next stage's gradient;
    - "F", a forward on the last stage (on the critical path: every other stage waits for its
      gradients): only as many as keep ``held`` micro-batches (forward done, weight pass not)
      within the first stage's 1F1B peak, ``stages`` (ZB-H1's memory bound);
    - "end", before the step's gradients are reduced: the rest."""
    if op == "end":
        return owed
    if op == "B" and not last:
        return owed
    if op == "F" and last:
        return min(owed, max(0, held - stages + 1))
    return 0


def _order_zb_h1_as_run(d: int, devices: int, m: int) -> list[tuple[str, int, int]]:
    """1F1B's F/B order with the weight passes where pswift's engine runs them."""
    last, held = d == devices - 1, 0
    owed: list[int] = []
    order: list[tuple[str, int, int]] = []
    for kind, s, k in _order_1f1b(d, devices, m):
        due = weight_passes_due(kind, last, len(owed), held, devices)
        order += [("W", s, owed.pop(0)) for _ in range(due)]
        held -= due
        order.append((kind, s, k))
        held += kind == "F"
        if kind == "B":
            owed.append(k)
    return order + [("W", d, k) for k in owed[:weight_passes_due("end", last, len(owed), held, devices)]]


def _order_zb_h2(d: int, devices: int, m: int) -> list[tuple[str, int, int]]:
    """ZB-H2's F/B order: 2(p - d) - 1 warm-up forwards (stage 0 fills its wait for the first
    input gradient, holding the paper's 2p - 1 micro-batches), then one B one F."""
    warm = min(2 * (devices - d) - 1, m)
    order: list[tuple[str, int, int]] = [("F", d, k) for k in range(warm)]
    nf = warm
    for nb in range(m):
        order.append(("B", d, nb))
        if nf < m:
            order.append(("F", d, nf))
            nf += 1
    return order


def _order_interleaved(d: int, devices: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Megatron-style interleaved 1F1B (needs m % devices == 0)."""
    total = m * v

    def fwd(k: int) -> tuple[str, int, int]:
        chunk = (k // devices) % v
        micro = (k // (devices * v)) * devices + k % devices
        return ("F", chunk * devices + d, micro)

    def bwd(k: int) -> tuple[str, int, int]:
        chunk = v - 1 - (k // devices) % v
        micro = (k // (devices * v)) * devices + k % devices
        return ("B", chunk * devices + d, micro)

    warm = min((devices - d - 1) * 2 + (v - 1) * devices, total)
    order = [fwd(k) for k in range(warm)]
    nf, nb = warm, 0
    while nb < total:
        if nf < total:
            order.append(fwd(nf))
            nf += 1
        order.append(bwd(nb))
        nb += 1
    return order


# ----------------------------------------------------------------------------- simulation
def _ready(kind: str, s: int, k: int, device: int, devices: int, stages: int, free: float,
           done: dict[tuple[str, int, int], float], p2p: float) -> float | None:
    """When operation ``kind`` of micro-batch ``k`` on (virtual) stage ``s`` can start on
    ``device``: the device is free and its inputs are done (F needs F of stage s-1; B its own F
    and B of stage s+1; W its B), plus ``p2p`` for an input made on another device. None while
    an input is not done yet. Virtual stage ``v`` runs on device ``v % devices``."""
    if kind == "F":
        deps = [("F", s - 1, k)] if s > 0 else []
    elif kind == "B":
        deps = [("F", s, k)] + ([("B", s + 1, k)] if s < stages - 1 else [])
    else:
        deps = [("B", s, k)]
    t = free
    for key in deps:
        e = done.get(key)
        if e is None:
            return None
        t = max(t, e + (p2p if key[1] % devices != device else 0.0))
    return t


def closed_form_1f1b(fwd: Sequence[float], bwd: Sequence[float], micro_batches: int,
                     p2p: float = 0.0) -> SimResult:
    """1F1B without simulating it, for pipelines too large to simulate while planning: the first
    micro-batch crosses every stage and back, the others follow at the pace of the slower of
    the slowest stage and 1F1B's loop (stage 0 starts micro-batch k + P only after k came back:
    P micro-batches per full round trip, transfers included): each of the m - 1 others costs
    max(slowest stage, (sum of stages + 2 (P - 1) p2p) / P), the loop's excess counted in whole
    transfer pairs as the schedule waits them. Exact for uniform stages, transfers included
    (property-tested against :func:`simulate`); an estimate otherwise."""
    P, m = len(fwd), micro_batches
    per = [f + b for f, b in zip(fwd, bwd)]
    slowest = max(per)
    loop = (sum(per) + 2 * (P - 1) * p2p) / P
    excess = loop - slowest     # rounding noise below 1e-12 of a stage is no wait (a 5e-324 s
    pairs = 0                   # transfer made it 1e-16 / 1e-323 = inf pairs: hypothesis found it)
    if p2p > 0 and excess > 1e-12 * slowest:
        pairs = min((m - 1) * P, math.floor((m - 1) * excess / (2 * p2p) + 1e-9))
    step = sum(per) + 2 * (P - 1) * p2p + (m - 1) * slowest + 2 * p2p * pairs
    busy = [m * x for x in per]
    return SimResult(schedule="1f1b", devices=P, micro_batches=m, chunks=1, step_time=step,
                     busy=busy, idle=[step - b for b in busy],
                     bubble_ratio=1.0 - sum(busy) / (P * step) if step > 0 else 0.0,
                     peak_in_flight=[min(P - s, m) for s in range(P)])


#: stages x chunks x micro-batches one simulation runs at most (about a second; a planner's
#: layouts stay far below: costmodel.SIMULATED_OPS_MAX)
SIMULATED_PASSES_MAX = 200_000


def simulate(fwd: Sequence[float], bwd: Sequence[float], micro_batches: int,
             schedule: str = "1f1b", p2p: float = 0.0, chunks: int = 1,
             wgrad: Sequence[float] | None = None, keep_ops: bool = True, as_run: bool = False) -> SimResult:
    """Simulate one optimizer step.

    ``fwd``/``bwd``: per-stage (per-device) times for one micro-batch; ``interleaved`` splits
    each device's time evenly over its ``chunks`` model chunks.
    ``wgrad``: zero-bubble only, the part of ``bwd`` that is weight gradient (default: half;
    the CLI's ``--wgrad`` adds it to ``--bwd``, which is then the input gradient alone).
    ``as_run``: "zb-h1" in the order pswift's engine runs it, not the paper's greedy one.
    """
    m, v, devices, vf, vb, vw = _virtual_stages(fwd, bwd, micro_batches, schedule, p2p, chunks, wgrad)
    if schedule == "zb-h1" and as_run:
        orders = [_order_zb_h1_as_run(d, devices, m) for d in range(devices)]
        return _run_orders(orders, schedule, devices, m, v, vf, vb, p2p, keep_ops, vw)
    if schedule == "gpipe":
        orders = [_order_gpipe(d, devices, m) for d in range(devices)]
    elif schedule == "interleaved":
        orders = [_order_interleaved(d, devices, m, v) for d in range(devices)]
    else:
        orders = [_order_1f1b(d, devices, m) for d in range(devices)]
    if schedule == "zb-h1":
        return _simulate_zb(orders, vf, vb, vw, devices, m, p2p, keep_ops)
    if schedule == "zb-h2":
        # H2 holds more than H1 needs, so it can always run H1's order: where its own (extra
        # forwards first, which a forward slower than B + W can make late) loses, it runs H1's
        h2 = _simulate_zb_h2(vf, vb, vw, devices, m, p2p, keep_ops)
        h1 = _simulate_zb(orders, vf, vb, vw, devices, m, p2p, keep_ops)
        return h2 if h2.step_time <= h1.step_time else replace(h1, schedule="zb-h2")
    return _run_orders(orders, schedule, devices, m, v, vf, vb, p2p, keep_ops)


def _virtual_stages(fwd: Sequence[float], bwd: Sequence[float], micro_batches: int, schedule: str,
                    p2p: float, chunks: int, wgrad: Sequence[float] | None
                    ) -> tuple[int, int, int, list[float], list[float], list[float]]:
    """Checked inputs as (m, chunks, devices, forward, backward, weight-gradient times per
    virtual stage); SimulationError says what is wrong."""
    if schedule not in SCHEDULES:
        raise SimulationError(f"schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if len(fwd) != len(bwd) or not fwd:
        raise SimulationError(f"{len(fwd)} forward times but {len(bwd)} backward times: give one "
                              f"of each per stage")
    given = (*fwd, *bwd, *(wgrad or ()), p2p)
    if not all(math.isfinite(x) for x in given):
        raise SimulationError("times must be finite numbers of seconds (not nan or inf)")
    if any(x < 0 for x in given):
        raise SimulationError("times must be >= 0")
    m = int(micro_batches)
    if m < 1:
        raise SimulationError(f"micro_batches = {m} must be >= 1")
    v = int(chunks) if schedule == "interleaved" else 1
    if v < 1:
        raise SimulationError(f"chunks = {chunks} must be >= 1")
    devices = len(fwd)
    if devices * v * m > SIMULATED_PASSES_MAX:
        raise SimulationError(f"{devices} stage(s) x {v} chunk(s) x {m} micro-batches = {devices * v * m} "
                              f"forward passes, more than the {SIMULATED_PASSES_MAX} simulated at most; "
                              f"simulate fewer micro-batches (beyond a few times the stages, each adds "
                              f"the slowest stage's forward + backward)")
    vf = [fwd[s % devices] / v for s in range(devices * v)]
    vb = [bwd[s % devices] / v for s in range(devices * v)]
    if schedule == "interleaved" and m % devices:
        raise SimulationError(f"interleaved 1F1B needs micro_batches ({m}) divisible by the "
                              f"stage count ({devices}); use {(m // devices + 1) * devices}")
    vw = [0.0] * (devices * v)
    if schedule in ZERO_BUBBLE:
        w = list(wgrad) if wgrad is not None else [b / 2 for b in vb]
        if len(w) != devices * v or any(x < 0 or x > b for x, b in zip(w, vb)):
            raise SimulationError("wgrad needs one value per stage, each between 0 and that stage's bwd")
        vw, vb = w, [b - x for b, x in zip(vb, w)]
    return m, v, devices, vf, vb, vw


def _run_orders(orders: list[list[tuple[str, int, int]]], schedule: str, devices: int, m: int,
                v: int, vf: list[float], vb: list[float], p2p: float, keep_ops: bool,
                vw: list[float] | None = None) -> SimResult:
    """Run each device's operation order as early as its inputs allow (GPipe, 1F1B, interleaved,
    ZB-H1 as run: ``vw`` the weight passes' times; a micro-batch is then held until its W)."""
    nv = devices * v
    dur = {"F": vf, "B": vb, "W": vw or []}
    freed_by = "W" if vw is not None else "B"
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * devices
    ptr = [0] * devices
    ops: list[Op] = []
    busy = [0.0] * devices
    in_flight = [0] * devices
    peak = [0] * devices
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for d in range(devices):
            order = orders[d]
            while ptr[d] < len(order):
                kind, s, k = order[ptr[d]]
                ready = _ready(kind, s, k, d, devices, nv, free[d], done, p2p)
                if ready is None:
                    break
                end = ready + dur[kind][s]
                done[(kind, s, k)] = end
                free[d] = end
                busy[d] += dur[kind][s]
                in_flight[d] += 1 if kind == "F" else -(kind == freed_by)
                peak[d] = max(peak[d], in_flight[d])
                if keep_ops:
                    ops.append(Op(kind, s, k, d, ready, end))
                ptr[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the orders above are deadlock-free
            raise SimulationError(f"schedule {schedule} deadlocked")
    step = max(free)
    idle = [step - b for b in busy]
    bubble = 1.0 - sum(busy) / (devices * step) if step > 0 else 0.0
    return SimResult(schedule=schedule, devices=devices, micro_batches=m, chunks=v, step_time=step,
                     busy=busy, idle=idle, bubble_ratio=bubble, peak_in_flight=peak, ops=ops)


class _ZeroBubble:
    """Zero-bubble H1 (Qi et al., ICLR 2024): 1F1B order for F and B (input gradient); each W
    (weight gradient) is deferred and run whenever the next F/B would wait, or when holding one
    more micro-batch's activations (freed by its W) would exceed the 1F1B peak, the first
    stage's ``devices`` micro-batches, which H1 allows every stage. Time-ordered: the device that
    is free earliest decides next, so "would wait" is known. With F = B = W it gives the paper's
    m(F+B+W) + (p-1)(F+B-W) for m >= p (tested); with other times, at least device 0's wait
    for its first B, m(F+B+W) + (p-1)B, and never more than 1F1B."""

    def __init__(self, orders: list[list[tuple[str, int, int]]], vf: list[float], vb: list[float],
                 vw: list[float], devices: int, p2p: float, keep_ops: bool,
                 limit: int | None = None, micro_batches: int | None = None) -> None:
        self.orders, self.devices, self.p2p, self.keep_ops = orders, devices, p2p, keep_ops
        self.dur = {"F": vf, "B": vb, "W": vw}
        self.done: dict[tuple[str, int, int], float] = {}
        self.free = [0.0] * devices
        self.ptr = [0] * devices
        self.pending: list[list[int]] = [[] for _ in range(devices)]
        self.in_flight = [0] * devices
        self.peak = [0] * devices
        self.busy = [0.0] * devices
        self.ops: list[Op] = []
        # H1: the 1F1B peak (stage 0's) on every stage; H2: 2p - 1
        self.limit = [limit or devices] * devices
        #: micro-batches of one step, when several steps run back to back (H2): a stage runs
        #: its last W of a step (then its optimizer step) before the next step's first F
        self.m = micro_batches

    def run(self, d: int, kind: str, k: int, start: float) -> None:
        end = start + self.dur[kind][d]
        self.done[(kind, d, k)] = end
        self.free[d] = end
        self.busy[d] += self.dur[kind][d]
        if kind == "F":
            self.in_flight[d] += 1
            self.peak[d] = max(self.peak[d], self.in_flight[d])
        elif kind == "W":
            self.in_flight[d] -= 1
        if self.keep_ops:
            self.ops.append(Op(kind, d, k, d, start, end))

    def advance(self, d: int) -> bool:
        """Device ``d`` runs its next op, or a deferred W; False when it can do neither yet."""
        if self.ptr[d] >= len(self.orders[d]):
            if not self.pending[d]:
                return False
            self.run(d, "W", self.pending[d].pop(0), self.free[d])
            return True
        kind, _, k = self.orders[d][self.ptr[d]]
        t = _ready(kind, d, k, d, self.devices, self.devices, self.free[d], self.done, self.p2p)
        must_free = kind == "F" and (self.in_flight[d] >= self.limit[d] or (
            self.m is not None and bool(self.pending[d]) and self.pending[d][0] // self.m < k // self.m))
        if self.pending[d] and (must_free or t is None or t > self.free[d]):
            self.run(d, "W", self.pending[d].pop(0), self.free[d])
            return True
        if t is None:
            return False
        self.run(d, kind, k, t)
        if kind == "B":
            self.pending[d].append(k)
        self.ptr[d] += 1
        return True

    def left(self) -> bool:
        return any(self.ptr[d] < len(self.orders[d]) or self.pending[d] for d in range(self.devices))

    def run_to_end(self) -> float:
        """Every op, the device free earliest going first; the time the last one ends."""
        while self.left():
            if not any(self.advance(d) for d in sorted(range(self.devices), key=lambda x: self.free[x])):
                raise SimulationError("zero-bubble schedule deadlocked")  # pragma: no cover
        return max(self.free)


def _simulate_zb(orders: list[list[tuple[str, int, int]]], vf: list[float], vb: list[float],
                 vw: list[float], devices: int, m: int, p2p: float, keep_ops: bool) -> SimResult:
    """The zero-bubble H1 schedule (:class:`_ZeroBubble`) run to the end."""
    zb = _ZeroBubble(orders, vf, vb, vw, devices, p2p, keep_ops)
    step = zb.run_to_end()
    idle = [step - b for b in zb.busy]
    return SimResult(schedule="zb-h1", devices=devices, micro_batches=m, chunks=1, step_time=step,
                     busy=zb.busy, idle=idle, bubble_ratio=1.0 - sum(zb.busy) / (devices * step),
                     peak_in_flight=zb.peak, ops=zb.ops)


#: steps simulated back to back for ZB-H2's period (the last one's increment is the period)
H2_STEPS = 3


def _simulate_zb_h2(vf: list[float], vb: list[float], vw: list[float], devices: int, m: int,
                    p2p: float, keep_ops: bool) -> SimResult:
    """ZB-H2 (Qi et al., ICLR 2024): 2p - 1 micro-batches in flight, the warm-up's extra forwards
    and the deferred W fill every wait, and, with the paper's optimizer post-validation, a step
    begins on a stage once that stage's previous step is done (no synchronisation between
    steps). Its step time is therefore the period of steps run back to back: the time one more
    step adds (F = B = W: m(F+B+W), zero bubble). A single step alone would still take
    (p - 1)F longer, the last stage's first wait, which no schedule removes within one step.
    The ops kept are the last step's, its micro-batches numbered from 0."""
    ends = []
    zb = None
    for steps in (H2_STEPS - 1, H2_STEPS):
        orders = [[(kind, s, k + i * m) for i in range(steps) for kind, s, k in _order_zb_h2(d, devices, m)]
                  for d in range(devices)]
        zb = _ZeroBubble(orders, vf, vb, vw, devices, p2p, keep_ops, limit=2 * devices - 1, micro_batches=m)
        ends.append(zb.run_to_end())
    assert zb is not None
    period = ends[1] - ends[0]
    busy = [m * (vf[d] + vb[d] + vw[d]) for d in range(devices)]
    last = [o for o in zb.ops if o.micro >= (H2_STEPS - 1) * m]
    t0 = min((o.start for o in last), default=0.0)
    ops = [o._replace(micro=o.micro - (H2_STEPS - 1) * m, start=o.start - t0, end=o.end - t0) for o in last]
    return SimResult(schedule="zb-h2", devices=devices, micro_batches=m, chunks=1, step_time=period,
                     busy=busy, idle=[period - b for b in busy],
                     bubble_ratio=1.0 - sum(busy) / (devices * period) if period > 0 else 0.0,
                     peak_in_flight=zb.peak, ops=ops)


def stage_times(layer_costs: Sequence[float], boundaries: Sequence[int],
                fwd_fraction: float = 1 / 3) -> tuple[list[float], list[float]]:
    """Per-stage forward and backward times from per-layer forward+backward costs.

    Backward is about twice the forward (input and weight gradients), hence 1/3 forward."""
    tot = [sum(layer_costs[a:b]) for a, b in zip(boundaries, boundaries[1:])]
    return [t * fwd_fraction for t in tot], [t * (1 - fwd_fraction) for t in tot]


def step_time(fwd: Sequence[float], bwd: Sequence[float], micro_batches: int,
              schedule: str = "1f1b", p2p: float = 0.0) -> float:
    """The planner's step-time estimate: the simulator's makespan (no timeline kept)."""
    return simulate(fwd, bwd, micro_batches, schedule, p2p, keep_ops=False).step_time


def simulate_shared(fwd: Sequence[float], bwd: Sequence[float], micro_batches: int,
                    p2p: float, host_of: Sequence[int], cores: float,
                    threads_per_rank: int = 1, wgrad: Sequence[float] | None = None) -> float:
    """1F1B's makespan when the ranks of one host share its cores (fluid processor sharing);
    with ``wgrad`` (the part of each stage's ``bwd`` that is weight gradient), ZB-H1's in the
    order pswift's engine runs it.

    Each device runs its order; an operation needs its inputs (plus ``p2p`` across
    devices) and then progresses at rate min(1, cores / (busy ranks on its host x threads)).
    Only for the contended case (CPU ranks outnumbering cores); otherwise :func:`simulate`.
    There a stage's bubble is another stage's work, so what ZB-H1 gains is what it saves of
    the time no rank of a host can run."""
    P, m = len(fwd), int(micro_batches)
    if wgrad is None:
        orders = [_order_1f1b(d, P, m) for d in range(P)]
        dur = {"F": list(fwd), "B": list(bwd)}
    else:
        _, _, _, vf, vb, vw = _virtual_stages(fwd, bwd, m, "zb-h1", p2p, 1, wgrad)
        orders = [_order_zb_h1_as_run(d, P, m) for d in range(P)]
        dur = {"F": vf, "B": vb, "W": vw}
    done: dict[tuple[str, int, int], float] = {}
    ptr = [0] * P
    remaining: dict[int, float] = {}  # work left of each device's running op (absent: none running)
    now = 0.0
    free_at = [0.0] * P

    def ready_time(d: int) -> float | None:
        kind, s, k = orders[d][ptr[d]]
        return _ready(kind, s, k, d, P, P, free_at[d], done, p2p)

    left = sum(len(o) for o in orders)
    while left:
        for d in range(P):
            if d not in remaining and ptr[d] < len(orders[d]):
                t = ready_time(d)
                if t is not None and t <= now + 1e-15:
                    kind, s, _ = orders[d][ptr[d]]
                    remaining[d] = dur[kind][s]
        active = [d for d in range(P) if d in remaining]
        busy: dict[int, int] = {}
        for d in active:
            busy[host_of[d]] = busy.get(host_of[d], 0) + 1
        rate = {d: min(1.0, cores / (busy[host_of[d]] * threads_per_rank)) for d in active}
        nxt = [now + remaining[d] / rate[d] for d in active if rate[d] > 0]
        for d in range(P):
            if d not in remaining and ptr[d] < len(orders[d]):
                t = ready_time(d)
                if t is not None and t > now:
                    nxt.append(t)
        if not nxt:  # pragma: no cover - the 1F1B and ZB-H1 orders cannot deadlock
            raise SimulationError("shared-core simulation stalled")
        t_next = min(nxt)
        for d in active:
            remaining[d] -= rate[d] * (t_next - now)
        now = t_next
        for d in active:
            if remaining[d] <= 1e-12:
                done[orders[d][ptr[d]]] = now
                free_at[d] = now
                del remaining[d]
                ptr[d] += 1
                left -= 1
    return now
