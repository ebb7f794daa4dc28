"""Layouts per node count, with the invariants checked where they are built."""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, copy_example
from pipeswift_slurm.config import load_config
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.plan import PLAN_VERSION, read_plan, write_plan
from pipeswift_slurm.planning.build import build_plan


def cfg_with(tmp_path, **replace):
    return load_config(copy_example(tmp_path / "ex", {k: str(v) for k, v in replace.items()}))


def test_node_range_gives_a_layout_per_count(tmp_path):
    cfg = cfg_with(tmp_path, nodes="[1, 4]")
    plan = build_plan(cfg, tmp_path / "run")
    assert sorted(plan["layouts"], key=int) == ["1", "2", "3", "4"]
    assert [plan["layouts"][k]["stages"] for k in "1234"] == [1, 2, 3, 4]
    # 32 / (8 x dp=1) = 4 micro-batches whatever the stage count
    assert {lay["micro_batches"] for lay in plan["layouts"].values()} == {4}


def test_fixed_stages_with_range_uses_data_parallel(tmp_path):
    p = copy_example(tmp_path / "ex", {"nodes": "[2, 4]", "stages": "2"})
    p.write_text("\n".join(x for x in p.read_text().splitlines() if not x.startswith("data_parallel")))
    cfg = load_config(p)
    plan = build_plan(cfg, tmp_path / "run")
    assert plan["layouts"]["4"]["data_parallel"] == 2 and plan["layouts"]["4"]["micro_batches"] == 2
    assert "3" in plan["infeasible"] and "pp x dp" in plan["infeasible"]["3"]


def test_cost_hints_give_balanced_boundaries(tmp_path):
    p = copy_example(tmp_path / "ex")
    p.write_text(p.read_text().replace(p.read_text().split("layer_costs = ")[1].split("\n")[0],
                                       "[4.0, 1.0, 1.0, 1.0, 1.0, 4.0]"))
    plan = build_plan(load_config(p), tmp_path / "run")
    lay = plan["layouts"]["2"]
    assert lay["partition"] == "cost" and lay["boundaries"] == [0, 3, 6]


def test_explicit_boundaries(tmp_path):
    cfg = load_config(copy_example(tmp_path / "ex", {"pipeline.partition": "[0, 2, 6]"}))
    lay = build_plan(cfg, tmp_path / "run")["layouts"]["2"]
    assert lay["boundaries"] == [0, 2, 6] and lay["partition"] == "explicit"


def test_fixed_data_parallel_says_which_stage_count(tmp_path):
    with pytest.raises(ConfigError, match="with data_parallel = 1 use stages = 2"):
        build_plan(cfg_with(tmp_path, stages="4"), tmp_path / "run")


def test_no_feasible_count_is_a_config_error(tmp_path):
    cfg = cfg_with(tmp_path, nodes="[3, 3]", stages="2")
    with pytest.raises(ConfigError, match=r"stages 2 x data_parallel 1 = 2, but the job has 3 node"):
        build_plan(cfg, tmp_path / "run")


def test_plan_roundtrip_and_version(tmp_path):
    plan = build_plan(cfg_with(tmp_path), tmp_path / "run")
    write_plan(plan, tmp_path / "plan.json")
    assert read_plan(tmp_path / "plan.json") == plan
    plan["version"] = PLAN_VERSION + 1
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    with pytest.raises(ConfigError, match="re-plan"):
        read_plan(tmp_path / "bad.json")


def test_plan_json_has_one_reader_and_it_checks_the_version(tmp_path):
    from pipeswift_slurm.history import rows as runrows
    from pipeswift_slurm.plan import parse_plan
    good = json.dumps({"version": PLAN_VERSION, "job_name": "x"}).encode()
    assert parse_plan(good)["job_name"] == "x" and runrows.parse_plan(good)["job_name"] == "x"
    for bad, why in ((b'{"version": 99}', "plan version 99"), (b"[1]", "not a JSON object"),
                     (b"\xff", "not a valid plan.json"), (b"[" * 100000, "not a valid plan.json")):
        with pytest.raises(ConfigError, match=why):
            parse_plan(bad)
        assert runrows.parse_plan(bad) is None   # the history skips it, never raises


def test_the_launcher_refuses_a_plan_lacking_what_a_job_needs_in_one_line(tmp_path):
    import subprocess
    import sys
    plan = build_plan(cfg_with(tmp_path), tmp_path / "run")
    del plan["training"]["steps"]
    write_plan(plan, tmp_path / "plan.json")
    proc = subprocess.run([sys.executable, "-m", "pipeswift_launch", str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "training.steps is missing or not an integer; re-plan with `pswift sbatch`" in proc.stderr


def test_plan_json_at_the_config_caps_fits_what_the_history_reads(tmp_path):
    """The largest config the caps allow (bench/plan_worst_case.py's: 512 layers, nodes [17, 32]
    x 16 tasks, micro_batch_size "auto") gives a plan.json under the 4 MiB the jobcomp plugin and the ingest read; with
    indent=2 it was 4.6 MB, and the plugin refused it."""
    import importlib.util
    import re
    import sys
    from pipeswift_slurm.submit import prepare
    from pipeswift_slurm.userfiles import LIMITS
    spec = importlib.util.spec_from_file_location("plan_worst_case", ROOT / "bench" / "plan_worst_case.py")
    bench = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    spec.loader.exec_module(bench)
    toml = bench.worst_case(tmp_path / "ex")
    toml.write_text(re.sub(r"(?m)^micro_batch_size = .*$", 'micro_batch_size = "auto"', toml.read_text()))
    prepared = prepare(toml, tmp_path / "run", db=tmp_path / "h.db", live=False)
    write_plan(prepared.plan, tmp_path / "plan.json")
    size = (tmp_path / "plan.json").stat().st_size
    assert size < LIMITS["plan.json"], size
    assert read_plan(tmp_path / "plan.json")["version"] == PLAN_VERSION
