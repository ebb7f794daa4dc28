"""How often a job checkpoints when ``[training] checkpoint_interval = "auto"`` (the default):
the later of two bounds, and never more often than MIN_EVERY_S:

- Young's and Daly's first-order optimum, every ``sqrt(2 * C * M)`` seconds of training, for a
  checkpoint that costs training ``C`` seconds and interruptions ``M`` seconds apart on average;
- the file system's share: a write that takes ``W`` seconds (in the background, it costs
  training almost nothing, so Young/Daly alone would write back to back) comes at most every
  ``W / checkpoint_io_share`` seconds (10 W by default), so a job spends at most that share of
  its time writing, and never starts a write before the last one could have ended.

``M`` is the job's: its partition's preemptions per hour of run time plus failures (crashes,
hangs, lost nodes) per node-hour times its node count, both from the history. Failures are few,
so the measured rate is pulled towards a prior by PRIOR_NODE_HOURS of pretend exposure:

- PRIOR_FAILURES_PER_NODE_HOUR = 1.6e-4: Meta's Llama 3 report (2024) counts 419 unexpected
  interruptions in 54 days on 16,384 GPUs (2,048 nodes of 8): 419 / (54 x 24 x 2,048) per
  node-hour. A cluster's own history replaces it as node-hours accumulate.

The planner prices each candidate with it (checkpoints written, work lost per interruption,
the queue wait of a requeue); the launcher decides when to save from the same rule with the
checkpoint cost it measured. Pure: no Slurm, no torch.
"""

from __future__ import annotations

# Imports inside functions: durations, only to phrase a reason

import math
from typing import Any, NamedTuple

PRIOR_FAILURES_PER_NODE_HOUR = 419 / (54 * 24 * 2048)
PRIOR_NODE_HOURS = 100.0
#: never more often than this (a checkpoint every few seconds would be all the job does)
MIN_EVERY_S = 10.0


class Interruptions(NamedTuple):
    """What the job can expect: preemptions per hour of run time (its partition's), failures per
    node-hour (smoothed towards the prior), and where they came from."""
    preemptions_per_hour: float = 0.0
    failures_per_node_hour: float = PRIOR_FAILURES_PER_NODE_HOUR
    source: str = "prior"

    def per_hour(self, nodes: int) -> float:
        return self.preemptions_per_hour + self.failures_per_node_hour * max(1, nodes)

    def mtbf_s(self, nodes: int) -> float:
        rate = self.per_hour(nodes)
        return math.inf if rate <= 0 else 3600.0 / rate

    def record(self) -> dict[str, Any]:
        """plan.json's ``checkpoint_auto`` (the launcher reads it back with :func:`from_record`)."""
        return {"preemptions_per_hour": self.preemptions_per_hour,
                "failures_per_node_hour": self.failures_per_node_hour, "source": self.source}


def from_record(rec: dict[str, Any]) -> Interruptions:
    return Interruptions(float(rec.get("preemptions_per_hour") or 0.0),
                         float(rec.get("failures_per_node_hour") or 0.0), str(rec.get("source") or ""))


def smoothed(failures: float, node_hours: float, preemptions_per_hour: float) -> Interruptions:
    """The history's counts pulled towards the prior by PRIOR_NODE_HOURS of exposure."""
    rate = (failures + PRIOR_FAILURES_PER_NODE_HOUR * PRIOR_NODE_HOURS) / (max(0.0, node_hours) + PRIOR_NODE_HOURS)
    src = ("prior" if node_hours <= 0 else
           f"history: {failures:g} failure(s) in {node_hours:.3g} node-hour(s)")
    return Interruptions(max(0.0, preemptions_per_hour), rate, src)


class Every(NamedTuple):
    """How often to checkpoint, and which bound decided (for `pswift plan` and the launcher)."""
    seconds: float       # inf: never worth one (no interruption expected)
    young_daly_s: float
    io_s: float          # the write's seconds / the I/O share
    decided_by: str

    def line(self) -> str:
        from pipeswift_slurm.durations import duration
        if math.isinf(self.seconds):
            return "no interruption expected"
        return (f"the later of Young/Daly's {duration(self.young_daly_s)} and the file system's share's "
                f"{duration(self.io_s)}: {self.decided_by} decided")


def every(stall_s: float, write_s: float, mtbf_s: float, io_share: float) -> Every:
    """Seconds of training between two checkpoints: the later of Young/Daly's interval for what a
    checkpoint costs training (``stall_s``) and ``write_s / io_share`` for what it costs the file
    system, at least MIN_EVERY_S (see the module)."""
    io = max(write_s, stall_s) / max(io_share, 1e-6)
    if math.isinf(mtbf_s):
        return Every(math.inf, math.inf, io, "no interruption expected")
    yd = math.sqrt(2.0 * max(stall_s, 1e-3) * mtbf_s)
    seconds = max(MIN_EVERY_S, yd, io)
    by = "Young/Daly" if seconds == yd else "the file system's share" if seconds == io else "the floor"
    return Every(seconds, yd, io, by)


class Expected(NamedTuple):
    """A run's checkpoint terms: save every ``every_s`` (inf: only at the end and on a signal),
    ``checkpoints`` written, and the expected seconds interruptions add to the JCT."""
    every_s: float
    checkpoints: int
    interruptions: float
    loss_s: float
    why: str = ""


def expected(train_s: float, cost_s: float, nodes: int, setup_s: float, requeue_wait_s: float,
             inter: Interruptions, interval_s: float | None = None, io_share: float = 0.1) -> Expected:
    """The checkpoint terms of ``train_s`` seconds of training on ``nodes`` nodes, for a
    checkpoint that costs ``cost_s`` (to training and to the file system alike, as planned).
    ``interval_s``: the interval in seconds (None: :func:`every`'s). Each interruption costs a
    setup and half an interval of work (all of it without periodic checkpoints); a preemption
    also waits in the queue again (``requeue_wait_s``); a failure restarts inside the allocation."""
    why = ""
    if interval_s is None:
        rule = every(cost_s, cost_s, inter.mtbf_s(nodes), io_share)
        e, why = rule.seconds, rule.line()
    else:
        e = interval_s
    # the small epsilon: a step interval (k x step) divides steps x step exactly on paper
    n = math.floor(train_s / e * (1 + 1e-9)) + 1 if e > 0 and not math.isinf(e) else 1
    hours = train_s / 3600.0
    lost = min(e, train_s) / 2.0 if e > 0 else train_s / 2.0
    failures = inter.failures_per_node_hour * max(1, nodes) * hours
    preemptions = inter.preemptions_per_hour * hours
    loss = failures * (setup_s + lost) + preemptions * (setup_s + lost + requeue_wait_s)
    return Expected(e, n, failures + preemptions, loss, why)
