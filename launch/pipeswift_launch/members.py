"""Epochs of a run made of members (issue 62: a Slurm job array, one task a member): before
each launch, which members train together and where each one's ranks sit. A member's batch
script runs ``python -m pipeswift_launch.members PLAN`` before every launch of its ranks
(pipeswift_slurm.slurm.sbatch.JOIN) and launches with the exports it prints.

Every member, before each launch of its ranks, takes a **seat** in the run's next **epoch**:
``RUN_DIR/members/epoch-E/seat-T.json`` (T: its array task), written once, whole, by this user
only. The first member that finds the epoch due **seals** it: ``sealed.json``, created once,
lists the fresh seats in task order. Each member then reads the seal: listed, it launches with
its ranks at the offset the seal gives it (the first seat holds rank 0, and rank 0 publishes
the rendezvous in the epoch's folder: :mod:`pipeswift_launch.rendezvous`); not listed (it sat
down as the seal was made), it takes a seat in the next epoch, which the running epoch's rank 0
sees (:func:`waiting`): the run grows at a step boundary when growing pays; where it does not,
rank 0 declines the member (:func:`decline`), which then ends and gives its nodes back rather
than hold them idle.

An epoch is due when its seats hold the node range's bottom and every expected member sat down
(at the start all the array lets run at once, plan.json's ``members_at_once``; later those of
the last epoch that did not say they left), or when the first seat waited ``member_wait_s``
(at the start) or ``REJOIN_WAIT_S`` (later; where every member left, no longer than the run's
relaunch: :func:`seat_wait`) (:func:`due`); an epoch after the first, only once the one before
is over (:func:`before_ended`): a member back from the queue waits while the run trains, and
joins when rank 0 grows the run. A seat is fresh while its member keeps touching it. A member
whose epoch ended (a peer preempted or dead, a member waiting to join) joins the next one: the
epoch after the newest sealed one. The records' reading side is
:mod:`pipeswift_slurm.memberfiles`. No torch here.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeswift_slurm import events
from pipeswift_slurm.errors import PswiftError
from pipeswift_slurm.memberfiles import (DONE, FOLDER, FRESH_S, SEALED, Epoch, MembersError, Seat, declined_mark,
                                        epoch_dir, finished, left_mark, newest_sealed, seats, sealed, waiting)
from pipeswift_slurm.plan import members_at_once, read_plan, runnable
from pipeswift_slurm.slurm.records import expand_hostlist
from pipeswift_slurm.userfiles import create_private

#: the records' reading side lives in pipeswift_slurm.memberfiles (`pswift status` reads them too)
__all__ = ["DONE", "FOLDER", "FRESH_S", "SEALED", "Epoch", "MembersError", "Seat", "before_ended", "decline", "due",
           "epoch_dir", "expected", "exports", "finish", "finished", "join", "leave", "main", "newest_sealed",
           "relaunch_s", "seat_wait", "seats", "sealed", "waiting", "REJOIN_WAIT_S"]


def due(seats: list[Seat], expected: set[int], lo_nodes: int, now: float, wait_s: float) -> bool:
    """Whether an epoch with these fresh ``seats`` is to be sealed at ``now``: they hold
    ``lo_nodes`` nodes, and every ``expected`` member sat down or the first expected one to sit
    down waited ``wait_s`` (a member back from the queue sits down while the epoch before still
    trains: its seat does not start the wait, or the epoch would be sealed the moment the one
    before ended, before its members sat down again)."""
    if not seats or sum(len(s.nodes) for s in seats) < lo_nodes:
        return False
    clock = [s.at for s in seats if s.task in expected] or [s.at for s in seats]
    return expected <= {s.task for s in seats} or now - min(clock) >= wait_s


def expected(run_dir: Path, number: int, members: int) -> set[int]:
    """The members epoch ``number`` waits for: at the start every one, later those of the
    epoch before that did not say they left (:func:`leave`), or every one where all left."""
    before = sealed(run_dir, number - 1) if number > 0 else None
    if before is None:
        return set(range(members))
    gone = {t for t in (s.task for s in before.seats) if left_mark(before.folder, t).exists()}
    stayed = {s.task for s in before.seats} - gone
    return stayed or set(range(members))   # every member left (all preempted): as at the start


def seat_wait(run_dir: Path, number: int, wait_s: float) -> float:
    """How long epoch ``number``'s first seat waits for the members it expects (:func:`expected`)
    before sealing without them: at the start ``member_wait_s``; later REJOIN_WAIT_S, as a member
    still in the run sits down again within seconds (its launch's end) and one that died never
    will; where every member of the last epoch left (each preempted or requeued, back from the
    queue at its own time), no longer than the run's relaunch costs (its newest launch's setup
    and restore): waiting longer for a member still in the queue costs the members present more
    than starting without it and growing onto it when it comes."""
    if number == 0:
        return wait_s
    limit = min(wait_s, REJOIN_WAIT_S)
    before = sealed(run_dir, number - 1)
    if before is None or not all(left_mark(before.folder, s.task).exists() for s in before.seats):
        return limit
    return min(limit, relaunch_s(run_dir))


def relaunch_s(run_dir: Path) -> float:
    """The run's newest launch's setup and restore seconds (its ``start`` event); REJOIN_WAIT_S
    before any launch, or with no readable start."""
    newest = None
    try:
        for e in events.stream(run_dir, ("start",)):
            newest = e
    except (OSError, PswiftError):
        return REJOIN_WAIT_S
    if newest is None:
        return REJOIN_WAIT_S
    return float(newest.get("setup_s") or 0.0) + float(newest.get("load_s") or 0.0)


def before_ended(run_dir: Path, number: int, fresh: list[Seat]) -> bool:
    """Whether the epoch before ``number`` is over, so ``number`` may be sealed: a member of it
    sat down again (a member re-seats only once its launch ended, and every launch of an epoch
    ends together), or every member of it left. A member that was not in it (returning from
    the queue) waits while it trains: the running epoch's rank 0 sees it waiting and grows the
    run at a step boundary when growing pays; sealing without them would start a second
    training beside the first."""
    before = sealed(run_dir, number - 1) if number > 0 else None
    if before is None:
        return True
    tasks = {s.task for s in before.seats}
    gone = {t for t in tasks if left_mark(before.folder, t).exists()}
    return bool(tasks & {s.task for s in fresh}) or gone == tasks


def leave(epoch_folder: Path, task: int) -> None:
    """Member ``task`` leaves the epoch it trained in (preempted, cancelled, out of time): the
    next epoch does not wait for it (without the mark, REJOIN_WAIT_S for it)."""
    _mark(left_mark(epoch_folder, task))


def decline(epoch_folder: Path, task: int) -> None:
    """The running epoch's rank 0 does not take member ``task``, seated in ``epoch_folder``:
    growing would not pay (grow.choose). The member gives its nodes back (:func:`join`)."""
    _mark(declined_mark(epoch_folder, task))


def finish(run_dir: Path) -> None:
    """The run trained every step: a member that comes back (requeued) ends at once."""
    _mark(run_dir / FOLDER / DONE)


def _mark(path: Path) -> None:
    """An empty file of this user's at ``path`` (not through a link); a mark that cannot be
    made is only a longer wait for the others."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass


