"""Which jobs an admin command reads, in sacct's words: ``-u/--user``, ``-A/--account``,
``-r/--partition``, ``-q/--qos``, ``-s/--state`` (comma lists, sacct's abbreviations),
``-S/--starttime`` and ``-E/--endtime`` (sacct's time forms), ``-j/--jobs`` (a comma list).

One home for the rule: :meth:`Selection.where` turns a selection into SQL over a table that has
the roll-up's column names; every admin command reads through it.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from typing import Any, NamedTuple

from pipeswift_slurm.errors import PswiftError
from pipeswift_slurm.numeric import finite


class SelectionError(PswiftError):
    exit_code = 2


#: sacct's state abbreviations (``sacct --helpformat`` / the man page's JOB STATE CODES)
STATE_CODES = {"BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CF": "CONFIGURING",
               "CG": "COMPLETING", "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL",
               "OOM": "OUT_OF_MEMORY", "PD": "PENDING", "PR": "PREEMPTED", "R": "RUNNING",
               "RQ": "REQUEUED", "RS": "RESIZING", "RV": "REVOKED", "S": "SUSPENDED",
               "TO": "TIMEOUT"}
STATES = frozenset(STATE_CODES.values())

_UNITS = {"": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "m": 60, "min": 60,
          "mins": 60, "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600,
          "d": 86400, "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}


class Selection(NamedTuple):
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    qos: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    job_ids: tuple[str, ...] = ()
    start: float | None = None      # submitted at or after
    end: float | None = None        # submitted before
    pswift_only: bool = False
    clusters: tuple[str, ...] = ()  # several clusters may share one history (one slurmdbd)

    def where(self, t: str = "r", state_col: str = "last_state") -> tuple[str, list[Any]]:
        """SQL conditions on table alias ``t`` (roll-up column names) and their parameters. On
        the roll-up (``state_col`` last_state) the states select a job by any of its attempts'
        states, as sacct --duplicates shows each attempt: ``-s PR`` finds the jobs preempted
        once and completed after; on Slurm's attempts (``state``), each attempt by its own."""
        conds: list[str] = ["1=1"]
        params: list[Any] = []
        for col, vals in (("user", self.users), ("account", self.accounts),
                          ("partition", self.partitions), ("qos", self.qos),
                          (state_col, self.states), ("job_id", self.job_ids), ("cluster", self.clusters)):
            if not vals:
                continue
            marks = ", ".join("?" * len(vals))
            if col == "last_state":
                conds.append(f"EXISTS (SELECT 1 FROM slurm_jobs a WHERE a.cluster = {t}.cluster AND "
                             f"a.job_id = {t}.job_id AND a.state IN ({marks}))")
            else:
                conds.append(f"{t}.{col} IN ({marks})")
            params.extend(vals)
        if self.start is not None:
            conds.append(f"{t}.submit >= ?")
            params.append(self.start)
        if self.end is not None:
            conds.append(f"{t}.submit < ?")
            params.append(self.end)
        if self.pswift_only:
            conds.append(f"{t}.work_dir IN (SELECT run_dir FROM jobs)")
        return " AND ".join(conds), params

    def describe(self) -> str:
        """The selection in words, for a plot's title: "partition low, user bob, submitted
        2026-11-01 to 2026-12-01"; "all jobs" when it selects everything."""
        parts = [f"{word} {','.join(vals)}" for word, vals in (
            ("partition", self.partitions), ("user", self.users), ("account", self.accounts),
            ("QOS", self.qos), ("state", self.states), ("job", self.job_ids), ("cluster", self.clusters)) if vals]
        def day(t: float) -> str:
            return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")
        if self.start is not None or self.end is not None:
            parts.append("submitted " + (f"from {day(self.start)}" if self.start is not None else "")
                         + (" " if self.start is not None and self.end is not None else "")
                         + (f"before {day(self.end)}" if self.end is not None else ""))
        if self.pswift_only:
            parts.append("pswift jobs only")
        return ", ".join(parts) or "all jobs"

    @property
    def narrows(self) -> bool:
        """True when it names users, jobs or a time window (pswift runs with no Slurm record
        yet carry none of those, so they are left out)."""
        return bool(self.users or self.job_ids or self.start is not None or self.end is not None
                    or self.accounts or self.qos)


