"""Where rank 0's steps spend their wall time, part by part: the engine's ``train_batch`` and each
of pswift's own hooks around it, summed over the steady steps (after the first profile window)
and written once at the end of a launch as a ``step_parts`` event, in seconds per step.

bench/overhead.py weighs these against a bare DeepSpeed loop's whole steps: what pswift adds
to a step is the parts that are not ``data`` or ``train_batch`` (which the bare loop does too).
Each lap costs two ``perf_counter`` calls (~0.1 µs); nothing here waits or synchronises.
"""

from __future__ import annotations

import time
from typing import Callable

#: the parts of one step, in the order the loop runs them: the micro-batches built, the engine's
#: step, the watchdog's beat, the step's event (and the metrics sinks it feeds: "metrics"), a
#: validation, the layer profile's end (a proposal, the growth watcher), the flags every rank
#: agrees on, and the step's end (a checkpoint due, a re-layout)
PARTS = ("data", "train_batch", "watchdog", "events", "metrics", "eval", "profile", "flags", "step_end")


class StepParts:
    """Laps of one rank's steps; counts only while :attr:`counting` (set by the loop)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.steps = 0
        self.counting = False
        self._t = clock()
        self._carved = 0.0

    def begin(self, counting: bool) -> None:
        """A step starts now; it counts when ``counting``."""
        self.counting = counting
        self.steps += counting
        self._t = self.clock()

    def lap(self, part: str, carved_total: float | None = None) -> None:
        """The time since the last lap was ``part``'s; of it, what the cumulative counter
        ``carved_total`` (seconds the metrics sinks spent, counted by the events writer) grew
        by since the last call that gave it goes to ``metrics`` instead."""
        now = self.clock()
        if self.counting:
            spent = now - self._t
            if carved_total is not None:
                carved = min(max(carved_total - self._carved, 0.0), spent)
                self.seconds["metrics"] += carved
                spent -= carved
            self.seconds[part] += spent
        if carved_total is not None:
            self._carved = carved_total
        self._t = now

    def per_step(self) -> dict[str, float]:
        """Seconds per counted step of each part (rounded to the microsecond); {} before any."""
        if not self.steps:
            return {}
        return {part: round(s / self.steps, 6) for part, s in self.seconds.items()}
