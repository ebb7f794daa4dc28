"""Events into attempts, streamed and bounded: the one reading of a run's events.jsonl into its
attempts (``pswift status``, the history and the jobcomp plugin all use it).

A run's log may be as large as the readers' cap (256 MiB, millions of steps) and is written by
the user: the fold never holds it whole. :class:`Fold` takes the file in chunks of bytes; step
events, the bulk of any real log, are kept as four typed columns (:class:`StepLog`, 32 bytes a
step); every other event is kept as its validated dict within bounds:

- at most MAX_ATTEMPTS attempts (the newest by number), MAX_KEPT_BYTES of stored non-step
  events over the whole run, and PER_ATTEMPT of each kind whose reading costs time per item
  (re-layouts, growths, profiles): what lies beyond is counted in ``dropped``, never an error;
- lines over MAX_LINE bytes are skipped lines (no event of the schema is that long).

The launcher's own step lines are read by one anchored pattern at C speed; a chunk with
anything the pattern does not take is read event by event, in order, through
:func:`events.parse`, so the result is the same as reading every line through the schema.
"""

from __future__ import annotations

import heapq
import math
import re
from array import array
from typing import Any, Iterable, Iterator

from pipeswift_slurm import events as events_mod
from pipeswift_slurm.stats import median

MAX_ATTEMPTS = 1000
MAX_KEPT_BYTES = 16 << 20
MAX_LINE = 8 << 20
PER_ATTEMPT = {"relayouts": 100, "grows": 100, "profiles": 100}
#: re-layouts of one attempt whose outcome is measured (each reads the attempt's steps once; a
#: real job re-lays out once or twice): the rest keep what was predicted, measured None
MEASURED_RELAYOUTS = 10
_LISTS = {"checkpoint": "checkpoints", "layer_profile": "profiles", "start": "starts",
          "relayout": "relayouts", "grow": "grows", "crash": "crashes"}

# the launcher's step line, exactly as events.Writer writes it (json.dumps, default separators)
_NUM = rb"(-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,20})?(?:[eE][-+]?[0-9]{1,3})?)"
_STEP = re.compile(
    rb'^\{"event": "step", "time": ' + _NUM + rb', "attempt": (0|[1-9][0-9]{0,5}), '
    rb'"job_id": (?:null|"[0-9_]{0,40}"), "step": (0|[1-9][0-9]{0,12}), "loss": ' + _NUM
    + rb'(?:, "loss_hex": "[-+0-9a-fx.p]{1,40}")?, "step_time": ' + _NUM + rb'\}$', re.M)
_PREFIX = b'{"event": "step", '



class StepLog:
    """One attempt's step events in file order as typed columns (a missing time is NaN).
    Indexing and iteration give the events' dicts (``step``, ``time``, ``loss``, ``step_time``)."""

    __slots__ = ("step", "time", "loss", "step_time")

    def __init__(self) -> None:
        self.step, self.time, self.loss, self.step_time = array("q"), array("d"), array("d"), array("d")

    def append(self, ev: dict[str, Any]) -> None:
        self.step.append(ev["step"])
        self.time.append(math.nan if ev["time"] is None else float(ev["time"]))
        self.loss.append(float(ev["loss"]))
        self.step_time.append(float(ev["step_time"]))

    def __len__(self) -> int:
        return len(self.step)

    def _event(self, i: int) -> dict[str, Any]:
        t = self.time[i]
        return {"event": "step", "step": self.step[i], "time": None if math.isnan(t) else t,
                "loss": self.loss[i], "step_time": self.step_time[i]}

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._event(range(len(self.step))[i])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._event(i) for i in range(len(self.step)))

    def times_since(self, t0: float | None) -> list[float]:
        """Step times of the steps written at or after ``t0`` (all, when either time is unknown)."""
        if t0 is None:
            return list(self.step_time)
        return [st for t, st in zip(self.time, self.step_time) if not t < t0]


def _new_attempt(n: int) -> dict[str, Any]:
    return {"attempt": n, "start": None, "end": None, "steps": StepLog(), "checkpoint_s": 0.0,
            **{name: [] for name in _LISTS.values()}}