def comma_list(text: str | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.strip() for p in (text or "").split(",") if p.strip()))


def states(text: str | None) -> tuple[str, ...]:
    """``-s cd,F,preempted`` -> ('COMPLETED', 'FAILED', 'PREEMPTED'); an unknown one is an error."""
    out = []
    for s in comma_list(text):
        full = STATE_CODES.get(s.upper(), s.upper())
        if full not in STATES:
            raise SelectionError(f"state {s!r}: use a Slurm job state or its code "
                                 f"({', '.join(f'{k}={v}' for k, v in sorted(STATE_CODES.items()))})")
        out.append(full)
    return tuple(dict.fromkeys(out))


def job_ids(text: str | None) -> tuple[str, ...]:
    ids = comma_list(text)
    bad = [j for j in ids if not re.fullmatch(r"\d+([_+]\d+)?|local:\d+", j)]
    if bad:
        raise SelectionError(f"job id {bad[0]!r}: use numbers, comma-separated (-j 12,15,20), or a local "
                             f"run's id as listed (local:3)")
    return ids


def parse_time(text: str | None, now: float | None = None) -> float | None:
    """sacct's time forms as epoch seconds (local time): ``now[{+|-}N[unit]]``, ``today``,
    ``midnight``, ``noon``, ``YYYY-MM-DD[THH:MM[:SS]]``, ``MM/DD[/YY]``, ``HH:MM[:SS]``; and
    pswift's older ages ``7d``, ``12h``."""
    if text is None:
        return None
    t = text.strip().lower()
    now = time.time() if now is None else now
    today = _dt.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    m = re.fullmatch(r"now(?:([+-])(\d+)([a-z]*))?", t)
    if m and (m.group(3) or "") in _UNITS:
        return _offset(text, now, (1 if m.group(1) == "+" else -1) * int(m.group(2) or 0) * _UNITS[m.group(3) or ""])
    m = re.fullmatch(r"(\d+)([mhdw])", t)
    if m:
        return _offset(text, now, -int(m.group(1)) * _UNITS[m.group(2)])
    named = {"today": today, "midnight": today, "noon": today.replace(hour=12)}
    if t in named:
        return named[t].timestamp()
    m = re.fullmatch(r"(\d{1,2})/(\d{1,2})(?:/(\d{2}))?", t)
    if m:
        year = 2000 + int(m.group(3)) if m.group(3) else today.year
        return _parsed(text, lambda: _dt.datetime(year, int(m.group(1)), int(m.group(2))))
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", t):
        return _parsed(text, lambda: _dt.datetime.combine(today.date(), _dt.time.fromisoformat(t.zfill(5))))
    return _parsed(text, lambda: _dt.datetime.fromisoformat(text.strip()))


#: the furthest a relative time may reach from now (about 3,000 years)
MAX_OFFSET_S = 10**11


def _offset(text: str, now: float, seconds: int) -> float:
    moved = finite(now + seconds) if abs(seconds) <= MAX_OFFSET_S else None
    if moved is None:
        raise SelectionError(f"time {text!r} is further than {MAX_OFFSET_S:.0e} s from now; "
                             f"use a nearer time (now-30days, 2026-11-01)")
    return moved


def _parsed(text: str, make: Any) -> float:
    try:
        return float(make().timestamp())
    except ValueError:
        raise SelectionError(f"time {text!r}: use one of sacct's forms: 2026-11-01, 2026-11-01T08:00, "
                             f"11/01, 08:00, today, now-7days (or an age: 7d, 12h)") from None


def build(user: str | None = None, account: str | None = None, partition: str | None = None,
          qos: str | None = None, state: str | None = None, jobs: str | None = None,
          start: str | None = None, end: str | None = None, pswift_only: bool = False,
          clusters: str | None = None) -> Selection:
    """A selection from the command line's texts, each checked here with its fix."""
    return Selection(comma_list(user), comma_list(account), comma_list(partition), comma_list(qos),
                     states(state), job_ids(jobs), parse_time(start), parse_time(end), pswift_only,
                     comma_list(clusters))
