"""srun's report of its tasks (its stderr: "srun: error: node2: task 1: Killed"), read here and
written here: the batch script's helper and the launch watch read a real srun's, and `pswift
run` writes the same words for its local processes, so one reader decides both."""

from __future__ import annotations

import re
import signal
from typing import NamedTuple

_SRUN_TASK = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<ranks>[\d,\-]+): (?P<what>.+?)\s*$")
_LAUNCH_FAILED = re.compile(r"^srun: error: Task launch for \S+ failed on node (?P<node>[^\s:]+): (?P<what>.+?)\s*$")
#: srun could not create the launch's step: the job is completing (preempted, requeued, cancelled)
_STEP_REFUSED = re.compile(r"^srun: error: Unable to create step for job \S+: (?P<what>.*already completing or "
                           r"completed.*?)\s*$")

#: the most ranks a launch has (a rank number srun reports beyond it is no rank of ours)
MAX_RANKS = 1 << 20


class Ended(NamedTuple):
    """One task srun reports ended badly: ``how`` ("exit N", "signal 9", "lost", or srun's word
    in lower case), its rank and node when srun names them, srun's words when it could not
    launch."""
    how: str
    rank: int | None = None
    node: str | None = None
    error: str | None = None


def _rank(digits: str) -> int | None:
    """A rank srun wrote, or None past MAX_RANKS (a 4,301-digit number would raise in int())."""
    return int(digits) if digits.isdigit() and len(digits) <= 7 and int(digits) < MAX_RANKS else None


def heard(text: str, ranks: int = MAX_RANKS) -> set[int]:
    """Every rank below ``ranks`` (the launch's world) srun reported the end of ("node2: tasks
    0-3,5: Terminated"), however it ended. A range is cut to the world: "tasks 0-20000000"
    costs a world's ranks, not 20 million."""
    out: set[int] = set()
    top = min(ranks, MAX_RANKS) - 1
    for line in text.splitlines():
        m = _SRUN_TASK.match(line)
        for part in (m.group("ranks").split(",") if m else []):
            lo_s, _, hi_s = part.partition("-")
            lo = _rank(lo_s)
            if lo is None or lo > top or not (hi_s.isdigit() or not hi_s):
                continue
            hi = lo if not hi_s else top if len(hi_s) > 7 else int(hi_s)
            out.update(range(lo, min(hi, top) + 1))
    return out


def ended_badly(text: str) -> list[Ended]:
    """The tasks srun reports ended badly, in its order; tasks it merely terminated after the
    first (kill-on-bad-exit) are left out; a node srun could not launch on is lost."""
    out: list[Ended] = []
    for line in text.splitlines():
        launch = _LAUNCH_FAILED.match(line)   # srun could not reach the node: it is lost
        if launch is not None:
            out.append(Ended(how="lost", node=launch.group("node"), error=launch.group("what")))
            continue
        m = _SRUN_TASK.match(line)
        if m is None:
            continue
        what = m.group("what")
        if what in ("Terminated",):     # srun's own SIGTERM to the others: a consequence
            continue
        code = re.match(r"Exited with exit code (\d+)", what)
        how = (f"exit {code.group(1)}" if code else "signal 9" if what == "Killed"
               else "lost" if "node failure" in what.lower() or "unknown" in what.lower() else what.lower())
        first = re.match(r"\d+", m.group("ranks"))
        out.append(Ended(how=how, rank=_rank(first.group()) if first else None, node=m.group("node")))
    return out


def job_ending(text: str) -> str | None:
    """Slurm's words when srun could not create the launch's step because the job is already
    completing or completed (preempted, requeued or cancelled between two launches); None
    otherwise. No rank ran: nothing failed, and nothing is to be launched again."""
    for line in text.splitlines():
        m = _STEP_REFUSED.match(line)
        if m is not None:
            return m.group("what")
    return None


def exit_code(codes: list[int]) -> int:
    """srun's exit code for tasks that ended with ``codes`` (a negative one: killed by that
    signal): the largest a task exited with by itself, else the signal that killed one as 128 +
    it; the SIGTERM that stops the others after it (--kill-on-bad-exit) counts only when nothing
    else ended the launch."""
    own = [c for c in codes if c > 0]
    killed = [128 - c for c in codes if c < 0 and c != -signal.SIGTERM]
    return max(own or killed or [128 + signal.SIGTERM for c in codes if c == -signal.SIGTERM] or [0])


def report(node: str, codes: list[int]) -> str:
    """How each task on ``node`` that did not finish ended, in srun's words: a task the others'
    failure stopped (SIGTERM) is srun's own termination."""
    lines = []
    for rank, c in enumerate(codes):
        if c < 0:
            what = "Killed" if -c == signal.SIGKILL else "Terminated" if -c == signal.SIGTERM \
                else signal.Signals(-c).name
            lines.append(f"srun: error: {node}: task {rank}: {what}\n")
        elif c != 0:
            lines.append(f"srun: error: {node}: task {rank}: Exited with exit code {c}\n")
    return "".join(lines)
