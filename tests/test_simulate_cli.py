"""`pswift simulate` end to end: JSON, table, terminal timeline, PNG, errors."""

from __future__ import annotations

import json

import pytest

from helpers import EXAMPLE, copy_example, pswift


def test_json_from_explicit_stage_times():
    proc = pswift("simulate", "--fwd", "1,1,1,1", "--bwd", "2,2,2,2", "-m", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["step_time"] == pytest.approx(33.0) and d["bubble_ratio"] == pytest.approx(3 / 11)
    assert [s["busy"] for s in d["per_stage"]] == [24.0] * 4
    assert [s["idle"] for s in d["per_stage"]] == [9.0] * 4


def test_several_schedules_table_timeline_and_png(tmp_path):
    png = tmp_path / "t.png"
    proc = pswift("simulate", str(EXAMPLE / "train.toml"), "--schedule", "gpipe,1f1b,interleaved",
                  "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "tiny-gpt: 2 stages [0, 3, 6]" in out
    for name in ("gpipe", "1f1b", "interleaved v=2"):
        assert name in out
    assert out.count("stage 0 |") == 3 and out.count("stage 1 |") == 3
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_several_schedules_json_is_a_list():
    proc = pswift("simulate", "--fwd", "1,2", "--bwd", "2,4", "-m", "4", "--schedule", "1f1b,zb-h1", "--json")
    d = json.loads(proc.stdout)
    assert [x["schedule"] for x in d] == ["1f1b", "zb-h1"] and d[1]["step_time"] < d[0]["step_time"]


@pytest.mark.parametrize("args,needle", [
    (["--fwd", "1,x", "--bwd", "1,1", "-m", "2"], "comma-separated seconds"),
    (["--fwd", "1,1", "--bwd", "1", "-m", "2"], "2 forward times but 1 backward"),
    (["--fwd", "1,1", "--bwd", "1,1"], "--micro-batches is required"),
    (["--fwd", "1,1", "--bwd", "1,1", "-m", "2", "--schedule", "magic"], "one of gpipe"),
    ([], "give a train.toml, or --fwd and --bwd"),
    (["--fwd", "1,1", "--bwd", "1,1", "-m", "100000000"], "simulate fewer micro-batches"),  # not hours
    # issue 57: a traceback, a value ignored silently, an unbounded print, repeats
    (["--fwd", "nan,1", "--bwd", "1,1", "-m", "4"], "finite numbers of seconds"),
    (["--fwd", "1,1", "--bwd", "1,1", "-m", "4", "--p2p", "nan"], "finite numbers of seconds"),
    (["--fwd", "1,1", "--bwd", "1,inf", "-m", "4"], "finite numbers of seconds"),
    (["--fwd", "1,1", "--bwd", "1,1", "--wgrad", "nan,0", "-m", "4", "--schedule", "zb-h1"], "finite numbers"),
    (["--fwd", "1,1", "--bwd", "1,1", "-m", "4", "--schedule", "1f1b,gpipe,1f1b"], "1f1b more than once"),
])
def test_bad_input_one_line_exit_2(args, needle):
    proc = pswift("simulate", *args)
    assert proc.returncode == 2 and needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_toml_without_costs_says_what_to_add(tmp_path):
    toml = copy_example(tmp_path / "ex")
    toml.write_text("\n".join(x for x in toml.read_text().splitlines() if not x.startswith("layer_costs")))
    proc = pswift("simulate", str(toml))
    assert proc.returncode == 2 and "add [model] layer_costs" in proc.stderr


def test_wgrad_is_given_apart_and_zb_h1_is_the_papers_27():
    """Qi et al. (ICLR 2024), 4 stages x 8 micro-batches, F = B = W = 1: 1F1B 33, ZB-H1 27,
    ZB-H2 24 (no bubble)."""
    proc = pswift("simulate", "--fwd", "1,1,1,1", "--bwd", "1,1,1,1", "--wgrad", "1,1,1,1", "-m", "8",
                  "--schedule", "1f1b,zb-h1,zb-h2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [(d["schedule"], d["step_time"]) for d in json.loads(proc.stdout)] == [
        ("1f1b", 33.0), ("zb-h1", 27.0), ("zb-h2", 24.0)]
    bad = pswift("simulate", "--fwd", "1,1", "--bwd", "1,1", "--wgrad", "1", "-m", "4", "--schedule", "zb-h1")
    assert bad.returncode == 2 and "--wgrad has 1 value(s) for 2 stage(s)" in bad.stderr


def test_width_is_bounded():
    """Issue 57: --width 100000000 printed for 11 s; it takes 20 to 1000 characters."""
    proc = pswift("simulate", "--fwd", "1,1", "--bwd", "1,1", "-m", "4", "--width", "100000000")
    assert proc.returncode == 2 and "20<=x<=1000" in proc.stderr and len(proc.stdout) == 0
