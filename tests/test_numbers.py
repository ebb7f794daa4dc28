"""Any number, however large, in a config, an events line or a time filter gives a result or
one clear error, never a traceback (a 400-digit TOML number overflowed float() in `pswift plan`;
`-S now-<400 digits>days` and huge event values overflowed too). numbers.finite is the one
check they share."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeswift_slurm import events
from pipeswift_slurm.config import parse_config
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.numeric import finite
from pipeswift_slurm.history.selection import SelectionError, parse_time

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = tomllib.loads((ROOT / "examples" / "tiny-gpt" / "train.toml").read_text())
NUMBERS = st.one_of(st.integers(min_value=-10**450, max_value=10**450),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans())


@given(NUMBERS)
def test_finite_is_a_finite_float_or_none(v):
    f = finite(v)
    assert f is None or (isinstance(f, float) and math.isfinite(f))
    if isinstance(v, bool) or (isinstance(v, int) and abs(v) > 2**1024):
        assert f is None


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([("training", "gradient_clipping"), ("training", "lr_min_ratio"),
                        ("training", "hang_timeout_factor"), ("training", "hang_timeout_min_s"),
                        ("model", "layer_costs")]), NUMBERS)
def test_any_number_in_a_config_is_taken_or_refused_in_one_line(place, v):
    section, key = place
    data = {s: dict(t) if isinstance(t, dict) else t for s, t in EXAMPLE.items()}
    data[section][key] = [v] * 6 if key == "layer_costs" else v
    try:
        parse_config(data, ROOT / "examples" / "tiny-gpt" / "train.toml")
    except ConfigError as e:
        assert "\n" not in str(e) and key in str(e) and len(str(e)) < 400


@settings(max_examples=200, deadline=None)
@given(NUMBERS, NUMBERS)
def test_any_number_in_an_event_is_kept_or_the_line_skipped(a, b):
    got = events.validate({"event": "step", "time": a, "step": 3, "loss": b, "step_time": a})
    if got is not None:
        assert all(math.isfinite(got[k]) and abs(got[k]) <= events.MAX_NUMBER for k in ("time", "loss", "step_time"))


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**450), st.sampled_from(["", "days", "hours", "weeks", "d", "h"]),
       st.sampled_from(["now-", "now+", ""]))
def test_any_number_in_a_time_filter_is_a_time_or_one_line(n, unit, form):
    text = f"{form}{n}{unit}"
    try:
        t = parse_time(text, now=1.8e9)
    except SelectionError as e:
        assert "\n" not in str(e)
        return
    assert math.isfinite(t)


@pytest.mark.parametrize("v", [10**400, -10**400])
def test_a_400_digit_number_in_a_config_names_its_key(v):
    data = {s: dict(t) for s, t in EXAMPLE.items()}
    data["training"]["gradient_clipping"] = v
    with pytest.raises(ConfigError, match=r"gradient_clipping must be a finite number, got an integer of 40\d digits"):
        parse_config(data, ROOT / "examples" / "tiny-gpt" / "train.toml")
