"""A hung rank is not a silent burn: every rank watches its own progress.

Pipeline ranks meet in a collective after every step, so one rank that stops making progress
(stopped, deadlocked, a dead GPU) blocks all of them until the time limit. Each rank runs a
:class:`Watchdog` thread: the training loop calls :meth:`Watchdog.beat` after every step, and
the thread writes a small heartbeat file every second (``run_dir/heartbeats/rank_N.json``:
node, last step, wall time), so a stopped process's heartbeat goes stale while a blocked but
live one's does not. When no step has finished for ``max(min_s, factor x p95 step time)`` the
thread reads all heartbeats: the suspect is the rank whose heartbeat is stale (else the one with
the fewest steps), and the lowest live other rank acts (one rank, never the stuck one): in a
batch job it leaves a record naming the rank, node and stall for the batch script's helper and
exits; srun (``--kill-on-bad-exit``) ends the other tasks, and the helper restarts the ranks in
the allocation from the last committed checkpoint, as for any fault (pipeswift_slurm.planning.decide: a
second hang on the same node requeues the job without that node). Launched by hand, it records
an ``end`` event ``reason = "hung"`` and asks Slurm to requeue the job itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pipeswift_slurm import events, runfiles
from pipeswift_slurm.codes import Exit, Stop
from pipeswift_slurm.planning import decide
from pipeswift_slurm.stats import quantile

from . import launchrec
from . import outcome

if TYPE_CHECKING:
    from pipeswift_slurm.plan import Plan

HEARTBEAT_EVERY_S = 1.0
STALE_S = 5.0    # a heartbeat older than this: that process is not running at all
HOLD_FACTOR = 4  # a checkpoint in progress may take this many times the limit


class Watchdog(threading.Thread):
    def __init__(self, run_dir: Path, rank: int, node: str, factor: float, min_s: float,
                 on_hang: Callable[[dict[str, Any]], None], launch: str = "0") -> None:
        super().__init__(name="pswift-watchdog", daemon=True)
        # one folder per launch (attempt and Slurm step): an earlier launch's heartbeats, stale by
        # now, would otherwise name a healthy rank's node; rank 0 clears the older folders
        root = run_dir / runfiles.HEARTBEATS
        self.dir = root / launch
        self.dir.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            for old in root.iterdir():
                if old.name != launch:
                    shutil.rmtree(old, ignore_errors=True) if old.is_dir() and not old.is_symlink() \
                        else old.unlink(missing_ok=True)
        self.rank, self.node, self.factor, self.min_s = rank, node, factor, min_s
        self.on_hang = on_hang
        self.times: deque[float] = deque(maxlen=200)
        self.last = time.monotonic()
        self.step = -1
        self.holding = False
        self.stopped = threading.Event()

    def limit(self) -> float:
        """Seconds without a finished step that count as hung."""
        if len(self.times) < 5:
            return self.min_s
        return max(self.min_s, self.factor * (quantile(self.times, 0.95) or 0.0))

    def beat(self, step: int, step_time: float) -> None:
        self.step, self.last = step, time.monotonic()
        self.times.append(step_time)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Work that is not a step and may take long (a checkpoint of a big model on a slow
        file system): allowed four times the limit; the clock restarts after it."""
        self.holding = True
        try:
            yield
        finally:
            self.last = time.monotonic()
            self.holding = False

    def _write_heartbeat(self) -> None:
        tmp = self.dir / f".rank_{self.rank}.tmp"
        tmp.write_text(json.dumps({"rank": self.rank, "node": self.node, "step": self.step,
                                   "time": time.time()}))
        os.replace(tmp, self.dir / f"rank_{self.rank}.json")

    def heartbeats(self) -> list[dict[str, Any]]:
        out = []
        for f in self.dir.glob("rank_*.json"):
            try:
                out.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_EVERY_S):
            try:
                self._write_heartbeat()
            except OSError:
                pass
            stalled = time.monotonic() - self.last
            if stalled <= self.limit() * (HOLD_FACTOR if self.holding else 1):
                continue
            now = time.time()
            beats = self.heartbeats()
            stale = [b for b in beats if now - b.get("time", 0) > STALE_S]
            pool = stale or beats
            suspect = min(pool, key=lambda b: (b.get("time", 0) if stale else b.get("step", 0),
                                               b.get("rank", 0)), default={})
            live = sorted(int(b.get("rank", 0)) for b in beats if b not in stale and b is not suspect)
            if live and live[0] != self.rank:
                continue   # another live rank acts
            self.on_hang({"suspect_rank": suspect.get("rank"), "suspect_node": suspect.get("node"),
                          "certain": bool(stale), "stalled_s": round(stalled, 1),
                          "limit_s": round(self.limit(), 1), "step": self.step})
            return

    def stop(self) -> None:
        self.stopped.set()


def end_attempt(run_dir: Path, plan: Plan, denv: Any, info: dict[str, Any]) -> None:
    """What the acting rank does about a hang. In a batch job: record it for the batch script's
    helper and end this launch (srun ends the others); the helper treats it as a fault (a
    restart in the allocation; a second hang on one node requeues without it). Launched by
    hand: decide says what follows (a requeue within the budget, without the suspect's node
    when it is certain); record the end, carry it out, and end this process; Slurm ends the
    others."""
    who = (f"rank {info['suspect_rank']} on node {info['suspect_node']} stopped running"
           if info["certain"] else "no rank could be singled out (blocked, not stopped)")
    msg = (f"no step finished for {info['stalled_s']} s (limit {info['limit_s']} s, after step "
           f"{info['step']}): {who}")
    if os.environ.get(launchrec.ENV):
        print(f"pswift: rank {denv.rank}: {msg}; ending this launch", flush=True)
        launchrec.hung(denv.rank, info["suspect_rank"] if info["certain"] else None,
                       info["suspect_node"] if info["certain"] else None, max(info["step"], 0), msg)
        os._exit(Exit.HUNG)
    stopped = decide.Stopped(Stop.HUNG, max(info["step"], 0), int(plan["training"]["steps"]),
                             hung_node=info["suspect_node"] if info["certain"] else None, hung_why=msg)
    d = decide.what_follows(stopped, outcome.budgets(plan, denv.attempt, denv.job_id))
    events.append(run_dir, "end", denv.attempt, denv.job_id, reason=d.reason, step=stopped.step,
                  requeue=d.requeue_by is not None, error=msg)
    print(f"pswift: rank {denv.rank}: {d.why}", flush=True)
    if d.requeue_by is not None:
        # the requeue's SIGTERM only sets this process's stop flag (signals.py); the Slurm
        # commands that follow it ignore it (slurm.requeue)
        try:
            if outcome.requeue(plan, denv.job_id, exclude=d.exclude):
                print(f"pswift: the next attempt will not use node {d.exclude}", flush=True)
        except Exception as e:  # the job still ends; Slurm's word is in the message
            print(f"pswift: requeue after the hang failed: {e}", flush=True)
    launchrec.exited(denv.rank, d.exit_code)   # the batch script follows: this launch ended itself
    os._exit(d.exit_code)
