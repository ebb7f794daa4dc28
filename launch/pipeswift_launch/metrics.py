"""The training scalars where ML users look ([training] metrics): ``metrics.csv`` and
``tensorboard/`` under the run directory, fed by every event a writer of events.jsonl records
(rank 0's, and the after-launch helper's for a crash). One step axis, the training step, over
all attempts and launches: a launch that resumes from an earlier checkpoint logs some steps
again, and TensorBoard's reader keeps the newest of each (the writer's purge_step); in the CSV,
the last row of a step is the one that counts.

Scalars: ``train/loss``, ``eval/loss`` ([training] eval_every), ``train/lr``, ``train/step_time_s``, ``train/samples_per_s``,
``checkpoint/stall_s`` (the time training waited), ``checkpoint/write_s``. Events, each a
scalar ``events/KIND`` = 1 at its step and a line of text (TensorBoard run ``events``): ``start`` (a launch: its layout),
``requeue``, ``end``, ``restart`` (a crash and what the helper does), ``relayout``, ``grow``."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import IO, Any

from pipeswift_slurm import events as events_schema

CSV_FILE, TB_DIR = "metrics.csv", "tensorboard"
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


class Metrics:
    """One process's metrics writers; :meth:`record` takes each events.jsonl record. TensorBoard
    gets two runs: ``tensorboard/train`` (the scalars; a launch that resumes at step S starts its
    writer with purge_step S+1, so the reader drops what an earlier launch logged past S) and
    ``tensorboard/events`` (the marks, never purged)."""

    def __init__(self, run_dir: Path, kinds: list[str], samples_per_step: int) -> None:
        self.samples_per_step = samples_per_step
        self.step = 0
        self._csv_fh: IO[str] | None = None
        self._csv: Any = None      # csv.writer
        self._tb_dir = run_dir / TB_DIR if "tensorboard" in kinds and _tensorboard_usable() else None
        self._tb: dict[str, Any] = {}   # run name -> torch.utils.tensorboard.SummaryWriter
        if "csv" in kinds:
            path = run_dir / CSV_FILE
            new = not path.exists()
            self._csv_fh = open(path, "a", newline="", encoding="utf-8")
            self._csv = csv.writer(self._csv_fh)
            if new:
                self._csv.writerow(COLUMNS)

    def _board(self, run: str, purge_step: int | None = None) -> Any:
        if self._tb_dir is None:
            return None
        if run not in self._tb:
            from torch.utils.tensorboard import SummaryWriter   # optional (the metrics extra), and slow to import
            self._tb[run] = SummaryWriter(log_dir=str(self._tb_dir / run), purge_step=purge_step, flush_secs=10)
        return self._tb[run]

    def record(self, rec: dict[str, Any]) -> None:
        """Write ``rec``'s row and scalars; a failure (a full disk, a TensorBoard error) is said
        once and ends the metrics, never the training."""
        try:
            self._record(rec)
        except Exception as e:  # noqa: BLE001 - a side channel: training goes on without it
            print(f"pswift: warning: metrics stopped ({type(e).__name__}: {e}); training goes on",
                  file=sys.stderr, flush=True)
            self.close()
            self._tb_dir = None

    def _record(self, rec: dict[str, Any]) -> None:
        step = rec.get("step")
        self.step = step if isinstance(step, int) else self.step
        if rec["event"] == "start" and self.step > 0:
            self._board("train", purge_step=self.step + 1)   # this launch's steps replace later ones
        row: dict[str, Any] = dict.fromkeys(COLUMNS, "")
        row.update(time=rec.get("time", ""), attempt=rec.get("attempt", ""), step=self.step)
        scalars, run = self._scalars(rec, row)
        if scalars is None:
            return
        if self._csv is not None:
            self._csv.writerow([row[c] for c in COLUMNS])
            assert self._csv_fh is not None
            self._csv_fh.flush()
        board = self._board(run)
        if board is not None:
            for tag, value in scalars.items():
                board.add_scalar(tag, float(value), self.step, walltime=rec.get("time"))
            if run == "events":
                board.add_text("events", f"attempt {rec.get('attempt')}: {row['event']}: {row['detail']}", self.step)
                board.flush()    # marks are few: on disk at once (a launch may end by a signal)

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
        fh, boards = self._csv_fh, list(self._tb.values())
        self._csv_fh, self._csv, self._tb = None, None, {}
        if fh is not None:
            fh.close()
        for board in boards:
            board.close()


def _tensorboard_usable() -> bool:
    """Whether torch's TensorBoard writer can be imported (it needs the tensorboard package)."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        print("pswift: warning: [training] metrics names \"tensorboard\" but the tensorboard package is not "
              "installed where the job runs (pip install 'pipeswift-slurm[metrics]'); writing the others",
              file=sys.stderr, flush=True)
        return False
    return True


def attach(writer: events_schema.Writer, run_dir: Path, training: Any) -> Metrics | None:
    """Metrics fed by ``writer`` (a writer that writes: rank 0's, the helper's) as
    ``training`` (plan.json's [training]) asks; None when it asks for none."""
    kinds = list(training.get("metrics") or ())
    if writer.fh is None or not kinds:
        return None
    sink = Metrics(run_dir, kinds, int(training["global_batch_size"]))
    writer.listeners.append(sink.record)
    return sink