def _private_dirs(run_dir: Path, number: int) -> Path:
    """The epoch's folder, made where missing: it and ``members/`` each this user's own folder,
    not a link."""
    path = run_dir
    for part in (FOLDER, f"epoch-{number}"):
        path = path / part
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise MembersError(f"{path} is not this user's folder (a link is not followed): remove it and launch again")
    return path


def _write_once(path: Path, record: dict[str, Any]) -> bool:
    """``record`` as ``path``, whole, readable by this user only; False when it exists."""
    return create_private(path, json.dumps(record).encode())


#: how long an epoch after the first waits for a member of the last that did not say it left
REJOIN_WAIT_S = 20.0


def join(run_dir: Path, task: int, job_id: str, nodes: tuple[str, ...], ranks: int, members: int,
         lo_nodes: int, wait_s: float, timeout_s: float, poll_s: float = 0.2) -> Epoch | None:
    """Take a seat in the next epoch and return it once sealed with this member in it (a seal
    made without it: the epoch after); None once the run is done, or when the running epoch
    declined this member (:func:`decline`: its nodes are worth more to the cluster). Raises
    MembersError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    newest = newest_sealed(run_dir)
    number = 0 if newest is None else newest + 1
    while time.monotonic() < deadline:
        folder = _private_dirs(run_dir, number)
        mine = folder / f"seat-{task}.json"
        seat = Seat(task, job_id, tuple(nodes), ranks, time.time())
        if not _write_once(mine, asdict(seat)):
            os.utime(mine, follow_symlinks=False)   # a seat of an earlier try of this member: fresh again
        waited_for, limit = expected(run_dir, number, members), seat_wait(run_dir, number, wait_s)
        while time.monotonic() < deadline:
            if finished(run_dir):
                return None
            epoch = sealed(run_dir, number)
            fresh = seats(run_dir, number, time.time()) if epoch is None else []
            if fresh and due(fresh, waited_for, lo_nodes, time.time(), limit) and before_ended(run_dir, number, fresh):
                _write_once(folder / SEALED, {"seats": [asdict(s) for s in fresh]})
                epoch = sealed(run_dir, number)
            if epoch is not None:
                if any(s.task == task for s in epoch.seats):
                    return epoch
                break          # sealed without this member: the next epoch
            if declined_mark(folder, task).exists():
                return _withdraw(run_dir, number, task, mine, poll_s)
            os.utime(mine, follow_symlinks=False)
            time.sleep(poll_s)
        number += 1
    raise MembersError(f"member {task} found no epoch to train in within {timeout_s:.0f} s: fewer than "
                       f"{lo_nodes} node(s) of members came; lower [resources] nodes' bottom or wait for the queue")


#: the longest from a seal's maker reading the seats to the seal on disk (a read, a write)
SEAL_S = 5.0


def _withdraw(run_dir: Path, number: int, task: int, seat: Path, poll_s: float) -> Epoch | None:
    """Member ``task``, declined, leaves epoch ``number``: its seat is removed, and once no seal
    made from a read before that can still appear (SEAL_S), None: its job ends and its nodes go
    back to the cluster. A seal that took it first (the running epoch ended just then) is
    returned, and the member trains."""
    try:
        seat.unlink()
    except OSError:
        pass
    until = time.monotonic() + SEAL_S
    while True:
        epoch = sealed(run_dir, number)
        if epoch is not None or time.monotonic() >= until:
            return epoch if epoch is not None and any(s.task == task for s in epoch.seats) else None
        time.sleep(poll_s)


#: how long a member waits for an epoch before it gives up (its job ends; the others go on)
JOIN_TIMEOUT_S = 3600.0


def exports(epoch: Epoch, task: int) -> str:
    """The batch script's shell for this member's next launch: its ranks' place in ``epoch``."""
    values = {"PSWIFT_EPOCH": str(epoch.number), "PSWIFT_RENDEZVOUS_DIR": str(epoch.folder),
              "PSWIFT_RANK_OFFSET": str(epoch.offset(task)), "PSWIFT_WORLD_SIZE": str(epoch.world_size),
              "PSWIFT_RUN_NODES": str(epoch.nodes)}
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


