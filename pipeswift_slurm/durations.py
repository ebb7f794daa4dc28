"""Durations as people read them, the two forms every command uses: :func:`duration` in prose
(``1.2 s``, ``3.5 min``, ``2.00 h``: a plan, a status, a step) and :func:`hms`, sacct's elapsed
form (``[D-]HH:MM:SS``: the history's tables and ``history show``)."""

from __future__ import annotations


def duration(s: float | None, compact: bool = False) -> str:
    """``1.2 s``, ``3.5 min``, ``2.00 h`` (``compact``: ``1s``, ``3.5m``, ``2.00h``); signed."""
    if s is None:
        return "-"
    sign, a = ("-" if s < 0 else ""), abs(s)
    sep = "" if compact else " "
    if 0 < a < 1:
        return f"{sign}{a * 1000:.0f}{sep}ms"
    if a < 120:
        return f"{sign}{a:.0f}{sep}s"
    if a < 7200:
        return f"{sign}{a / 60:.1f}{sep}{'m' if compact else 'min'}"
    return f"{sign}{a / 3600:.2f}{sep}h"


def hms(seconds: float) -> str:
    """sacct's elapsed form: ``HH:MM:SS``, ``D-HH:MM:SS``."""
    s = int(abs(seconds) + 0.5)                  # half away from zero, as SQLite's ROUND
    sign = "-" if seconds < 0 and s else ""
    d, rest = divmod(s, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    return f"{sign}{f'{d}-' if d else ''}{h:02d}:{m:02d}:{sec:02d}"
