"""How every admin read command prints rows, as sacct does: streamed (a million rows start at
once and never sit in memory), one unit per column, and the same row in every form.

- a terminal: fixed-width columns, durations as ``[D-]HH:MM:SS``, a value too wide ends in ``+``;
- piped: tab-separated values, each cell as the terminal shows it, under the same headers;
- ``-P/--parsable``: ``|``-separated, the same cells; ``--csv`` (raw numbers: seconds, hours,
  ratios; a text a spreadsheet would run as a formula gets a leading apostrophe); ``--json`` (a
  list of objects, raw numbers, null for unknown);
- ``-n/--noheader``; ``-o/--format`` picks and orders columns by key or by sacct's field name
  (JobID, State, Elapsed, NNodes, ...); times are ISO 8601 (local) in every form.
Text from users (job names, paths) is printed inert: control characters become ``?``.

The machine forms are rendered by SQLite itself (:meth:`Renderer.sql`: one expression per
line) inside the query that reads the rows, so a million-row listing runs at sqlite3's pace;
rows computed in Python go through the same expressions (SQLite's ``VALUES`` in memory), so each
form has one rule.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import re
import sqlite3
import sys
from typing import Any, Callable, Container, Iterable, Iterator, NamedTuple, Sequence, TextIO

from pipeswift_slurm.durations import hms
from pipeswift_slurm.terminal import CONTROL, inert, json_inert
from pipeswift_slurm.history.selection import SelectionError


class Col(NamedTuple):
    key: str
    header: str
    #: text | int | bool | float | s (seconds) | h (hours) | ratio | mb | time (epoch)
    kind: str = "text"
    width: int = 10
    #: the width was asked for (-o Name%30): the header is cut to it too, as sacct's
    fixed: bool = False


#: the unit a column's header names, where its cells show none (a duration is [D-]HH:MM:SS and a
#: ratio 50.0% on a terminal and piped alike, as sacct's; CSV and JSON, for programs, hold seconds
#: and 0.5)
_UNIT = {"h": " (h)", "mb": " (MB)"}


def heading(c: Col) -> str:
    """A column's header, the same on a terminal, piped and with -P (as sacct's); CSV and JSON,
    the forms for programs, are keyed by the column's key."""
    return c.header + _UNIT.get(c.kind, "")
_FORMULA = ("=", "+", "-", "@")
_CONTROL_BUT_TAB = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


#: sacct's field names (``sacct -o``, any case) for the columns that hold the same figure
SACCT_FIELDS = {"jobid": "job_id", "jobname": "name", "exitcode": "exit_code",
                "derivedexitcode": "derived_exit_code", "nnodes": "nodes", "ncpus": "cpus",
                "elapsed": "elapsed_s", "timelimit": "limit_s", "totalcpu": "cpu_time_s",
                "maxrss": "max_rss_mb", "reqmem": "req_mem_mb", "planned": "queue_s",
                "reserved": "queue_s", "alloctres": "alloc_tres"}


def choose(columns: list[Col], fields: str | None) -> list[Col]:
    """The columns named by ``-o/--format`` (headers, keys or sacct's field names, comma-separated,
    any case, each with sacct's optional ``%WIDTH``), in that order."""
    if not fields:
        return columns
    by_key = {heading(c).lower(): c for c in columns}
    by_key.update({c.header.lower(): c for c in columns})
    by_key.update({c.key.lower(): c for c in columns})
    by_key.update({name: by_key[key] for name, key in SACCT_FIELDS.items() if key in by_key})
    out = []
    for f in (p.strip().lower() for p in fields.split(",") if p.strip()):
        f, _, width = f.partition("%")      # sacct's JobName%30: that column 30 wide on a terminal
        if f not in by_key:
            raise SelectionError(f"--format field {f!r} is not a column here; use some of: "
                                 f"{','.join(c.key for c in columns)} (-o help lists every spelling)")
        if width and not (width.isdigit() and 1 <= int(width) <= 1000):
            raise SelectionError(f"--format {f}%{width}: a width is a number of characters, 1 to 1000 (JobName%30)")
        out.append(by_key[f]._replace(width=int(width), fixed=True) if width else by_key[f])
    return out


