"""One attempt of the job on one rank: what the set-up built, which the training loop, its
growth watcher (growwatch.py) and the attempt's end share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeswift_slurm import events as events_schema
    from pipeswift_slurm.plan import LayoutSpec, Plan

    from .checkpointer import Checkpointer
    from .dist_env import DistEnv


@dataclass
class Attempt:
    """One attempt of the job on this rank: what setup built and the loop and finish use."""
    plan: Plan
    denv: DistEnv
    layout: LayoutSpec
    events: events_schema.Writer
    engine: Any = None
    dist: Any = None
    boundaries: list[int] = field(default_factory=list)
    checkpoints: Checkpointer = field(init=False)   # built by _setup, with the engine
    step: int = 0
    setup_s: float = 0.0
    load_s: float = 0.0
    grow_to: int = 0                 # rank 0: the node count a growth asks for
    trained_from: tuple[int, float] = (0, 0.0)   # (step, time) this attempt's training began
    hardware: dict[str, Any] = field(default_factory=dict)   # probe.measure's, for the start event
    weight_grads: Any = None         # ZB-H1's deferred weight gradients (zerobubble.WeightGrads)

    @property
    def rank(self) -> int:
        return self.denv.rank
