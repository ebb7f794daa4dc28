"""bench/jctstats.py: the workload benchmarks' statistics (issue 58)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import jctstats  # noqa: E402


def test_bounded_slowdown_floors_short_runs_at_tau_and_never_goes_below_one():
    assert jctstats.bounded_slowdown(0, 100) == 1.0
    assert jctstats.bounded_slowdown(100, 100) == 2.0
    assert jctstats.bounded_slowdown(20, 1) == 2.1          # (20 + 1) / 10, not 21
    assert jctstats.bounded_slowdown(2, 1) == 1.0           # (2 + 1) / 10 < 1
    with pytest.raises(ValueError, match="below zero"):
        jctstats.bounded_slowdown(-1, 5)


def test_jct_summary_gives_mean_and_quantiles_and_none_for_no_jobs():
    got = jctstats.jct_summary([10.0, 20.0, 30.0, 40.0, 50.0])
    assert got == {"jct_mean_s": 30.0, "jct_p50_s": 30.0, "jct_p90_s": 46.0, "jct_p99_s": 49.6}
    assert set(jctstats.jct_summary([]).values()) == {None}
    assert jctstats.mean_bsld([(0, 100), (100, 100)]) == 1.5 and jctstats.mean_bsld([]) is None


jobs = st.dictionaries(st.tuples(st.integers(0, 3), st.integers(0, 20)), st.floats(1, 1e4), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(jobs, st.floats(0.1, 10))
def test_a_policy_k_times_slower_on_every_job_has_ratio_k_and_a_point_interval(base, k):
    got = jctstats.paired_ratio({key: k * v for key, v in base.items()}, base, draws=200)
    assert got["n"] == len(base)
    assert got["ratio"] == pytest.approx(k) and got["lo"] == pytest.approx(k) and got["hi"] == pytest.approx(k)


@settings(max_examples=60, deadline=None)
@given(jobs, jobs)
def test_the_interval_holds_the_ratio_over_the_jobs_both_completed(mine, base):
    got = jctstats.paired_ratio(mine, base, draws=300)
    both = set(mine) & set(base)
    assert got["n"] == len(both)
    if both:
        assert got["ratio"] == pytest.approx(sum(mine[k] for k in both) / sum(base[k] for k in both))
        assert got["lo"] <= got["hi"]
    else:
        assert got["ratio"] is None


def test_seeds_that_disagree_widen_the_interval_and_a_job_lost_by_one_policy_is_left_out():
    base = {(s, j): 100.0 for s in range(4) for j in range(5)}
    mine = {(s, j): (50.0 if s < 2 else 150.0) for s in range(4) for j in range(5)}
    got = jctstats.paired_ratio(mine, base)
    assert got["ratio"] == pytest.approx(1.0) and got["lo"] <= 0.75 and got["hi"] >= 1.25
    del mine[(0, 0)]
    assert jctstats.paired_ratio(mine, base)["n"] == 19
