"""The one quantile helper agrees with the standard library's inclusive quantiles."""

import statistics

from hypothesis import given, strategies as st

from pipeswift_slurm.stats import median, quantile

values = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=60)


@given(values, st.integers(1, 99))
def test_percentiles_match_statistics_inclusive(xs, k):
    want = statistics.quantiles(xs, n=100, method="inclusive")[k - 1]
    assert abs(quantile(xs, k / 100) - want) <= 1e-6 * max(1.0, abs(want))


@given(values)
def test_median_matches_statistics(xs):
    assert abs(median(xs) - statistics.median(xs)) <= 1e-6 * max(1.0, abs(statistics.median(xs)))


def test_none_and_empty():
    assert quantile([], 0.5) is None and median([None, None]) is None
    assert quantile([None, 3.0], 0.95) == 3.0 and quantile([1.0, 2.0], 1.0) == 2.0
