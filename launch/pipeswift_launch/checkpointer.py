"""One launch's checkpoints on one rank (issue 26): the folder made clean when the launch starts,
stage-consistent saves (committed before they return, or written in the background and committed
at a later step's end), pruning, their events, and resuming from the newest committed checkpoint
every rank can load. The files themselves: :mod:`pipeswift_launch.ckptfiles`; when to save and
what follows a stop: the training loop (train.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch.distributed as tdist

from . import ckptfiles as ckpt
from . import collectives, ds_compat
from .dist_env import log0 as _log

if TYPE_CHECKING:
    from pipeswift_slurm.events import Writer


class Checkpointer:
    """Save and resume for this rank; every method is called by every rank at the same point
    (each save and the resume are collectives)."""

    def __init__(self, engine: Any, dist: Any, ckpt_dir: Path, rank: int, world_size: int,
                 events: Writer, keep: int, model_id: str) -> None:
        self.engine, self.dist, self.dir = engine, dist, ckpt_dir
        self.rank, self.world_size, self.events = rank, world_size, events
        self.keep, self.model_id = keep, model_id
        #: seconds the last checkpoint of this launch stalled training (None: none yet)
        self.last_s: float | None = None
        #: seconds it took to write, start to commit (a background one's copy, write and commit)
        self.last_write_s: float | None = None
        #: when the last checkpoint (or training) started, time.time()
        self.saved_at = time.time()
        #: a periodic checkpoint being written (checkpoint.Pending)
        self.pending: ckpt.Pending | None = None
        #: a periodic checkpoint is due (set by the loop; it waits while one is being written)
        self.due = False
        #: the host copies of the last background checkpoint, committed: the next one copies
        #: into them (one stage state's worth of host memory kept between checkpoints)
        self.staging: Any = None
        #: the process group background checkpoints commit over, in their writer threads, while
        #: training's collectives go on (gloo: host memory); every rank makes it here, at once
        self.side_group = tdist.new_group(backend="gloo")
        # a periodic checkpoint's copy of the state overlaps the next forward and backward; the
        # next optimizer step waits for it (checkpoint.Pending)
        self.fence = ds_compat.before_optimizer_step(engine, self._before_optimizer_step)

    def _before_optimizer_step(self) -> None:
        if self.pending is not None:
            self.pending.wait_copied()

    def clean_folder(self) -> None:
        """Rank 0, before anyone resumes: the folder exists, half-written checkpoints of an
        earlier launch are removed and ones with an unusable manifest moved aside (each said)."""
        if self.rank != 0:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        removed, aside = ckpt.remove_uncommitted(self.dir)
        if removed:
            _log(self.rank, f"removed half-written checkpoint(s) {', '.join(removed)}")
            self.events.emit("checkpoint_discarded", names=removed)
        if aside:
            _log(self.rank, f"moved aside checkpoint(s) with an unusable manifest: {'; '.join(aside)}")

    def _gather(self, obj: Any) -> list[Any]:
        return collectives.all_gather(obj, self.world_size, device=self.engine.device)

    def _side_gather(self, obj: Any) -> list[Any]:
        return collectives.all_gather(obj, self.world_size, group=self.side_group)

    def _side_barrier(self) -> None:
        tdist.barrier(group=self.side_group)

    def save(self, step: int, meta: dict[str, Any]) -> None:
        """A stage-consistent checkpoint of ``step``, committed before it returns (after any
        checkpoint still being written), pruned, and its event."""
        ts = time.time()      # a wait for a background write to finish counts to this save
        self.finish_pending()
        self.due = False
        path, phases = ckpt.save(self.engine, self.dir, step, meta, self._gather, self.dist.barrier, self.rank)
        self._committed(path, step, meta["reason"], time.time() - ts, phases, False)
        self.saved_at = time.time()

    def save_in_background(self, step: int, meta: dict[str, Any]) -> None:
        """A periodic checkpoint: the state of this step copied, written and committed by a
        thread on every rank (the next optimizer step waits for the copy only); the loop takes
        it as committed at the end of a step where no rank's thread is still at work
        (:meth:`finish_pending`)."""
        self.finish_pending()
        self.due = False
        self.pending = ckpt.Pending(self.engine, self.dir, step, meta, self._side_gather, self._side_barrier,
                                    self.rank, self.staging)
        self.saved_at = time.time()

    def writing(self) -> bool:
        """This rank's background checkpoint is still being written."""
        return self.pending is not None and not self.pending.done()

    def finish_pending(self) -> None:
        """Take the background checkpoint as committed: prune, its event (waiting for its
        thread first: a wait the caller counts, such as a synchronous save's; the loop calls
        this once no rank's thread is at work)."""
        p, self.pending = self.pending, None
        if p is not None:
            phases = p.commit()
            self.staging = p.copies
            self._committed(p.path, p.step, "periodic", p.stall_s, phases, True)

    def _committed(self, path: Path, step: int, reason: str, stall_s: float,
                   phases: dict[str, float], background: bool) -> None:
        """After a commit: prune, the event, the line; ``stall_s``: what training waited for it."""
        if self.rank == 0:
            ckpt.prune(self.dir, self.keep)
        self.last_s = stall_s
        self.last_write_s = max(stall_s, sum(phases.get(k, 0.0) for k in ("copy_s", "write_s", "commit_s")))
        self.events.emit("checkpoint", step=step, path=str(path), seconds=round(stall_s, 3), reason=reason,
                         background=background, **{k: round(v, 4) for k, v in phases.items()})
        _log(self.rank, f"checkpoint {path.name} committed ({reason}) in {stall_s:.2f} s"
                        + (" of training time, written in the background" if background else ""))

    def resume(self, layers: int, layout: dict[str, Any],
               loaded: Callable[[Path, dict[str, Any], dict[str, Any] | None], None]) -> str | None:
        """Load the newest committed checkpoint that every rank can load; on a corrupt file or
        another model's checkpoint, fall back to the previous one (all ranks together, one line
        each time). ``layout``: this launch's (its boundaries and world size); ``loaded(path,
        manifest, generators)`` runs once one loaded. The path loaded, None when there is none;
        raises when none loads."""
        first_error = None
        for path in reversed(ckpt.committed(self.dir)):
            man, err, generators = None, None, None
            try:
                man = ckpt.load(self.engine, path, self.model_id, layers)
                generators = ckpt.saved_generators(path, man, self.rank, ckpt.layout_key(layout))
            except ckpt.CheckpointError as e:
                err = str(e)
            problem = next((e for e in self._gather(err) if e), None)  # fail together, or peers die in a collective
            if problem is None and man is not None:
                loaded(path, man, generators)
                return str(path)
            first_error = first_error or problem
            _log(self.rank, f"cannot resume from {path.name}: {problem}; trying the previous committed checkpoint")
        if first_error is None:
            return None
        if self.rank == 0:
            raise ckpt.CheckpointError(f"no committed checkpoint in {self.dir} can be loaded: {first_error}")
        raise SystemExit(2)