class Fold:
    """Feed events.jsonl's bytes in chunks (:meth:`feed`), then :meth:`attempts`."""

    def __init__(self) -> None:
        self.found: dict[int, dict[str, Any]] = {}
        self.kept: list[int] = []         # heap of the attempt numbers kept
        self.kept_bytes = 0
        self.skipped = 0                  # lines that are not events of the schema
        self.dropped = 0                  # valid events beyond the bounds
        self._tail = b""
        self._skipping = False

    # ------------------------------------------------------------------ events one at a time
    def _attempt(self, n: int) -> dict[str, Any] | None:
        a = self.found.get(n)
        if a is not None:
            return a
        if len(self.found) >= MAX_ATTEMPTS:
            if n < self.kept[0]:
                return None
            old = self.found.pop(heapq.heappop(self.kept))
            self.dropped += (len(old["steps"]) + sum(len(old[k]) for k in _LISTS.values())
                             + (old["end"] is not None))
        a = self.found[n] = _new_attempt(n)
        heapq.heappush(self.kept, n)
        return a

    def add(self, ev: dict[str, Any], size: int = 0) -> None:
        """One validated event (``size``: its line's length, counted against MAX_KEPT_BYTES)."""
        a = self._attempt(ev["attempt"])
        if a is None:
            self.dropped += 1
            return
        kind = ev["event"]
        if kind == "step":
            a["steps"].append(ev)
            return
        if kind == "checkpoint":
            a["checkpoint_s"] += float(ev["seconds"] or 0.0)
        name = _LISTS.get(kind)
        if (size and self.kept_bytes + size > MAX_KEPT_BYTES) or (
                name is not None and len(a[name]) >= PER_ATTEMPT.get(name, 1 << 62)):
            self.dropped += 1
            return
        self.kept_bytes += size
        if kind == "start":
            a["start"] = a["start"] or ev
            a["end"] = None   # a launch after a re-layout or restart: the earlier launch's end is not the attempt's
        elif kind == "end":
            a["end"] = ev
        if name is not None:
            a[name].append(ev)

    # ------------------------------------------------------------------ bytes in chunks
    def feed(self, chunk: bytes) -> None:
        """The next bytes of events.jsonl (any split; a torn last line waits for the rest)."""
        if self._skipping:   # the rest of an over-long line
            nl = chunk.find(b"\n")
            if nl < 0:
                return
            chunk, self._skipping = chunk[nl + 1:], False
        buf = self._tail + chunk
        cut = buf.rfind(b"\n") + 1
        self._tail = buf[cut:]
        if len(self._tail) > MAX_LINE:   # no event is that long: skip the line to its end
            self.skipped += 1
            self._tail, self._skipping = b"", True
        if cut:
            self._lines(buf[:cut])

    def close(self) -> None:
        if self._tail.strip():
            self._lines(self._tail + b"\n")
        self._tail = b""

    def _lines(self, block: bytes) -> None:
        """Complete lines: the launcher's step lines by the pattern when every line that starts
        as a step event matches it, the block line by line in order otherwise."""
        found = _STEP.findall(block)
        if not found or len(found) != block.count(b"\n" + _PREFIX) + block.startswith(_PREFIX):
            self._slow(block)
            return
        rest = ([] if len(found) == block.count(b"\n") else
                [line for line in block.split(b"\n") if line.strip() and not line.startswith(_PREFIX)])
        if not self._fast_steps(found, rest):
            self._slow(block)

    def _fast_steps(self, found: list[tuple[bytes, ...]], rest: list[bytes]) -> bool:
        """Add the pattern's steps as columns and the block's other lines (``rest``) through the
        schema; False (nothing added) when the block must be read in order instead: a value out
        of the schema's range, or another line that is a step event after all."""
        others: list[tuple[dict[str, Any], int]] = []
        skipped = 0
        for line in rest:
            evs, bad = self._parse_line(line)
            skipped += bad
            if evs and evs[0]["event"] == "step":
                return False
            others += [(ev, len(line) + 1) for ev in evs]
        times, attempts, steps, losses, step_times = zip(*found)
        cols = (array("d", map(float, times)), array("q", map(int, steps)),
                array("d", map(float, losses)), array("d", map(float, step_times)))
        limit = events_mod.MAX_NUMBER
        if any(not (-limit <= min(c) and max(c) <= limit) for c in cols):   # NaN never gets here
            return False
        self.skipped += skipped
        for ev, size in others:
            self.add(ev, size)
        if len(set(attempts)) == 1:
            a = self._attempt(int(attempts[0]))
            if a is None:
                self.dropped += len(found)
                return True
            log = a["steps"]
            log.time.extend(cols[0]), log.step.extend(cols[1]), log.loss.extend(cols[2])
            log.step_time.extend(cols[3])
            return True
        for i, n in enumerate(attempts):
            self.add({"event": "step", "attempt": int(n), "time": cols[0][i], "step": cols[1][i],
                      "loss": cols[2][i], "step_time": cols[3][i]})
        return True

    def _slow(self, block: bytes) -> None:
        for line in block.split(b"\n"):
            evs, skipped = self._parse_line(line)
            self.skipped += skipped
            for ev in evs:
                self.add(ev, len(line) + 1)

    @staticmethod
    def _parse_line(line: bytes) -> tuple[list[dict[str, Any]], int]:
        if not line.strip():
            return [], 0
        if len(line) > MAX_LINE:
            return [], 1
        return events_mod.parse([line])

    # ------------------------------------------------------------------ the result
    def attempts(self) -> list[dict[str, Any]]:
        """The attempts, oldest first, each as :func:`by_attempt` describes."""
        self.close()
        ordered = [self.found[k] for k in sorted(self.found)]
        for i, a in enumerate(ordered):
            a["ended"] = (a["end"]["reason"] if a["end"] is not None
                          else "running" if i == len(ordered) - 1 else "killed")
        return ordered


