"""The training scalars where ML users look ([training] metrics): ``metrics.csv``,
``tensorboard/`` and ``wandb/`` (offline runs) under the run directory, one sink each, fed by every event a writer of events.jsonl records
(rank 0's, and the after-launch helper's for a crash). One step axis, the training step, over
all attempts and launches: a launch that resumes from an earlier checkpoint logs some steps
again, and TensorBoard's reader keeps the newest of each (the writer's purge_step); in the CSV,
the last row of a step is the one that counts; W&B gets one offline run per launch, all under
the run directory's one run id.

Scalars: ``train/loss``, ``eval/loss`` ([training] eval_every), ``train/lr``, ``train/step_time_s``, ``train/samples_per_s``,
``checkpoint/stall_s`` (the time training waited), ``checkpoint/write_s``. Events, each a
scalar ``events/KIND`` = 1 at its step and a line of text (TensorBoard run ``events``): ``start`` (a launch: its layout),
``requeue``, ``end``, ``restart`` (a crash and what the helper does), ``relayout``, ``grow``."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from pipeswift_slurm import events as events_schema, runfiles

CSV_FILE, TB_DIR = runfiles.METRICS_CSV, runfiles.TENSORBOARD
COLUMNS = ("time", "attempt", "step", "event", "loss", "lr", "step_time_s", "samples_per_s",
           "checkpoint_stall_s", "detail")


def _event_of(rec: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, text) of a record that marks the run's life, or None (steps, checkpoints, profiles)."""
    kind = rec["event"]
    if kind == "start":
        return "start", (f"{rec['nodes']} node(s) x {rec['stages']} stage(s) x {rec['data_parallel']} "
                         f"data-parallel from step {rec['step']}")
    if kind == "end":
        return ("requeue" if rec.get("requeue") else "end"), f"ended: {rec['reason']}"
    if kind == "crash":
        return "restart" if rec["action"] == "restart" else "crash", f"{rec['how']}: {rec['action']}"
    if kind == "relayout":
        return "relayout", f"boundaries {rec['boundaries_from']} -> {rec['boundaries_to']}"
    if kind == "grow":
        return "grow", f"{rec['nodes_from']} -> {rec['nodes_to']} node(s)"
    return None


class _Csv:
    """``metrics.csv``: every record's row, appended (the last row of a step counts)."""

    def __init__(self, run_dir: Path) -> None:
        path = run_dir / CSV_FILE
        new = not path.exists()
        self._fh: IO[str] = open(path, "a", newline="", encoding="utf-8")
        self._csv = csv.writer(self._fh)
        if new:
            self._csv.writerow(COLUMNS)

    def launch(self, step: int) -> None:
        pass

    def write(self, step: int, scalars: dict[str, float], run: str, row: dict[str, Any], when: Any) -> None:
        self._csv.writerow([row[c] for c in COLUMNS])
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class _TensorBoard:
    """``tensorboard/``: two runs, ``train`` (the scalars; a launch that resumes at step S starts
    its writer with purge_step S+1, so the reader drops what an earlier launch logged past S) and
    ``events`` (the marks and their text, never purged)."""

    def __init__(self, run_dir: Path) -> None:
        self._dir = run_dir / TB_DIR
        self._boards: dict[str, Any] = {}   # run name -> torch.utils.tensorboard.SummaryWriter

    def _board(self, run: str, purge_step: int | None = None) -> Any:
        if run not in self._boards:
            from torch.utils.tensorboard import SummaryWriter   # optional (the metrics extra), and slow to import
            self._boards[run] = SummaryWriter(log_dir=str(self._dir / run), purge_step=purge_step, flush_secs=10)
        return self._boards[run]

    def launch(self, step: int) -> None:
        self._board("train", purge_step=step + 1)   # this launch's steps replace later ones

    def write(self, step: int, scalars: dict[str, float], run: str, row: dict[str, Any], when: Any) -> None:
        board = self._board(run)
        for tag, value in scalars.items():
            board.add_scalar(tag, value, step, walltime=when)
        if run == "events":
            board.add_text("events", f"attempt {row['attempt']}: {row['event']}: {row['detail']}", step)
            board.flush()    # marks are few: on disk at once (a launch may end by a signal)

    def close(self) -> None:
        boards, self._boards = list(self._boards.values()), {}
        for board in boards:
            board.close()


