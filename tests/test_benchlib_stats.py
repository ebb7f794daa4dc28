"""bench/benchlib.py's intervals: what a benchmark's rounds resolve."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import benchlib  # noqa: E402

costs = st.lists(st.floats(0.01, 100.0), min_size=1, max_size=12)


@settings(max_examples=30, deadline=None)
@given(costs, st.floats(0.1, 10.0))
def test_a_side_k_times_the_other_in_every_round_gives_k_with_a_point_interval(ys, k):
    lo, hi = benchlib.ratio_of_medians_interval([k * y for y in ys], ys, draws=200)
    assert abs(lo - k) < 1e-9 * k and abs(hi - k) < 1e-9 * k


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(-5.0, 50.0), st.floats(0.01, 50.0)), min_size=1, max_size=12))
def test_the_interval_is_ordered_and_holds_some_resample_ratio(pairs):
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    lo, hi = benchlib.ratio_of_medians_interval(xs, ys, draws=200)
    assert lo <= hi
    bounds = [x / y for x in (min(xs), max(xs)) for y in (min(ys), max(ys))]   # any median over any median
    assert min(bounds) - 1e-9 <= lo and hi <= max(bounds) + 1e-9


def test_a_denominator_that_can_be_zero_or_below_resolves_nothing():
    assert benchlib.ratio_of_medians_interval([1.0, 2.0, 3.0], [0.5, -0.2, 0.4]) == (None, None)
    assert benchlib.ratio_of_medians_interval([1.0], [0.0]) == (None, None)


def test_the_median_interval_holds_the_median_of_a_constant_and_widens_with_spread():
    assert benchlib.median_interval([3.0] * 5, draws=200) == (3.0, 3.0)
    lo, hi = benchlib.median_interval([1.0, 2.0, 3.0, 4.0, 5.0], draws=400)
    assert 1.0 <= lo < 3.0 < hi <= 5.0