def field_help(columns: list[Col]) -> str:
    """``-o help``: every column's spellings, any of which ``-o`` takes (any case): its key
    (JSON's), its header (what the text forms print) and sacct's field names for the figure."""
    sacct: dict[str, list[str]] = {}
    for name, key in SACCT_FIELDS.items():
        sacct.setdefault(key, []).append(name)
    width = max(len(c.key) for c in columns) + 2
    lines = [f"{'key':<{width}}{'header':<16}sacct's name"]
    for c in columns:
        names = [n for n in sacct.get(c.key, []) if n != c.header.lower()]
        lines.append(f"{c.key:<{width}}{c.header:<16}{','.join(names)}".rstrip())
    return "\n".join(lines)


def _iso_sql(expr: str) -> str:
    """An epoch-seconds expression as sacct prints a time: ISO 8601, local, to the second."""
    return f"strftime('%Y-%m-%dT%H:%M:%S', {expr}, 'unixepoch', 'localtime')"


def iso_time(epoch: float) -> str:
    """An epoch as sacct prints a time (and every JSON pswift writes for people): ISO 8601,
    local, to the second."""
    return _dt.datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def _hms_sql(expr: str) -> str:
    """:func:`hms` in SQL, for the lines SQLite renders."""
    n = f"CAST(ROUND(ABS({expr})) AS INTEGER)"
    return (f"(CASE WHEN ROUND({expr}) < 0 THEN '-' ELSE '' END || CASE WHEN {n} >= 86400 THEN ({n} / 86400) || '-' "
            f"ELSE '' END || printf('%02d:%02d:%02d', {n} % 86400 / 3600, {n} % 3600 / 60, {n} % 60))")


def _cell_sql(expr: str, kind: str) -> str:
    """:func:`_cell` in SQL: a piped line's cell as the terminal shows it (NULL stays empty)."""
    shown = {"s": _hms_sql(expr), "h": f"printf('%.2f', {expr})", "ratio": f"printf('%.1f%%', 100.0 * {expr})",
             "mb": f"printf('%.0f', {expr})", "bool": f"CASE WHEN {expr} THEN 'yes' ELSE 'no' END"}.get(kind)
    return expr if shown is None else f"CASE WHEN {expr} IS NULL THEN NULL ELSE {shown} END"


def _fixed(v: float, places: int) -> str:
    """``v`` to ``places`` decimals as SQLite's printf rounds it (half away from zero, from the
    shortest decimal of the float): a piped cell, which SQLite renders, is the terminal's."""
    v = float(v) + 0.0             # -0.0 is 0.0 (SQLite prints no sign for it)
    return str(decimal.Decimal(repr(v)).quantize(decimal.Decimal(1).scaleb(-places),
                                                        rounding=decimal.ROUND_HALF_UP))


