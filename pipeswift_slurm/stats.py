"""The one quantile helper: every percentile and median in pswift (reports, history rows, the
planner's calibration, the launcher's hang limit) is computed here, one way: linear
interpolation between order statistics (``statistics.quantiles``' "inclusive" method, NumPy's
default), ignoring None. Kept to the standard library's plainest parts: the submit path imports it."""

from __future__ import annotations

from typing import Iterable


def quantile(xs: Iterable[float | None], q: float) -> float | None:
    """The ``q`` quantile (0 <= q <= 1) of the values, None when there are none."""
    return quantiles(xs, (q,))[0]


def quantiles(xs: Iterable[float | None], qs: Iterable[float], clean: bool = False) -> list[float | None]:
    """Several quantiles of the values with one sort (``clean``: ``xs`` is a list with no None,
    sorted in place)."""
    if clean and isinstance(xs, list):
        xs.sort()
        data = xs
    else:
        data = sorted(x for x in xs if x is not None)
    out: list[float | None] = []
    for q in qs:
        if not data:
            out.append(None)
            continue
        pos = (len(data) - 1) * min(1.0, max(0.0, q))
        lo = int(pos)
        hi = min(lo + 1, len(data) - 1)
        out.append(data[lo] + (data[hi] - data[lo]) * (pos - lo))
    return out


def median(xs: Iterable[float | None]) -> float | None:
    return quantile(xs, 0.5)


def median_of(xs: Iterable[float]) -> float:
    """The median of values known to be there (ValueError when there are none)."""
    m = median(xs)
    if m is None:
        raise ValueError("the median of no values")
    return m
