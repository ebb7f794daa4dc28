"""The partitioner is exact: equal to brute force on random profiles."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeswift_slurm.planning.partition import (PartitionError, balanced_boundaries, stage_sums,
                                       uniform_boundaries)


def brute(costs, stages, memory=None, cap=None):
    n, best = len(costs), None
    for cuts in combinations(range(1, n), stages - 1):
        b = [0, *cuts, n]
        if cap is not None and max(stage_sums(memory, b)) > cap:
            continue
        v = max(stage_sums(costs, b))
        best = v if best is None else min(best, v)
    return best


profiles = st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=1, max_size=10)


@settings(max_examples=300, deadline=None)
@given(costs=profiles, data=st.data())
def test_equals_brute_force(costs, data):
    stages = data.draw(st.integers(1, len(costs)))
    b = balanced_boundaries(costs, stages)
    assert b[0] == 0 and b[-1] == len(costs) and len(b) == stages + 1
    assert all(x < y for x, y in zip(b, b[1:])), b
    assert max(stage_sums(costs, b)) == pytest.approx(brute(costs, stages), rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(costs=profiles, data=st.data())
def test_equals_brute_force_with_memory_cap(costs, data):
    n = len(costs)
    stages = data.draw(st.integers(1, n))
    memory = data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    cap = data.draw(st.integers(max(memory), max(memory) * 3 + 1))
    expected = brute(costs, stages, memory, cap)
    if expected is None:
        with pytest.raises(PartitionError, match="memory cap"):
            balanced_boundaries(costs, stages, memory, cap)
        return
    b = balanced_boundaries(costs, stages, memory, cap)
    assert max(stage_sums(memory, b)) <= cap
    assert max(stage_sums(costs, b)) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_embedding_and_head_heavy_profile():
    costs = [5.0] + [1.0] * 8 + [6.0]
    b = balanced_boundaries(costs, 4)
    assert max(stage_sums(costs, b)) == pytest.approx(6.0)


def test_errors_name_the_numbers():
    with pytest.raises(PartitionError, match="5 stages > 3 layers"):
        balanced_boundaries([1, 2, 3], 5)
    with pytest.raises(PartitionError, match="layer 1 alone needs 9 > memory cap 5"):
        balanced_boundaries([1, 1], 1, [1, 9], 5)


def test_uniform():
    assert uniform_boundaries(6, 2) == [0, 3, 6]
    assert uniform_boundaries(7, 3) == [0, 3, 5, 7]


def test_partition_cli():
    import json

    from helpers import pswift
    d = json.loads(pswift("partition", "--costs", "5,1,1,1,1,1,1,1,1,6", "--stages", "4", "--json").stdout)
    assert d["bottleneck"] == 6.0 and d["boundaries"][0] == 0 and d["boundaries"][-1] == 10
    text = pswift("partition", "--costs", "1,1,1,1", "--memory", "3,1,1,3", "--memory-cap", "4", "--stages", "2").stdout
    assert "boundaries [0, 2, 4]" in text and "memory 4" in text
    bad = pswift("partition", "--costs", "1,1", "--stages", "3")
    assert bad.returncode == 2 and "3 stages > 2 layers" in bad.stderr
    # issue 42 item 6: -P is --parsable everywhere (sacct's); the old -P N, kept one release, is gone
    old = pswift("partition", "--costs", "1,1,1,1", "-P", "2")
    assert old.returncode == 2 and old.stderr.count("\n") == 1 and "-P" in old.stderr
    none = pswift("partition", "--costs", "1,1")
    assert none.returncode == 2 and none.stderr.count("\n") == 1 and "give --stages N" in none.stderr
