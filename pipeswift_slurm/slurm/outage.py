"""A controller outage is not a failure: while slurmctld does not answer (a restart, an upgrade,
a failover), what asks Slurm tries again with a growing wait, for up to :func:`budget_s`
seconds, says so once, and only then gives up with SlurmUnreachable (which callers that can go
on without Slurm's word catch). Retrying is tenacity's, imported only when an outage happens."""

from __future__ import annotations

# Imports inside functions: tenacity, only when Slurm does not answer

import os
import re
import sys
import time
from typing import Any, Callable, TypeVar

from pipeswift_slurm.errors import SlurmUnreachable

T = TypeVar("T")
#: $PSWIFT_SLURM_OUTAGE_S: 10 s for a command a user waits on; the batch script gives its job
#: (the launcher, the after-launch helper, the growth watcher, the requeue) 600 s, more than
#: Slurm's default SlurmctldTimeout (120 s)
ENV, DEFAULT_S = "PSWIFT_SLURM_OUTAGE_S", 10.0
#: what Slurm's clients and pyslurm say when slurmctld does not answer
_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out on send/recv|"
                          r"Zero Bytes were transmitted or received|Connection refused|"
                          r"Communication connection failure|backup controller in standby mode|"
                          r"Transport endpoint is not connected|"
                          # a slurmctld shutting down for a restart (state saved) answered a job's
                          # `scontrol requeue` so on 22.05 (CI, test_outage): within the retry
                          # budget it is the outage, after it the error it is
                          r"Unexpected message received")


def unreachable(text: str) -> bool:
    """Whether Slurm's words say slurmctld did not answer (rather than refused)."""
    return _UNREACHABLE.search(text) is not None


def budget_s() -> float:
    try:
        return max(0.0, float(os.environ.get(ENV, DEFAULT_S)))
    except ValueError:
        return DEFAULT_S


def _stderr(msg: str) -> None:
    print(f"pswift: {msg}", file=sys.stderr, flush=True)


#: who hears "Slurm unreachable, retrying" (stderr: the user's terminal, or the job's log)
notice: Callable[[str], None] = _stderr


#: when an outlast last gave up (time.monotonic()): for one budget after it, a call is tried once
#: and not waited on again (a command that asks Slurm several things pays the outage once)
_gave_up_at: float | None = None


def outlast(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, tried again while it raises SlurmUnreachable, for up to :func:`budget_s`
    counted from the first try (a try that blocks, as a library call may, counts too; no try
    begins that would end past the budget if it took as long as the longest so far). Once the
    budget is spent, calls for one more budget's length are tried once, without waiting."""
    global _gave_up_at
    began = time.monotonic()
    try:
        return fn(*args)
    except SlurmUnreachable as e:
        budget = budget_s()
        first_try_s = time.monotonic() - began
        if budget <= 0 or (_gave_up_at is not None and began - _gave_up_at < budget):
            raise
        if 2 * first_try_s > budget:    # a second try as long would end past the budget
            _gave_up_at = time.monotonic()
            raise
        notice(f"Slurm unreachable ({e}); retrying for up to {budget:.0f} s")
    import tenacity
    tries = [first_try_s]    # how long each try took: a try that blocks counts

    def timed(*a: Any) -> T:
        t0 = time.monotonic()
        try:
            return fn(*a)
        finally:
            tries.append(time.monotonic() - t0)

    def no_time_for_another(state: Any) -> bool:
        """Stop before a try that, as long as the longest so far, would end past the budget."""
        return time.monotonic() - began + (state.upcoming_sleep or 0.0) + max(tries) > budget

    retrying = tenacity.Retrying(retry=tenacity.retry_if_exception_type(SlurmUnreachable),
                                 wait=tenacity.wait_exponential(multiplier=1, max=15),
                                 stop=no_time_for_another, reraise=True)
    try:
        result = retrying(timed, *args)
    except SlurmUnreachable:
        _gave_up_at = time.monotonic()
        raise
    _gave_up_at = None
    notice(f"Slurm answers again ({what})")
    return result
