"""The codes an attempt ends with: the launcher's exit codes (what the batch script and
``pswift run`` read) and the ranks' stop codes (what they agree on at a step boundary). A
contract between the job's processes: it imports nothing."""

from __future__ import annotations

from enum import Enum, IntEnum


class Exit(IntEnum):
    """A launcher's (and so srun's) exit code that says how the launch ended by itself."""
    OK = 0
    FAILED = 1
    #: the launch refused to train at all: a node count plan.json has no layout for, a plan or
    #: an environment it cannot run, an install without the training side
    REFUSED = 2
    #: the attempt is beyond ``[job] max_requeues``, or stopped with none left: not requeued
    BUDGET_SPENT = 3
    #: the launcher re-balanced its stages and committed a checkpoint: launch again in place
    RELAYOUT = 75
    #: the watchdog found a rank hung and ended the launch (a fault, restarted like one)
    HUNG = 76
    #: a run of members: another member left (or one waits to join) and this member's ranks
    #: committed the checkpoint with the others: launch again in the run's next epoch
    REJOIN = 77


class Stop(IntEnum):
    """Why the ranks stop training at a step boundary. NONE to TIME are agreed across the ranks
    by all-reduce(MAX): the larger wins (a signal over a growth rank 0 asked for; the time limit
    first). RELAYOUT and HUNG are never all-reduced: every rank learns a re-layout from rank 0's
    proposal, and a hang is one watchdog's."""
    NONE = 0
    GROW = 1
    TERM = 2     # SIGTERM/SIGINT: a preemption or a cancellation (Slurm tells which)
    TIME = 3     # SIGUSR2: the time limit is near
    RELAYOUT = 99
    HUNG = 98


#: steps shorter than this (the slowest rank's) agree on the flags above a step late
#: (pipeswift_launch.collectives.StepFlags.post): no step's end waits for the slowest rank, and
#: a stop or a checkpoint waits one more step, at most this long (a stop every rank was signalled
#: during the step, as Slurm signals every task at once, does not: StepFlags.early). Longer steps
#: agree at their own end, where that wait is a smaller share of the step than a step is of a
#: GraceTime.
POSTED_BELOW_S = 1.0


def to_stop_s(step_s: float) -> float:
    """Seconds from a signal to the step boundary where every rank stops, at most: the step in
    flight, and where steps agree a step late, the next one (where a step's end falls between
    the ranks' signals)."""
    return step_s + (step_s if step_s < POSTED_BELOW_S else 0.0)


class Action(str, Enum):
    """What follows an attempt's stop or a launch's end (``planning.decide.Decision.action``);
    each equals its word, the one the events and the tests read."""
    DONE = "done"          # exit with the decision's code, nothing more
    RELAUNCH = "relaunch"  # start the ranks again in this allocation, after a back-off
    RELAYOUT = "relayout"  # the same, on plan.json's new cut
    REJOIN = "rejoin"      # a run of members changed: launch again in its next epoch
    SHRINK = "shrink"      # start them again on the nodes the allocation has left
    REQUEUE = "requeue"    # give the allocation back; the job queues again
    GROW = "grow"          # a requeue for more nodes
    FAIL = "fail"          # end the job with the decision's code

    def __str__(self) -> str:
        return self.value