def main(argv: list[str]) -> int:
    """``python -m pipeswift_launch.members PLAN``: the batch script of a member, before each
    launch: prints the exports of its place in the run's next epoch, or ``done``."""
    if len(argv) != 1:
        print("usage: python -m pipeswift_launch.members RUN_DIR/plan.json", file=sys.stderr)
        return 2
    try:
        plan = runnable(read_plan(argv[0]), argv[0])
        env = os.environ
        if not env.get("SLURM_ARRAY_TASK_ID") or not env.get("SLURM_JOB_ID"):
            raise MembersError("this is not a task of a job array ($SLURM_ARRAY_TASK_ID is unset): a run of "
                               "members runs as the array `pswift sbatch` submits")
        task, job_id = int(env["SLURM_ARRAY_TASK_ID"]), env["SLURM_JOB_ID"]
        nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", ""))
        ranks = int(env.get("SLURM_NTASKS") or len(nodes))
        lo = min(int(n) for n in plan["layouts"])
        epoch = join(Path(plan["run_dir"]), task, job_id, nodes, ranks, members_at_once(plan), lo,
                     float(plan["member_wait_s"]), JOIN_TIMEOUT_S)
    except (PswiftError, MembersError, ValueError) as e:
        print(f"pswift: member of the run cannot join it: {e}", file=sys.stderr, flush=True)
        return 1
    if epoch is None:
        why = ("the run has trained every step" if finished(Path(plan["run_dir"])) else
               "the run does not grow onto it (growing would not pay; the launcher's log says why) and its "
               "node(s) go back to the cluster")
        print(f"pswift: job {job_id}: {why}; this member ends", file=sys.stderr, flush=True)
        print(DONE, flush=True)
        return 0
    print(f"pswift: job {job_id}: member {task} trains in epoch {epoch.number} with members "
          f"{','.join(str(s.task) for s in epoch.seats)} ({epoch.nodes} node(s), ranks from {epoch.offset(task)})",
          file=sys.stderr, flush=True)
    print(exports(epoch, task), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
