"""A run of members' records in its run directory (issue 62), read: the epochs sealed, each
one's seats (which member, its Slurm job, its nodes and ranks), who waits to join, whether the
run is done. The contract between a member's batch-script helper and training ranks that write
them (pipeswift_launch.members) and whoever reads them (the launcher, `pswift status`): every
record one JSON file, this user's only, not a link, bounded."""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FOLDER = "members"
SEALED = "sealed.json"
DONE = "done"
#: a seat not touched for this long belongs to a member that left before the epoch was sealed
FRESH_S = 30.0
#: the most of a seat or a seal that is read
READ_MAX = 64 * 1024


class MembersError(RuntimeError):
    """The member cannot join an epoch (one line: what is wrong and what to change)."""


@dataclass(frozen=True)
class Seat:
    """One member's place in an epoch: its array task, its Slurm job, its nodes and how many
    ranks it runs, and when it sat down (time.time())."""
    task: int
    job_id: str
    nodes: tuple[str, ...]
    ranks: int
    at: float


@dataclass(frozen=True)
class Epoch:
    """A sealed epoch: its number, its folder (the ranks' rendezvous) and its seats in task order."""
    number: int
    folder: Path
    seats: tuple[Seat, ...]

    @property
    def world_size(self) -> int:
        return sum(s.ranks for s in self.seats)

    @property
    def nodes(self) -> int:
        return sum(len(s.nodes) for s in self.seats)

    def offset(self, task: int) -> int:
        """The global rank of member ``task``'s first rank (its ranks follow it)."""
        before = 0
        for s in self.seats:
            if s.task == task:
                return before
            before += s.ranks
        raise MembersError(f"member {task} has no seat in epoch {self.number}")


def _read(path: Path) -> tuple[Any, float] | None:
    """A JSON record of this user's, not a link, bounded, and its mtime; None when absent or
    not such a record (a half-made or foreign file counts as none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        blob = f.read(READ_MAX + 1)
    try:
        return (json.loads(blob), st.st_mtime) if len(blob) <= READ_MAX else None
    except ValueError:
        return None


def _seat_of(rec: Any) -> Seat | None:
    try:
        seat = Seat(task=int(rec["task"]), job_id=str(rec["job_id"]), nodes=tuple(str(n) for n in rec["nodes"]),
                    ranks=int(rec["ranks"]), at=float(rec["at"]))
    except (KeyError, TypeError, ValueError):
        return None
    return seat if seat.task >= 0 and seat.ranks >= 1 and seat.nodes else None


def epoch_dir(run_dir: Path, number: int) -> Path:
    return run_dir / FOLDER / f"epoch-{number}"


def sealed(run_dir: Path, number: int) -> Epoch | None:
    """Epoch ``number`` as sealed; None when it is not (yet)."""
    folder = epoch_dir(run_dir, number)
    got = _read(folder / SEALED)
    if got is None or not isinstance(got[0], dict) or not isinstance(got[0].get("seats"), list):
        return None
    seats = [_seat_of(r) for r in got[0]["seats"]]
    if not seats or any(s is None for s in seats):
        return None
    return Epoch(number, folder, tuple(s for s in seats if s is not None))


def newest_sealed(run_dir: Path) -> int | None:
    """The number of the newest sealed epoch; None before the first."""
    try:
        names = os.listdir(run_dir / FOLDER)
    except OSError:
        return None
    numbers = sorted((int(n[6:]) for n in names if n.startswith("epoch-") and n[6:].isdigit()), reverse=True)
    return next((n for n in numbers if (epoch_dir(run_dir, n) / SEALED).exists()), None)


def seats(run_dir: Path, number: int, now: float) -> list[Seat]:
    """The fresh seats of epoch ``number`` (touched within FRESH_S of ``now``), in task order."""
    folder = epoch_dir(run_dir, number)
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("seat-") and n.endswith(".json"))
    except OSError:
        return []
    out = {}
    for name in names:
        got = _read(folder / name)
        seat = _seat_of(got[0]) if got else None
        if seat is not None and got is not None and now - got[1] <= FRESH_S and name == f"seat-{seat.task}.json":
            out[seat.task] = seat
    return [out[t] for t in sorted(out)]


def waiting(run_dir: Path, running: int) -> list[Seat]:
    """Members seated for the epoch after ``running`` (the one training) that do not train in
    it (back from the queue, or late): the run may grow onto them. A member of ``running`` sits
    down there too once its launch ended, and holds no node more."""
    epoch = sealed(run_dir, running)
    inside = {s.task for s in epoch.seats} if epoch is not None else set()
    return [s for s in seats(run_dir, running + 1, time.time()) if s.task not in inside]


def left_mark(epoch_folder: Path, task: int) -> Path:
    """Where member ``task`` says it left the epoch in ``epoch_folder`` (pipeswift_launch.members.leave)."""
    return epoch_folder / f"left-{task}"


def declined_mark(epoch_folder: Path, task: int) -> Path:
    """Where the running epoch's rank 0 says it does not take member ``task``, seated in
    ``epoch_folder`` (pipeswift_launch.members.decline): growing would not pay."""
    return epoch_folder / f"declined-{task}"


def finished(run_dir: Path) -> bool:
    return os.path.lexists(run_dir / FOLDER / DONE)


def summary(run_dir: Path) -> dict[str, Any] | None:
    """A run of members as `pswift status` shows it: the newest sealed epoch, its members (array
    task, Slurm job, nodes) and those waiting to join; None for a run that is one job."""
    newest = newest_sealed(run_dir)
    if newest is None:
        return None
    epoch = sealed(run_dir, newest)
    if epoch is None:
        return None
    return {"epoch": newest, "nodes": epoch.nodes, "members": [_row(s) for s in epoch.seats],
            "waiting": [_row(s) for s in waiting(run_dir, newest)], "done": finished(run_dir)}


def _row(s: Seat) -> dict[str, Any]:
    return {"task": s.task, "job_id": s.job_id, "nodes": list(s.nodes)}
