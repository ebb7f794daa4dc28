"""The events schema: what the launcher writes to ``events.jsonl``, and the one reader of it.

A run directory belongs to its user, so every line is hostile input to whoever reads it (the
jobcomp plugin runs as root). :func:`parse` keeps a line only when every field it uses has the
right type and range (finite numbers, int64 integers, bounded strings and collections) and
counts the rest as skipped; nothing in a line can raise past it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from pipeswift_slurm import runfiles
from pipeswift_slurm.numeric import finite
from pipeswift_slurm.settings import LIMITS

FILE = runfiles.EVENTS
#: every number in a line lies within +-MAX_NUMBER (10^13: epoch seconds, step counts and bytes
#: per layer of any real run fit), so the readers' sums over the largest collection (MAX_ITEMS
#: values) stay inside SQLite's int64 and their floats finite, whatever a line says
MAX_NUMBER = 10**13
MAX_STR = 4096
MAX_ITEMS = 100_000
#: layers, and so stages and boundaries, within train.toml's cap: a reader's loop over a layer
#: range or the stages is bounded by it, whatever a line says
MAX_LAYERS = LIMITS["layers"]
#: instruction names a stage's timer records (DeepSpeed has about a dozen, and "step")
MAX_INSTRUCTIONS = 32


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_NUMBER <= v <= MAX_NUMBER


def _count(v: Any) -> bool:
    return _int(v) and v >= 0


def _num(v: Any) -> bool:
    f = finite(v)
    return f is not None and abs(f) <= MAX_NUMBER and (isinstance(v, float) or _int(v))


def _positive(v: Any) -> bool:
    return _num(v) and v > 0


def _str(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_STR


def _strs(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= MAX_ITEMS and all(_str(x) for x in v)


def _boundaries(v: Any) -> bool:
    """A stage cut: 2 to MAX_LAYERS + 1 non-decreasing layer indices from 0 to MAX_LAYERS."""
    return (isinstance(v, list) and 2 <= len(v) <= MAX_LAYERS + 1
            and all(_count(x) and x <= MAX_LAYERS for x in v) and all(a <= b for a, b in zip(v, v[1:])))


def _counts(v: Any) -> bool:
    """A count a rank, in rank order (at most 4096 x 16 ranks)."""
    return isinstance(v, list) and len(v) <= 4096 * 16 and all(_count(x) for x in v)


def _layer_key(k: Any) -> bool:
    """A layer (or stage) index as a string: "0" to "511"."""
    return isinstance(k, str) and 0 < len(k) <= 3 and k.isdigit() and int(k) < MAX_LAYERS


def _by_layer(value: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """{"0": x, "1": y, ...}: layer indices as strings, within the layer cap."""
    return lambda v: (isinstance(v, dict) and len(v) <= MAX_LAYERS
                      and all(_layer_key(k) and value(x) for k, x in v.items()))


def _instructions(v: Any) -> bool:
    """{"stage": {"InstructionName": seconds}}: at most a stage a layer, MAX_INSTRUCTIONS names each."""
    return isinstance(v, dict) and len(v) <= MAX_LAYERS and all(
        _layer_key(k) and isinstance(d, dict) and len(d) <= MAX_INSTRUCTIONS
        and all(isinstance(n, str) and len(n) <= 64 and _num(x) for n, x in d.items()) for k, d in v.items())


def _parts(v: Any) -> bool:
    """{"part": seconds}: at most 16 named parts of a step (pipeswift_launch.stepparts)."""
    return isinstance(v, dict) and len(v) <= 16 and all(
        isinstance(n, str) and 0 < len(n) <= 32 and _num(x) for n, x in v.items())


Check = Callable[[Any], bool]
#: every event kind and the fields its readers use, each (check, required); other fields are
#: dropped, a missing optional one reads None
SCHEMA: dict[str, dict[str, tuple[Check, bool]]] = {
    "start": {"nodes": (_count, True), "world_size": (_count, True), "stages": (_count, True),
              "data_parallel": (_count, True), "micro_batches": (_count, True),
              "micro_batch_size": (_count, True), "step": (_count, True), "partition": (_str, False),
              "schedule": (_str, False), "boundaries": (_boundaries, False), "resumed_from": (_str, False), "setup_s": (_num, False),
              "load_s": (_num, False),
              # the hardware the launch measured (pipeswift_launch.probe)
              "device": (_str, False), "p2p_latency_s": (_positive, False), "p2p_bandwidth": (_positive, False),
              "device_memory": (_count, False), "ranks_per_host": (_count, False),
              "host_cores": (_count, False)},
    "step": {"step": (_count, True), "loss": (_num, True), "step_time": (_num, True),
             "loss_hex": (_str, False), "lr": (_num, False)},
    "eval": {"step": (_count, True), "loss": (_num, True), "batches": (_count, False), "seconds": (_num, False)},
    "checkpoint": {"step": (_count, False), "path": (_str, False), "seconds": (_num, False),
                   "reason": (_str, False), "copy_s": (_num, False), "write_s": (_num, False),
                   "commit_s": (_num, False), "background": (lambda v: isinstance(v, bool), False),
                   "gather_s": (_num, False)},   # launchers before manifest version 3 gathered ZeRO state
    "checkpoint_discarded": {"names": (_strs, False)},
    "end": {"reason": (_str, True), "step": (_count, False),
            "requeue": (lambda v: isinstance(v, bool), False), "error": (_str, False),
            # on CUDA: each rank's torch.cuda.max_memory_allocated() (make gpu-check reads it)
            "device_peak_bytes": (_counts, False)},
    "crash": {"how": (_str, True), "action": (_str, True), "rank": (_count, False), "node": (_str, False),
              "step": (_count, False), "error": (_str, False), "restart": (_count, False), "why": (_str, False)},
    "relayout": {"step": (_count, True), "nodes": (_count, False), "boundaries_from": (_boundaries, True),
                 "boundaries_to": (_boundaries, True), "step_s": (_num, False), "predicted_step_s": (_num, False),
                 "gain_s": (_num, False), "cost_s": (_num, False), "remaining": (_count, False)},
    "grow": {"step": (_count, True), "nodes_from": (_count, True), "nodes_to": (_count, True),
             "free": (_count, False), "step_s": (_num, False), "predicted_step_s": (_num, False),
             "remaining": (_count, False), "gain_s": (_num, False), "cost_s": (_num, False)},
    "layer_profile": {"micro_batch_size": (_count, True), "seconds": (_by_layer(_num), True),
                      # ZB-H1: each split layer's weight pass W (part of its seconds)
                      "weight_seconds": (_by_layer(_num), False),
                      "micro_batches": (_count, False), "boundaries": (_boundaries, False),
                      "samples": (_count, False), "param_bytes": (_by_layer(_count), False),
                      "activation_bytes": (_by_layer(_count), False),
                      "saved_bytes": (_by_layer(_count), False),
                      "instructions": (_instructions, False)},
    # rank 0's steady steps of one launch, part by part, in seconds per step (bench/overhead.py)
    "step_parts": {"steps": (_count, True), "seconds": (_parts, True)},
}
COMMON: dict[str, tuple[Check, bool]] = {
    "time": (_num, False), "attempt": (lambda v: _count(v) and v < 1_000_000, False),
    "job_id": (_str, False)}


_FIELDS = {kind: tuple((name, check, required) for name, (check, required) in {**COMMON, **f}.items())
           for kind, f in SCHEMA.items()}


def unknown_fields(kind: str, fields: dict[str, Any]) -> list[str]:
    """The fields a writer gives that the schema of ``kind`` does not have (all, for an unknown
    kind): the launcher checks each event it writes against this."""
    known = _FIELDS.get(kind)
    if known is None:
        return sorted(fields) or [f"<event kind {kind!r}>"]
    names = {name for name, _, _ in known}
    return sorted(k for k in fields if k not in names)


class Writer:
    """The launcher's side: appends events to ``run_dir/events.jsonl`` (rank 0 only; other
    ranks pass ``enabled=False``), each checked against SCHEMA's field names first."""

    def __init__(self, run_dir: Path, enabled: bool, attempt: int, job_id: str | None) -> None:
        self.fh = open(Path(run_dir) / FILE, "a", encoding="utf-8") if enabled else None
        self.base = {"attempt": attempt, "job_id": job_id}
        #: called with each record written (the launcher's metrics: pipeswift_launch.metrics)
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        #: seconds the listeners took, all records together (pipeswift_launch.stepparts reads it)
        self.listeners_s = 0.0

    def emit(self, event: str, **fields: Any) -> None:
        unknown = unknown_fields(event, fields)
        if unknown:  # a launcher bug: readers would drop these silently
            raise ValueError(f"event {event!r}: {unknown} not in the events schema (pipeswift_slurm/events.py)")
        if self.fh is None:
            return
        rec = {"event": event, "time": round(time.time(), 3), **self.base, **fields}
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()
        if self.listeners:
            began = time.perf_counter()
            for listener in self.listeners:
                listener(rec)
            self.listeners_s += time.perf_counter() - began

    def close(self) -> None:
        if self.fh is not None:
            os.fsync(self.fh.fileno())
            self.fh.close()
            self.fh = None


