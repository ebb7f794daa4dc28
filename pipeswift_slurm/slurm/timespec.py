"""Slurm's time syntax (``--time``, ``TimeLimit``): read and written here only. A contract the
config shares with the Slurm readers: it imports nothing of the package."""

from __future__ import annotations

import math
import re

_TIME_RE = re.compile(
    r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$"
)


def slurm_minutes(seconds: float) -> str:
    """A limit in seconds as sbatch's and scontrol's ``--time``: whole minutes, rounded up, at
    least one (Slurm's unit)."""
    return str(max(1, math.ceil(seconds / 60 - 1e-9)))


def slurm_time_seconds(text: str) -> int:
    """Seconds in a Slurm time string: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    m = _TIME_RE.match(text.strip())
    if not m:
        raise ValueError(text)
    d, b, c = (int(x) if x is not None else None for x in m.group("d", "b", "c"))
    a = int(m.group("a"))          # the one number every form has
    if d is not None:  # D-H[:M[:S]]
        return ((d * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None and b is not None:  # H:M:S
        return (a * 60 + b) * 60 + c
    if b is not None:  # M:S
        return a * 60 + b
    return a * 60  # M