def by_attempt(evs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Valid events grouped into attempts, oldest first. Each: ``attempt``, its first ``start``
    and its ``end`` events (or None), its ``steps`` (a :class:`StepLog`), ``checkpoint_s`` (the
    seconds of all its checkpoints), ``checkpoints``, ``profiles``, ``starts``, ``relayouts``,
    ``grows`` and ``crashes`` (lists of events: an in-job re-layout or a restart after a crash
    ends one launch of the attempt and starts the next, same attempt), and ``ended``: the last
    launch's end reason, else "running" for the last attempt and "killed" for an earlier one (a
    later attempt exists: this one died without writing its end)."""
    fold = Fold()
    for ev in evs:
        fold.add(ev)
    return fold.attempts()


def read_attempts(blob: bytes) -> Fold:
    """events.jsonl's bytes (already read, bounded by the caller) folded."""
    fold = Fold()
    for i in range(0, len(blob), 8 << 20):
        fold.feed(blob[i:i + (8 << 20)])
    fold.close()
    return fold


def relayout_outcomes(attempt: dict[str, Any]) -> list[dict[str, Any]]:
    """Each in-job re-layout of one attempt (``by_attempt``'s grouping) with what was predicted
    and what was measured: the median step before it (in its launch, first step left out) and
    after (the next launch's), the seconds it saved over the steps that followed it, and what it
    cost (its checkpoint, plus the gap until the next launch had set up and resumed)."""
    out = []
    starts, log = attempt["starts"], attempt["steps"]
    for i, r in enumerate(attempt["relayouts"]):
        nxt = next((s for s in starts if s["time"] is not None and r["time"] is not None
                    and s["time"] >= r["time"]), None)
        ckpt = next((c for c in reversed(attempt["checkpoints"]) if c["reason"] == "relayout"
                     and c["step"] == r["step"]), None)
        t0 = nxt["time"] if nxt is not None else -math.inf
        later = [] if i >= MEASURED_RELAYOUTS else \
            [st for s, t, st in zip(log.step, log.time, log.step_time) if s > r["step"] and not t < t0]
        after = median(later[1:]) if len(later) > 1 else None
        cost = None
        if nxt is not None:
            cost = nxt["time"] - r["time"] + float((ckpt or {}).get("seconds") or 0.0)
        out.append({"step": r["step"], "from": r["boundaries_from"], "to": r["boundaries_to"],
                    "step_s": r["step_s"], "predicted_step_s": r["predicted_step_s"],
                    "measured_step_s": after, "predicted_gain_s": r["gain_s"],
                    "measured_gain_s": (None if after is None or r["step_s"] is None
                                        else (r["step_s"] - after) * len(later)),
                    "predicted_cost_s": r["cost_s"], "measured_cost_s": cost})
    return out


def growth_outcomes(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each growth (an attempt that requeued itself to come back on more nodes, ``by_attempt``'s
    grouping) with what was predicted and what was measured: the nodes the next attempt got,
    its median step (first step left out), the seconds saved over its steps, and what the
    growth cost (its checkpoint, plus the gap until the next attempt had set up and resumed)."""
    out = []
    for a, b in zip(attempts, attempts[1:]):
        n = len(b["steps"])
        after = median(b["steps"].step_time[1:]) if n > 1 and a["grows"] else None
        for g in a["grows"]:
            ckpt = next((c for c in reversed(a["checkpoints"]) if c["reason"] == "grow"), None)
            start = b["start"] or {}
            cost = (start["time"] - g["time"] + float((ckpt or {}).get("seconds") or 0.0)
                    if start.get("time") is not None and g["time"] is not None else None)
            out.append({"attempt": a["attempt"], "step": g["step"], "nodes_from": g["nodes_from"],
                        "nodes_to": g["nodes_to"], "nodes_got": start.get("nodes"), "step_s": g["step_s"],
                        "predicted_step_s": g["predicted_step_s"], "measured_step_s": after,
                        "predicted_gain_s": g["gain_s"],
                        "measured_gain_s": (None if after is None or g["step_s"] is None
                                            else (g["step_s"] - after) * n),
                        "predicted_cost_s": g["cost_s"], "measured_cost_s": cost})
    return out