def append(run_dir: Path, event: str, attempt: int, job_id: str | None, **fields: Any) -> None:
    """One event from a rank that is not rank 0's writer (the watchdog's acting rank)."""
    w = Writer(run_dir, True, attempt, job_id)
    try:
        w.emit(event, **fields)
    finally:
        w.close()


def validate(ev: Any) -> dict[str, Any] | None:
    """The event with exactly its schema's fields (a missing optional one None; a missing
    attempt 0), or None when anything it needs is missing or of the wrong type or range."""
    if not isinstance(ev, dict):
        return None
    kind = ev.get("event")
    fields = _FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return None
    out: dict[str, Any] = {"event": kind}
    for name, check, required in fields:
        value = ev.get(name)
        if value is None:
            if required:
                return None
        elif not check(value):
            return None
        out[name] = value
    if out["attempt"] is None:
        out["attempt"] = 0
    return out


def parse(lines: Iterable[bytes | str]) -> tuple[list[dict[str, Any]], int]:
    """(valid events, how many non-empty lines were skipped) of events.jsonl's lines. All lines
    are decoded in one call when they are all good JSON (a 700k-step log: ~1.5x faster), line
    by line otherwise."""
    rows = [x for x in lines if x.strip()]
    try:
        if rows and all(isinstance(x, bytes) for x in rows):
            bulk = json.loads(b"[" + b",".join(rows) + b"]")   # type: ignore[arg-type]
            good = [ev for ev in map(validate, bulk) if ev is not None]
            return good, len(bulk) - len(good)
    except (ValueError, RecursionError):
        pass
    return _parse_lines(rows)


