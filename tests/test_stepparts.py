"""Where a step's time goes (pipeswift_launch.stepparts): the laps bench/overhead.py weighs
against a bare DeepSpeed loop. Through real DeepSpeed: test_metrics.py's validation run."""

from __future__ import annotations

import pytest

from pipeswift_slurm import events


def clock(*ticks):
    it = iter(ticks)
    return lambda: next(it)


def test_laps_count_only_counted_steps_and_carve_the_metrics_out_of_the_events():
    from pipeswift_launch.stepparts import PARTS, StepParts
    # ticks: construction, then per step begin + a lap per call below
    p = StepParts(clock(0.0, 1.0, 1.5, 3.5, 4.0, 10.0, 10.1, 12.1, 12.6))
    p.begin(counting=False)                        # 1.0: a profiled step, not counted
    p.lap("data")                                  # 1.5
    p.lap("events", carved_total=0.3)              # 3.5: the sinks took 0.3 s of it (before counting)
    p.begin(counting=True)                         # 4.0
    p.lap("data")                                  # 10.0: 6 s
    p.lap("train_batch")                           # 10.1: 0.1 s
    p.lap("events", carved_total=0.3 + 1.5)        # 12.1: 2 s, of which the sinks 1.5 s
    p.lap("flags")                                 # 12.6: 0.5 s
    got = p.per_step()
    assert p.steps == 1 and set(got) == set(PARTS)
    assert got["data"] == 6.0 and got["train_batch"] == pytest.approx(0.1)
    assert got["events"] == pytest.approx(0.5) and got["metrics"] == pytest.approx(1.5)
    assert got["flags"] == pytest.approx(0.5) and got["eval"] == 0.0


def test_no_counted_step_writes_no_parts():
    from pipeswift_launch.stepparts import StepParts
    p = StepParts(clock(0.0, 1.0, 2.0))
    p.begin(counting=False)
    p.lap("data")
    assert p.per_step() == {} and p.steps == 0


def test_the_step_parts_event_is_in_the_schema_and_bounded():
    ok = {"event": "step_parts", "steps": 3, "seconds": {"train_batch": 0.05, "flags": 0.0002}}
    assert events.validate(ok)["seconds"] == ok["seconds"]
    assert events.validate({**ok, "seconds": {f"p{i}": 0.1 for i in range(17)}}) is None
    assert events.validate({**ok, "seconds": {"x" * 33: 0.1}}) is None
    assert events.validate({**ok, "seconds": {"flags": float("nan")}}) is None
    assert events.unknown_fields("step_parts", {"steps": 1, "seconds": {}}) == []
