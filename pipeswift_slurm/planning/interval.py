"""How often a job checkpoints when ``[training] checkpoint_interval = "auto"`` (the default):
Young's and Daly's first-order optimum, every ``sqrt(2 * C * M)`` seconds of training, for a
checkpoint that costs ``C`` seconds and interruptions ``M`` seconds apart on average.

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

import math
from dataclasses import dataclass
from typing import Any

PRIOR_FAILURES_PER_NODE_HOUR = 419 / (54 * 24 * 2048)
PRIOR_NODE_HOURS = 100.0
#: never more often than this (a checkpoint every few seconds would be all the job does)
MIN_EVERY_S = 10.0


@dataclass(frozen=True)
class Interruptions:
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


def every_s(cost_s: float, mtbf_s: float) -> float:
    """Young/Daly: seconds of training between two checkpoints (inf: never worth one)."""
    if math.isinf(mtbf_s):
        return math.inf
    return max(MIN_EVERY_S, math.sqrt(2.0 * max(cost_s, 1e-3) * mtbf_s))


@dataclass(frozen=True)
class Expected:
    """A run's checkpoint terms: save every ``every_s`` (inf: only at the end and on a signal),
    ``checkpoints`` written, and the expected seconds interruptions add to the JCT."""
    every_s: float
    checkpoints: int
    interruptions: float
    loss_s: float


def expected(train_s: float, cost_s: float, nodes: int, setup_s: float, requeue_wait_s: float,
             inter: Interruptions, every: float | None = None) -> Expected:
    """The checkpoint terms of ``train_s`` seconds of training on ``nodes`` nodes. ``every``:
    the interval in seconds (None: Young/Daly's). Each interruption costs a setup and half an
    interval of work (all of it without periodic checkpoints); a preemption also waits in the
    queue again (``requeue_wait_s``); a failure restarts inside the allocation."""
    e = every_s(cost_s, inter.mtbf_s(nodes)) if every is None else every
    # the small epsilon: a step interval (k x step) divides steps x step exactly on paper
    n = math.floor(train_s / e * (1 + 1e-9)) + 1 if e > 0 and not math.isinf(e) else 1
    hours = train_s / 3600.0
    lost = min(e, train_s) / 2.0 if e > 0 else train_s / 2.0
    failures = inter.failures_per_node_hour * max(1, nodes) * hours
    preemptions = inter.preemptions_per_hour * hours
    loss = failures * (setup_s + lost) + preemptions * (setup_s + lost + requeue_wait_s)
    return Expected(e, n, failures + preemptions, loss)