def _cell(v: Any, kind: str) -> str:
    """A value as a terminal column shows it."""
    if v is None:
        return "unknown" if kind in ("h", "ratio", "mb") else ""
    if isinstance(v, bool) or kind == "bool":
        return "yes" if v else "no"
    if kind == "s":
        return hms(v)
    if kind == "h":
        return _fixed(v, 2)
    if kind == "ratio":
        return _fixed(100.0 * v, 1) + "%"
    if kind == "mb":
        return _fixed(v, 0)
    if kind == "time":
        return iso_time(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return inert(str(v))


def _fit(text: str, width: int) -> str:
    """``text`` right-aligned in ``width`` characters; a longer one cut, its last shown as ``+``."""
    return (text if len(text) <= width else text[:width - 1] + "+").rjust(width)


def _clean_text(v: str, form: str) -> str:
    """A user's text as a cell of ``form``: no control characters (``?``); in TSV and ``|``
    forms no separator (a tab becomes a space, a ``|`` a ``?``); in CSV, quoted when it holds a
    comma or a quote, and with an apostrophe first when a spreadsheet would run it as a formula
    (= + - @)."""
    if form == "csv":
        v = inert(v)
        if v[:1] in _FORMULA:
            v = "'" + v
        return '"' + v.replace('"', '""') + '"' if "," in v or '"' in v else v
    return inert(v.replace("\t", " ").replace("|", "?"))


class Output(NamedTuple):
    form: str = "auto"        # auto | table | tsv | parsable | csv | json
    header: bool = True
    fields: str | None = None

    def resolved(self, out: TextIO) -> str:
        if self.form != "auto":
            return self.form
        return "table" if out.isatty() else "tsv"


class Renderer:
    """Writes rows of ``columns`` as ``how`` says, between :meth:`start` and :meth:`finish`:
    lines SQLite rendered with :meth:`sql` (:meth:`lines`, which checks each; a line whose user
    text holds a separator, a quote, a formula or a control character is drawn again from its
    values), or rows of Python values (:meth:`row`, numbers through the same SQL)."""

    def __init__(self, columns: list[Col], how: Output, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.columns = columns
        self.cols = choose(columns, how.fields)
        keys = [c.key for c in columns]
        self.pick = [keys.index(c.key) for c in self.cols]   # -o's %WIDTH makes another Col
        self.form = how.resolved(self.out)
        self.header = how.header
        self.sep = {"parsable": "|", "csv": ","}.get(self.form, "\t")
        self.texts = [i for i, c in enumerate(self.cols) if c.kind == "text"]
        self.widths = [c.width if c.fixed else max(c.width, len(heading(c))) for c in self.cols]
        self.count = 0
        self._batch: list[str] = []
        self._pending: list[Sequence[Any]] = []
        self._mem: sqlite3.Connection | None = None

    def sql(self, exprs: Sequence[str]) -> str | None:
        """One SQL expression rendering a row as this form's line, from ``exprs`` (SQL for every
        column, aligned with ``columns``); None for the terminal table (Python draws it). Numbers
        come out as sqlite3 prints them (reals with 15 significant digits), NULL as nothing."""
        shown = self.form in ("tsv", "parsable")     # piped as on a terminal: sacct's habit
        chosen = [(_iso_sql(exprs[i]) if self.columns[i].kind == "time" else
                   _cell_sql(exprs[i], self.columns[i].kind) if shown else exprs[i], self.columns[i])
                  for i in self.pick]
        if self.form == "table":
            return None
        if self.form == "json":
            parts = []
            for e, c in chosen:
                v = (f"json(CASE WHEN {e} IS NULL THEN 'null' WHEN {e} THEN 'true' ELSE 'false' END)"
                     if c.kind == "bool" else e)
                parts.append(f"'{c.key}', {v}")
            return f"json_object({', '.join(parts)})"
        if not chosen:
            return "''"
        return f"printf('{self.sep.join(['%s'] * len(chosen))}', {', '.join(e for e, _ in chosen)})"

    def start(self) -> None:
        if self.form == "json":
            self.out.write("[")
        elif self.header and self.form == "table":
            self.out.write(" ".join(_fit(heading(c), w) for c, w in zip(self.cols, self.widths)).rstrip() + "\n")
            self.out.write(" ".join("-" * w for w in self.widths) + "\n")
        elif self.header:   # sacct's forms print its headers; CSV, for programs, the keys (as JSON)
            self.out.write(self.sep.join(c.key if self.form == "csv" else heading(c) for c in self.cols) + "\n")

    def lines(self, rows: Iterable[Sequence[Any]], special: Container[Any],
              values: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
        """Rows of a query whose first column is the line :meth:`sql` rendered and whose last
        is a key: each line is written as it is, unless its key is ``special`` or its user text
        needs care (a separator, quote, formula or control character); then the row is drawn
        from ``values(row)``. The loop every million-row listing runs: kept tight."""
        self._flush_rows()
        batch, plain, json_form = self._batch, self._plain, self.form == "json"
        for row in rows:
            text = row[0]
            if row[-1] in special or not (json_form or plain(text)):
                self.row(values(row))
                self._flush_rows()
                batch = self._batch
                continue
            if json_form:
                text = ("," if self.count else "") + "\n  " + text
            batch.append(text)
            self.count += 1
            if len(batch) >= 4096:
                self._write()
                batch = self._batch

    def _plain(self, text: str) -> bool:
        """True when no text cell of the line holds a separator, quote, formula or control char."""
        if text.count(self.sep) != len(self.cols) - 1:
            return False
        if self.form != "csv":
            return _CONTROL_BUT_TAB.search(text) is None
        if CONTROL.search(text) or '"' in text:   # a tab too: first in a cell, a formula (OWASP)
            return False
        if not (text[:1] in _FORMULA or ",=" in text or ",+" in text or ",-" in text or ",@" in text):
            return True
        cells = text.split(",")     # a negative number also starts ",-": look at the text cells
        return not any(cells[i][:1] in _FORMULA for i in self.texts)

    def _add(self, text: str) -> None:
        if self.form == "json":
            text = ("," if self.count else "") + "\n  " + text
        self._batch.append(text)
        self.count += 1
        if len(self._batch) >= 4096:
            self._write()

    def row(self, values: Sequence[Any]) -> None:
        """A row of Python values, aligned with ``columns``."""
        if self.form == "table":
            cells = [_cell(values[i], c.kind) for i, c in zip(self.pick, self.cols)]
            self.out.write(" ".join(_fit(v, w) for v, w in zip(cells, self.widths)).rstrip() + "\n")
            self.count += 1
            return
        if self.form != "json":
            values = [_clean_text(v, self.form) if isinstance(v, str) else v for v in values]
        self._pending.append(values)
        if len(self._pending) >= 256:
            self._flush_rows()

    def _flush_rows(self) -> None:
        """Python rows through the same SQL as :meth:`sql` (SQLite's VALUES, in order)."""
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        if self._mem is None:
            self._mem = sqlite3.connect(":memory:")
        n = len(self.columns)
        expr = self.sql([f"column{i + 1}" for i in range(n)])
        values = ", ".join(["(" + ", ".join("?" * n) + ")"] * len(rows))
        flat = [int(v) if isinstance(v, bool) else v for r in rows for v in r]
        for (text,) in self._mem.execute(f"SELECT {expr} FROM (VALUES {values})", flat).fetchall():
            self._add(text)

    def _write(self) -> None:
        if self._batch:
            # SQLite's json_object passes DEL and C1 raw: written as their escapes (the same JSON)
            self.out.write(json_inert("".join(self._batch)) if self.form == "json" else "\n".join(self._batch) + "\n")
            self._batch = []

    def finish(self) -> int:
        self._flush_rows()
        self._write()
        if self.form == "json":
            self.out.write("\n]\n" if self.count else "]\n")
        return self.count


def from_dicts(rows: Iterable[dict[str, Any]], columns: list[Col]) -> Iterator[tuple[Any, ...]]:
    """Dict rows as the tuples :func:`emit` takes (each column's value, None where missing)."""
    keys = [c.key for c in columns]
    return (tuple(r.get(k) for k in keys) for r in rows)


def emit(rows: Iterable[Sequence[Any]], columns: list[Col], how: Output, out: TextIO | None = None) -> int:
    """Print Python ``rows`` (sequences aligned with ``columns``) as ``how`` says; the count."""
    r = Renderer(columns, how, out)
    r.start()
    for values in rows:
        r.row(values)
    return r.finish()
