"""Events into attempts, streamed and bounded: the one reading of a run's events.jsonl into its
attempts (``pswift status``, the history and the jobcomp plugin all use it).

A run's log may be as large as the readers' cap (256 MiB, millions of steps) and is written by
the user: the fold never holds it whole. :class:`Fold` takes the file in chunks of bytes; step
events, the bulk of any real log, are kept as four typed columns (:class:`StepLog`, 32 bytes a
step); every other event is kept as its validated dict within bounds:

- at most MAX_ATTEMPTS attempts (the newest by number), MAX_KEPT_EVENTS stored non-step events
  and MAX_KEPT_BYTES of their lines over the whole run, and PER_ATTEMPT of each kind an attempt:
  what lies beyond is counted in ``dropped``, never an error;
- what no reader needs is not kept: a checkpoint adds its seconds to its attempt and is kept
  only when a re-layout or a growth wrote it (their outcomes read it); of the layer profiles
  only the newest of each micro-batch size (the history keeps no other) and the newest with
  instruction times (the overheads' source) stay, at most MAX_PROFILES;
- lines over MAX_LINE bytes are skipped lines (no event of the schema is that long), and lines
  other than the launcher's step lines are read through the schema up to MAX_SLOW_BYTES in all
  (JSON and the schema's checks cost ~30x the pattern), the rest counted in ``dropped`` unread.

So the fold's memory is bounded by what it keeps, not by the file's bytes: 16 MiB of the
smallest legal lines are counted, not held (tests/test_eventfold.py's property test holds a
file at the 256 MiB cap, of any mix of legal lines, to 8 s and 256 MB).

The launcher's own step lines are read by one anchored pattern at C speed; a chunk with
anything the pattern does not take is read event by event, in order, through
:func:`events.parse`, so the result is the same as reading every line through the schema.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from array import array
from typing import Any, Iterable, Iterator

from pipeswift_slurm import events as events_mod
from pipeswift_slurm.stats import median

MAX_ATTEMPTS = 1000
MAX_KEPT_EVENTS = 20_000
MAX_KEPT_BYTES = 16 << 20
#: the lines, and their bytes, read through the schema rather than the launcher's step pattern
#: (JSON and the schema's checks cost ~7 us a line): a real run's checkpoints, launches and
#: profiles are a few thousand lines; the rest are counted unread
MAX_SLOW_LINES = 50_000
MAX_SLOW_BYTES = 16 << 20
MAX_LINE = 8 << 20
#: per attempt: a launch per restart and per re-layout (each bounded by the plan at 100), a crash
#: per restart, a checkpoint per re-layout or growth
PER_ATTEMPT = {"relayouts": 100, "grows": 100, "starts": 300, "crashes": 300, "checkpoints": 200,
               "evals": 1000}   # validation losses ([training] eval_every): the plot's points
MAX_PROFILES = 16
#: the checkpoint reasons whose events are kept (their writers' outcomes read them)
KEPT_CHECKPOINTS = ("relayout", "grow")
_LISTS = {"checkpoint": "checkpoints", "layer_profile": "profiles", "start": "starts",
          "relayout": "relayouts", "grow": "grows", "crash": "crashes", "eval": "evals"}

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

    def times_from(self, index: int, stop: int | None = None) -> list[float]:
        """Step times of the steps logged from ``index`` up to ``stop`` (a slice: C speed)."""
        return self.step_time[index:stop].tolist()


def _new_attempt(n: int) -> dict[str, Any]:
    return {"attempt": n, "start": None, "end": None, "steps": StepLog(), "checkpoint_s": 0.0,
            "restarts": 0, "last_crash": None, "logged_at": {"starts": [], "relayouts": []},
            **{name: [] for name in _LISTS.values()}}


class Fold:
    """Feed events.jsonl's bytes in chunks (:meth:`feed`), then :meth:`attempts`."""

    def __init__(self) -> None:
        self.found: dict[int, dict[str, Any]] = {}
        self.kept: list[int] = []         # heap of the attempt numbers kept
        self.kept_bytes = 0
        self.kept_events = 0
        self.slow_lines = self.slow_bytes = 0   # read through the schema (not the step pattern)
        #: the profiles kept: by micro-batch size, and the newest with instruction times (None
        #: as key), each (attempt number, event, its line's size)
        self.profiles: dict[int | None, tuple[int, dict[str, Any], int]] = {}
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
            if ev["reason"] not in KEPT_CHECKPOINTS:
                return
        elif kind == "crash":   # counted whole; the list below is for showing them
            a["restarts"] += ev["action"] == "restart"
            a["last_crash"] = ev
        name = _LISTS.get(kind)
        if (self.kept_events >= MAX_KEPT_EVENTS or (size and self.kept_bytes + size > MAX_KEPT_BYTES)
                or (name is not None and len(a[name]) >= PER_ATTEMPT.get(name, 1 << 62))):
            self.dropped += 1
            return
        if kind == "layer_profile":
            self._keep_profile(a, ev, size)
            return
        self.kept_bytes += size
        self.kept_events += 1
        if kind == "start":
            a["start"] = a["start"] or ev
            a["end"] = None   # a launch after a re-layout or restart: the earlier launch's end is not the attempt's
        elif kind == "end":
            a["end"] = ev
        if name is not None:
            a[name].append(ev)
            if name in a["logged_at"]:   # where in the step log it came: launches cut it in file order
                a["logged_at"][name].append(len(a["steps"]))

    def _keep_profile(self, a: dict[str, Any], ev: dict[str, Any], size: int) -> None:
        """Keep ``ev`` as the newest profile of its micro-batch size (and as the newest with
        instruction times when it has them), letting go of the one it replaces."""
        keys: list[int | None] = [ev["micro_batch_size"]] + ([None] if ev["instructions"] else [])
        if ev["micro_batch_size"] not in self.profiles and len(self.profiles) >= MAX_PROFILES:
            self.dropped += 1
            return
        for key in keys:
            old = self.profiles.pop(key, None)
            if old is not None and all(o[1] is not old[1] for o in self.profiles.values()):
                self._let_go(*old)
            self.profiles[key] = (a["attempt"], ev, size)
        self.kept_bytes += size
        self.kept_events += 1
        a["profiles"].append(ev)

    def _let_go(self, attempt: int, ev: dict[str, Any], size: int) -> None:
        held = self.found.get(attempt)
        if held is not None:
            held["profiles"][:] = [p for p in held["profiles"] if p is not ev]
        self.kept_bytes -= size
        self.kept_events -= 1

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
        found = _STEP.findall(block) if _PREFIX in block else []
        if not found or len(found) != block.count(b"\n" + _PREFIX) + block.startswith(_PREFIX):
            self._slow(block)
            return
        rest: list[tuple[int, bytes]] = []   # (step lines before it in the block, line)
        if len(found) != block.count(b"\n"):
            before = 0
            for line in block.split(b"\n"):
                if line.startswith(_PREFIX):
                    before += 1
                elif line.strip():
                    rest.append((before, line))
        if not self._fast_steps(found, rest):
            self._slow(block)

    def _fast_steps(self, found: list[tuple[bytes, ...]], rest: list[tuple[int, bytes]]) -> bool:
        """Add the pattern's steps as columns and the block's other lines (``rest``: each with
        how many of the block's step lines come before it) through the schema, launches and
        re-layouts at their place among the steps (their outcomes cut the step log there);
        False (nothing added) when the block must be read in order instead: a value out of the
        schema's range, or another line that is a step event after all."""
        others: list[tuple[int, dict[str, Any], int]] = []   # (place among the steps or -1, event, size)
        skipped = unread = 0
        for before, line in rest:
            evs, bad, over = self._parse_line(line)
            skipped, unread = skipped + bad, unread + over
            if evs and evs[0]["event"] == "step":
                return False
            others += [(before if ev["event"] in ("start", "relayout") else -1, ev, len(line) + 1) for ev in evs]
        times, attempts, steps, losses, step_times = zip(*found)
        cols = (array("d", map(float, times)), array("q", map(int, steps)),
                array("d", map(float, losses)), array("d", map(float, step_times)))
        limit = events_mod.MAX_NUMBER
        if any(not (-limit <= min(c) and max(c) <= limit) for c in cols):   # NaN never gets here
            return False
        self.skipped += skipped
        self.dropped += unread
        done = 0
        for before, ev, size in others:
            if before >= 0:
                self._add_columns(attempts, cols, done, before)
                done = before
            self.add(ev, size)
        self._add_columns(attempts, cols, done, len(found))
        return True

    def _add_columns(self, attempts: tuple[bytes, ...], cols: tuple[array, ...], lo: int, hi: int) -> None:  # type: ignore[type-arg]
        """The pattern's steps lo..hi of a block: as column slices when they share an attempt."""
        if lo >= hi:
            return
        if attempts[lo] == attempts[hi - 1] and len(set(attempts[lo:hi])) == 1:
            a = self._attempt(int(attempts[lo]))
            if a is None:
                self.dropped += hi - lo
                return
            log = a["steps"]
            log.time.extend(cols[0][lo:hi]), log.step.extend(cols[1][lo:hi]), log.loss.extend(cols[2][lo:hi])
            log.step_time.extend(cols[3][lo:hi])
            return
        for i in range(lo, hi):
            self.add({"event": "step", "attempt": int(attempts[i]), "time": cols[0][i], "step": cols[1][i],
                      "loss": cols[2][i], "step_time": cols[3][i]})

    def _slow(self, block: bytes) -> None:
        """A block read in order: the launcher's step lines still by the pattern (one line at
        a time), every other line through the schema within the budget (MAX_SLOW_LINES, which
        this line-by-line reading also draws on, and MAX_SLOW_BYTES); once that is spent, the
        block's step lines by the pattern at once and the rest counted unread."""
        if self._spent():
            self._unread(block)
            return
        limit = events_mod.MAX_NUMBER
        for line in block.split(b"\n"):
            m = _STEP.fullmatch(line) if line.startswith(_PREFIX) else None
            if m is not None:
                self.slow_lines += 1   # a step line read one at a time costs the budget too
                t, attempt, step, loss, step_time = m.groups()
                values = (float(t), int(step), float(loss), float(step_time))
                if all(-limit <= v <= limit for v in values):
                    self.add({"event": "step", "attempt": int(attempt), "time": values[0], "step": values[1],
                              "loss": values[2], "step_time": values[3]})
                    continue
            evs, skipped, unread = self._parse_line(line)
            self.skipped += skipped
            self.dropped += unread
            for ev in evs:
                self.add(ev, len(line) + 1)

    def _unread(self, block: bytes) -> None:
        """Past the schema's budget: the launcher's step lines within the schema's range are
        added, every other line that is not empty is counted in ``dropped`` (no event that needs
        its place among the steps is read)."""
        limit = events_mod.MAX_NUMBER
        found = [] if _PREFIX not in block else [
            f for f in _STEP.findall(block) if all(-limit <= float(x) <= limit for x in (f[0], f[2], f[3], f[4]))]
        lines = block.count(b"\n") - block.count(b"\n\n") - block.startswith(b"\n")
        self.dropped += max(0, lines - len(found))
        if found:
            times, attempts, steps, losses, step_times = zip(*found)
            cols = (array("d", map(float, times)), array("q", map(int, steps)),
                    array("d", map(float, losses)), array("d", map(float, step_times)))
            self._add_columns(attempts, cols, 0, len(found))

    def _spent(self) -> bool:
        return self.slow_lines >= MAX_SLOW_LINES or self.slow_bytes >= MAX_SLOW_BYTES

    def _parse_line(self, line: bytes) -> tuple[list[dict[str, Any]], int, int]:
        """(events, lines skipped, lines left unread) of one line through the schema: past
        MAX_SLOW_LINES or MAX_SLOW_BYTES of such reading a line is left unread (counted as
        dropped)."""
        if not line.strip():
            return [], 0, 0
        if len(line) > MAX_LINE:
            return [], 1, 0
        if self._spent() or self.slow_bytes + len(line) > MAX_SLOW_BYTES:
            return [], 0, 1
        self.slow_lines += 1
        self.slow_bytes += len(line) + 1
        try:
            ev = events_mod.validate(json.loads(line.decode("utf-8")))
        except (ValueError, RecursionError):   # bad UTF-8 or JSON, 5000-digit ints, deep nesting
            ev = None
        return ([], 1, 0) if ev is None else ([ev], 0, 0)

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
    seconds of all its checkpoints), ``restarts`` (its crashes that restarted) and
    ``last_crash`` (an event or None), ``checkpoints`` (only a re-layout's or a growth's),
    ``profiles`` (the newest ones, see :class:`Fold`), ``starts``, ``relayouts``, ``grows`` and
    ``crashes`` (lists of events: an in-job re-layout or a restart after a crash
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


def _kept_checkpoint(attempt: dict[str, Any], reason: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The attempt's last checkpoint of ``reason`` by step, and the last of all under (None,)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in attempt["checkpoints"]:
        if c["reason"] == reason:
            out[(c["step"],)] = out[(None,)] = c
    return out


def _next_launch(attempt: dict[str, Any], i: int) -> tuple[dict[str, Any] | None, int]:
    """The launch that followed re-layout ``i`` (the first start logged after it, as the
    launcher writes them in order) and where in the step log it began."""
    starts, at = attempt["starts"], attempt["logged_at"]
    r_at = at["relayouts"][i]
    r = attempt["relayouts"][i]
    for s, s_at in zip(starts, at["starts"]):
        if s_at >= r_at and (s["time"] is None or r["time"] is None or s["time"] >= r["time"]):
            return s, s_at
    return None, len(attempt["steps"])


def relayout_outcomes(attempt: dict[str, Any]) -> list[dict[str, Any]]:
    """Each in-job re-layout of one attempt (``by_attempt``'s grouping) with what was predicted
    and what was measured: the median step under its cut (the steps logged from the launch that
    followed it until the next re-layout, that launch's first step left out), the seconds it
    saved over those steps, and what it cost (its checkpoint, plus the gap until the next
    launch had set up and resumed). Each reads its own slice of the step log once."""
    out = []
    ckpts = _kept_checkpoint(attempt, "relayout")
    ats = attempt["logged_at"]["relayouts"]
    for i, r in enumerate(attempt["relayouts"]):
        nxt, lo = _next_launch(attempt, i)
        hi = ats[i + 1] if i + 1 < len(ats) else None
        later = attempt["steps"].times_from(lo, hi) if hi is None or hi > lo else []
        ckpt = ckpts.get((r["step"],))
        after = median(later[1:]) if len(later) > 1 else None
        cost = None
        if nxt is not None and nxt["time"] is not None and r["time"] is not None:
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
        ckpt = _kept_checkpoint(a, "grow").get((None,))
        for g in a["grows"]:
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
