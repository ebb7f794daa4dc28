"""The time limits a job asks Slurm for, and the USR2 lead before them (pure functions).

A pswift job survives its time limit: USR2 comes ``signal_lead_s`` before it, the job writes a
stage-consistent checkpoint and requeues itself. So it need not ask for the hours a user writes
to be safe. With ``[job] time_policy = "predicted"`` (the default) it asks for what the planner
predicts it needs, and lets backfill start it in a shorter hole:

- ``--time``: the chosen layout's 90th percentile of its time on the nodes (setup, training,
  checkpoints, interruptions) x ``MARGIN`` plus the USR2 lead, in whole minutes, capped by
  ``[job] time`` when the TOML gives one;
- ``--time-min``: the least time in which an attempt makes progress worth its setup: setup,
  two checkpoint intervals (or ``PROGRESS_SETUPS`` setups of training without periodic ones)
  and the lead;
- a requeued attempt asks for the remaining prediction (``remaining``): the steps left at the
  step time this attempt measured, x ``MARGIN``, plus setup, a checkpoint, the lead and Slurm's
  slack (the signal may come up to a minute early).

Each limit is at least twice the lead, so the signal always falls in the attempt's second
half. ``"as_written"`` copies ``[job] time`` (and Slurm's partition default without one).
"""

from __future__ import annotations

import math

from pipeswift_slurm.codes import to_stop_s
from pipeswift_slurm.slurm.timespec import slurm_minutes
from pipeswift_slurm.durations import duration
from pipeswift_slurm.slurm.sbatch import Limits

#: a predicted limit covers the predicted 90th percentile times this (a limit too short costs a
#: requeue: a setup and a queue wait; too long only narrows the holes backfill can use)
MARGIN = 1.25
#: Slurm checks time limits periodically: --signal may arrive up to about a minute off
SIGNAL_SLACK_S = 60
#: without periodic checkpoints, an attempt is worth its setup when it trains this many setups
PROGRESS_SETUPS = 4


def whole_minutes(seconds: float) -> int:
    """``seconds`` rounded up to Slurm's unit, a whole minute (at least one), in seconds."""
    return int(slurm_minutes(seconds)) * 60


def lead_wanted(checkpoint_s: float, step_s: float = 0.0) -> int:
    """Seconds before the limit USR2 must come: the steps to the stop (codes.to_stop_s), the
    checkpoint, Slurm's slack."""
    return math.ceil(checkpoint_s + to_stop_s(step_s) + SIGNAL_SLACK_S)


def signal_lead(wanted_s: int, limit_s: int) -> int:
    """The lead for a limit: what is wanted, at least 10 s and at most half the limit."""
    return max(10, min(wanted_s, limit_s // 2))


def as_written(user_s: int | None, lead_s: int, why: str = "") -> Limits:
    if user_s is None:
        return Limits(None, None, None, why or "no [job] time: the partition's default limit, no USR2")
    return Limits(user_s, None, signal_lead(lead_s, user_s), why or f"[job] time as written ({duration(user_s)})")


def predicted(user_s: int | None, held_p90_s: float, setup_s: float, lead_s: int,
              checkpoint_every_s: float = math.inf) -> Limits:
    """The limits from a prediction: its p90 on the nodes, its setup, the USR2 lead wanted and
    the periodic checkpoint interval (inf: none)."""
    floor = whole_minutes(2 * lead_s)
    want = max(whole_minutes(held_p90_s * MARGIN + lead_s), floor)
    time_s = min(want, user_s) if user_s is not None else want
    progress = 2 * checkpoint_every_s if math.isfinite(checkpoint_every_s) else PROGRESS_SETUPS * setup_s
    time_min_s: int | None = min(max(whole_minutes(setup_s + progress + lead_s), floor), time_s)
    if time_min_s == time_s:
        time_min_s = None
    why = (f"predicted: p90 {duration(held_p90_s)} on the nodes x {MARGIN:g} + USR2 lead {lead_s} s = {duration(want)}"
           + (f", within [job] time {duration(user_s)}" if user_s is not None and user_s >= want else
              f", capped by [job] time {duration(user_s)}" if user_s is not None else "")
           + (f"; --time-min {duration(time_min_s)} (setup + {'two checkpoint intervals' if math.isfinite(checkpoint_every_s) else f'{PROGRESS_SETUPS} setups of training'} + lead)"
              if time_min_s else ""))
    lead = signal_lead(lead_s, time_min_s or time_s)
    return Limits(time_s, time_min_s, lead, why)


def remaining(steps_left: int, step_wall_s: float, setup_s: float, checkpoint_s: float,
              lead_s: int, user_s: int | None) -> int:
    """A requeued attempt's limit: the steps left at this attempt's wall time per step, x MARGIN,
    plus a setup, a checkpoint, the USR2 lead and Slurm's slack; at least twice the lead, at most
    [job] time."""
    want = max(whole_minutes(setup_s + steps_left * step_wall_s * MARGIN + checkpoint_s + lead_s + SIGNAL_SLACK_S),
               whole_minutes(2 * lead_s))
    return min(want, user_s) if user_s is not None else want


def describe(lim: Limits) -> str:
    """One line: what is asked of Slurm, and why."""
    if lim.time_s is None:
        return f"time limit: none asked ({lim.why})"
    asked = f"--time={slurm_minutes(lim.time_s)}" + (f" --time-min={slurm_minutes(lim.time_min_s)}" if lim.time_min_s else "")
    return f"time limit: {asked} (minutes), USR2 {lim.signal_lead_s} s before it; {lim.why}"
