"""Saved generators (a checkpoint's rng.json, the user's file) that are not a generator state
raise ValueError in rng.restore, whatever they hold, so the launcher seeds from (seed, step,
rank) with one line instead of crashing (the resume itself is in test_checkpoint_local.py)."""

from __future__ import annotations

import pytest

rng = pytest.importorskip("pipeswift_launch.rng")


def good() -> dict:
    return rng.capture()


@pytest.mark.parametrize("edit", [
    lambda s: s["numpy"].__setitem__(1, [2**70] * 624),          # overflows uint32
    lambda s: s["python"].__setitem__(1, [2**80] * 625),         # overflows Python's setter
    lambda s: s["numpy"].__setitem__(2, 10**30),
    lambda s: s.__setitem__("torch", "!!not base64!!"),
    lambda s: s.__setitem__("torch", "AAAA"),
    lambda s: s.__setitem__("python", [3, [], None]),
    lambda s: s.pop("numpy"),
    lambda s: s.__setitem__("numpy", None),
])
def test_out_of_range_or_malformed_generators_raise_value_error(edit):
    state = good()
    edit(state)
    with pytest.raises(ValueError, match="not a generator state"):
        rng.restore(state)


def test_a_captured_state_restores_the_same_draws():
    import random
    state = good()
    first = random.random()
    rng.restore(state)
    assert random.random() == first
