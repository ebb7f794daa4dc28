"""Time limits from predictions ([job] time_policy): the pure rules (pipeswift_slurm.planning.limits),
the plan and batch script they give, and `pswift plan`'s line. Through real Slurm:
tests/test_preemption.py (a limit reached, the requeue asking for what remains) and
tests/test_slurm_e2e.py (Slurm shows the predicted limit and TimeMin)."""

from __future__ import annotations

import json
import math

from hypothesis import given, strategies as st

from helpers import copy_example, pswift
from pipeswift_slurm import submit
from pipeswift_slurm.planning import limits


def test_a_three_minute_prediction_asks_minutes_not_the_hour_written():
    lim = limits.predicted(3600, held_p90_s=150.0, setup_s=30.0, lead_s=70)
    assert lim.time_s == limits.whole_minutes(150 * limits.MARGIN + 70) == 300   # 257.5 s -> 5 min
    assert lim.time_min_s == 240          # setup 30 + 4 setups of training 120 + lead 70 = 220 -> 4 min
    assert lim.signal_lead_s == 70
    assert "capped" not in lim.why and "within [job] time 60.0 min" in lim.why


def test_the_written_time_caps_a_longer_prediction_and_as_written_copies_it():
    lim = limits.predicted(600, held_p90_s=3000.0, setup_s=30.0, lead_s=70)
    assert lim.time_s == 600 and "capped by [job] time 10.0 min" in lim.why
    assert limits.as_written(600, 70) == limits.Limits(600, None, 70, "[job] time as written (10.0 min)")
    assert limits.as_written(None, 70).time_s is None and limits.as_written(None, 70).signal_lead_s is None


def test_two_checkpoint_intervals_set_the_least_worthwhile_attempt():
    lim = limits.predicted(None, held_p90_s=7200.0, setup_s=60.0, lead_s=100, checkpoint_every_s=600.0)
    assert lim.time_min_s == limits.whole_minutes(60 + 1200 + 100) == 1380
    assert lim.time_s == limits.whole_minutes(7200 * 1.25 + 100)


@given(st.one_of(st.none(), st.integers(60, 86400)), st.floats(1.0, 1e5), st.floats(0.0, 600.0),
       st.integers(10, 900), st.one_of(st.just(math.inf), st.floats(10.0, 1e4)))
def test_every_limit_is_whole_minutes_holds_its_signal_and_respects_the_toml(user, held, setup, lead, every):
    lim = limits.predicted(user, held, setup, lead, every)
    assert lim.time_s % 60 == 0 or lim.time_s == user
    assert user is None or lim.time_s <= user
    shortest = lim.time_min_s or lim.time_s
    assert lim.time_min_s is None or (lim.time_min_s % 60 == 0 and lim.time_min_s < lim.time_s)
    assert 10 <= lim.signal_lead_s <= max(10, shortest // 2)       # USR2 falls in the attempt's second half


def test_the_remaining_prediction_covers_the_steps_left_and_the_signals_slack():
    got = limits.remaining(steps_left=40, step_wall_s=2.0, setup_s=25.0, checkpoint_s=10.0, lead_s=71, user_s=None)
    assert got == limits.whole_minutes(25 + 40 * 2.0 * 1.25 + 10 + 71 + 60) == 300
    assert limits.remaining(1, 0.01, 1.0, 1.0, 71, None) == limits.whole_minutes(142)   # twice the lead
    assert limits.remaining(10_000, 2.0, 25.0, 10.0, 71, user_s=3600) == 3600


def _example(tmp_path, policy: str = "predicted"):
    return copy_example(tmp_path / "ex", {"time": '"1:00:00"', "steps": "2000", "time_policy": f'"{policy}"'})


def test_the_plan_and_the_batch_script_carry_the_predicted_limits(tmp_path):
    p = submit.prepare(_example(tmp_path), tmp_path / "run", live=False, learn=False)
    plan = p.plan
    assert plan["time_policy"] == "predicted" and plan["time_written_s"] == 3600
    assert 60 <= plan["time_limit_s"] < 3600 and plan["time_min_s"] < plan["time_limit_s"]
    assert f"#SBATCH --time={plan['time_limit_s'] // 60}\n" in p.script
    assert f"#SBATCH --time-min={plan['time_min_s'] // 60}\n" in p.script
    assert f"#SBATCH --signal=USR2@{plan['signal_lead_s']}\n" in p.script
    written = submit.prepare(_example(tmp_path / "w", "as_written"), tmp_path / "run2",
                             live=False, learn=False)
    assert written.plan["time_limit_s"] == 3600 and written.plan["time_min_s"] is None
    assert "#SBATCH --time=1:00:00\n" in written.script and "--time-min" not in written.script


def test_pswift_plan_prints_the_limits_and_why(tmp_path):
    toml = _example(tmp_path)
    text = pswift("plan", "--no-live", str(toml), check=True).stdout
    line = next(x for x in text.splitlines() if x.startswith("time limit: "))
    assert "--time-min=" in line and "predicted: p90" in line and "within [job] time 60.0 min" in line
    got = json.loads(pswift("plan", "--no-live", "--json", str(toml), check=True).stdout)["time_limits"]
    assert got["time_s"] < 3600 and got["time_min_s"] and got["why"].startswith("predicted")