def _parse_lines(lines: Iterable[bytes | str]) -> tuple[list[dict[str, Any]], int]:
    good: list[dict[str, Any]] = []
    skipped = 0
    for line in lines:
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                skipped += 1
                continue
        if not line.strip():
            continue
        try:
            ev = validate(json.loads(line))
        except (ValueError, RecursionError):   # bad JSON, 5000-digit ints, deep nesting
            ev = None
        if ev is None:
            skipped += 1
        else:
            good.append(ev)
    return good, skipped


#: the longest events line read: a longer one (no writer of pswift's makes one) is skipped
MAX_LINE = 1 << 20


def stream(run_dir: Path | str, wanted: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """The run's valid events of the kinds ``wanted``, one at a time: the file is read a line at
    a time (at most MAX_LINE bytes held) and a line is decoded only when it names a wanted kind,
    so a job's own long log (300k steps) costs its reading, not its size in memory."""
    needles = [f'"event": "{k}"'.encode() for k in wanted] + [f'"event":"{k}"'.encode() for k in wanted]
    try:
        fh = open(Path(run_dir) / FILE, "rb")
    except FileNotFoundError:
        return
    with fh:
        while True:
            line = fh.readline(MAX_LINE + 1)
            if not line:
                return
            if len(line) > MAX_LINE:
                while line and not line.endswith(b"\n"):
                    line = fh.readline(MAX_LINE)
                continue
            if any(n in line for n in needles):
                good, _ = _parse_lines([line])
                if good and good[0]["event"] in wanted:
                    yield good[0]


def read(run_dir: Path | str) -> tuple[list[dict[str, Any]], int]:
    """The run's valid events and the count of skipped lines (a torn last line among them), for
    a process reading its own runs (tests, benchmarks); commands that anyone may run, root
    included, read the file through ``userfiles.read_for_command`` and :func:`parse` it."""
    try:
        with open(Path(run_dir) / FILE, "rb") as fh:
            return parse(fh)
    except FileNotFoundError:
        return [], 0