class _Wandb:
    """Weights & Biases: one offline run per launch under ``wandb/`` in the run directory (compute
    nodes seldom reach the internet; ``WANDB_MODE`` overrides), all launches of a run under one
    run id (the run directory's), so ``wandb sync RUN_DIR/wandb/offline-run-*`` on a login node
    uploads one curve. Started at the first record: wandb starts a service process."""

    def __init__(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        self._run: Any = None

    def _started(self) -> Any:
        if self._run is None:
            import wandb   # optional (the wandb extra), and slow to import
            mode: Any = os.environ.get("WANDB_MODE", "offline")   # wandb checks the word
            self._run = wandb.init(
                dir=str(self._run_dir), mode=mode,
                project=os.environ.get("WANDB_PROJECT", "pswift"), name=self._run_dir.name,
                id=wandb_run_id(self._run_dir), resume="allow",
                settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
        return self._run

    def launch(self, step: int) -> None:
        pass

    def write(self, step: int, scalars: dict[str, float], run: str, row: dict[str, Any], when: Any) -> None:
        self._started().log(scalars, step=step)

    def close(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.finish()


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of every launch of the run in ``run_dir``: a digest of its resolved path."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


SINKS: dict[str, Callable[[Path], Any]] = {"csv": _Csv, "tensorboard": _TensorBoard, "wandb": _Wandb}


class Metrics:
    """One process's metrics sinks, as [training] metrics names them; :meth:`record` takes each
    events.jsonl record, turns it into scalars and a CSV row once and hands them to every sink.
    A sink that fails (a full disk, a library's error) is said once and dropped; the others and
    the training go on."""

    def __init__(self, run_dir: Path, kinds: list[str], samples_per_step: int) -> None:
        self.samples_per_step = samples_per_step
        self.step = 0
        self._sinks: dict[str, Any] = {k: SINKS[k](run_dir) for k in kinds if k in SINKS and _usable(k)}

    def record(self, rec: dict[str, Any]) -> None:
        """Hand ``rec``'s row and scalars to every sink."""
        step = rec.get("step")
        self.step = step if isinstance(step, int) else self.step
        row: dict[str, Any] = dict.fromkeys(COLUMNS, "")
        row.update(time=rec.get("time", ""), attempt=rec.get("attempt", ""), step=self.step)
        scalars, run = self._scalars(rec, row)
        for kind, sink in list(self._sinks.items()):
            try:
                if rec["event"] == "start" and self.step > 0:
                    sink.launch(self.step)
                if scalars is not None:
                    sink.write(self.step, scalars, run, row, rec.get("time"))
            except Exception as e:  # noqa: BLE001 - a side channel: training goes on without it
                print(f"pswift: warning: metrics stopped ({kind}: {type(e).__name__}: {e}); training and the "
                      "other sinks go on",
                      file=sys.stderr, flush=True)
                self._drop(kind)

    def _drop(self, kind: str) -> None:
        sink = self._sinks.pop(kind)
        try:
            sink.close()
        except Exception:  # noqa: BLE001, S110 - already said it failed
            pass

    def _scalars(self, rec: dict[str, Any], row: dict[str, Any]) -> tuple[dict[str, float] | None, str]:
        """(the scalars of ``rec`` by tag, or None when it has none; the TensorBoard run), and
        ``row`` (its CSV row) filled in."""
        if rec["event"] == "step":
            dt = float(rec["step_time"])
            scalars = {"train/loss": float(rec["loss"]), "train/step_time_s": dt}
            if rec.get("lr") is not None:
                scalars["train/lr"] = float(rec["lr"])
            if dt > 0:
                scalars["train/samples_per_s"] = self.samples_per_step / dt
            row.update(event="step", loss=rec["loss"], lr=rec.get("lr", ""), step_time_s=dt,
                       samples_per_s=scalars.get("train/samples_per_s", ""))
            return scalars, "train"
        if rec["event"] == "eval":
            row.update(event="eval", loss=rec["loss"], detail=f"validation of {rec.get('batches', '?')} micro-batch(es)")
            return {"eval/loss": float(rec["loss"])}, "train"
        if rec["event"] == "checkpoint" and rec.get("seconds") is not None:
            scalars = {"checkpoint/stall_s": float(rec["seconds"])}
            if rec.get("write_s") is not None:
                scalars["checkpoint/write_s"] = float(rec["write_s"])
            row.update(event="checkpoint", checkpoint_stall_s=rec["seconds"], detail=rec.get("reason", ""))
            return scalars, "train"
        marked = _event_of(rec)
        if marked is None:
            return None, ""
        row.update(event=marked[0], detail=marked[1])
        return {f"events/{marked[0]}": 1.0}, "events"

    def close(self) -> None:
        for kind in list(self._sinks):
            self._drop(kind)


EXTRAS = {"tensorboard": "metrics", "wandb": "wandb"}   # sink -> its package's pip extra


def _usable(kind: str) -> bool:
    """Whether the package ``kind``'s sink writes with can be imported where the job runs."""
    if kind not in EXTRAS or importlib.util.find_spec(kind) is not None:
        return True
    print(f"pswift: warning: [training] metrics names \"{kind}\" but the {kind} package is not installed "
          f"where the job runs (pip install 'pipeswift-slurm[{EXTRAS[kind]}]'); writing the others",
          file=sys.stderr, flush=True)
    return False


def attach(writer: events_schema.Writer, run_dir: Path, training: Any) -> Metrics | None:
    """Metrics fed by ``writer`` (a writer that writes: rank 0's, the helper's) as
    ``training`` (plan.json's [training]) asks; None when it asks for none."""
    kinds = list(training.get("metrics") or ())
    if writer.fh is None or not kinds:
        return None
    sink = Metrics(run_dir, kinds, int(training["global_batch_size"]))
    writer.listeners.append(sink.record)
    return sink
