"""Every benchmark runs in its quick mode and writes its JSON, so a benchmark that breaks fails
CI (its figures are measured by `make bench`, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {"simulator.py": "schedules", "partition.py": None, "history_scale.py": "ingest_rows_per_s",
         "plan_worst_case.py": "worst_case_median_s", "job_submit.py": "worst_ms", "ingest_cap.py": "ratio"}
TRAINING = {"checkpoint.py": "ratios", "step_time_model.py": "summary", "overhead.py": "whole_step_ratio",
            "schedules.py": "cells", "gloo_posted.py": "backward_over_idle"}
CLUSTER = {"submit_latency.py": "ratio", "slurm_backends.py": "cli_cold_median_ms", "dynamic.py": "ratios",
           "goodput.py": "goodput", "workload.py": "summary", "members.py": "ratio"}
HELPERS = {"benchlib.py", "readme.py", "traces.py", "jctstats.py",   # libraries (tests/test_traces.py,
           "workload_outcome.py"}                                  # tests/test_jctstats.py, tests/test_workload_outcome.py)


def bench(name: str, key: str | None, tmp_path: Path) -> dict:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / name), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert key is None or key in res, sorted(res)
    return res


def test_every_bench_script_is_covered():
    assert {p.name for p in (ROOT / "bench").glob("*.py")} == {*LOCAL, *TRAINING, *CLUSTER, *HELPERS}


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_local_benchmarks_run(name, tmp_path):
    bench(name, LOCAL[name], tmp_path)


@pytest.mark.deepspeed
# checkpoint.py's quick run (2 minutes in CI) in the 25.11 stream: it needs no Slurm, and that stream is the shortest
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.newest_only] if n == "checkpoint.py" else [])
                                  for n in sorted(TRAINING)])
def test_training_benchmarks_run(name, tmp_path):
    bench(name, TRAINING[name], tmp_path)


@pytest.mark.slurm
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.newest_only] if n in ("dynamic.py", "goodput.py", "workload.py", "members.py")
                                                 else [pytest.mark.every_version])
                                  for n in sorted(CLUSTER)])
def test_cluster_benchmarks_run(name, cluster, tmp_path):
    res = bench(name, CLUSTER[name], tmp_path)
    if name == "workload.py":   # the quick policies, every job done, P paired with the others
        assert set(res["summary"]) == {"H", "S", "P", "M"} and set(res["paired"]) == {"P/H", "P/S", "M/P"}, \
            res["summary"]
        (train,) = [j for j in res["runs"]["M"][0]["jobs"] if j["kind"] == "train"]   # an array of members
        assert train["tasks"] == train["nodes"][1] and train["state"] == "COMPLETED", train
        assert all(s["lost"] == 0 for s in res["summary"].values()), res["summary"]
    if name == "members.py":    # a member left and the other trained on alone; the restart kept its layout
        assert [r["layouts"] for r in res["runs"]["members"]] == [[[2, 2], [1, 1]]], res["runs"]
        assert [r["layouts"] for r in res["runs"]["restart"]] == [[[2, 2], [2, 2]]], res["runs"]
    if name == "goodput.py":    # the busy queue: the other user's jobs ran beside every configuration
        assert res["queue"] == "busy" and all(r["other_jobs"] >= 2 for v in res["runs"].values() for r in v), res["runs"]
        assert res["runs"]["baseline"][0]["attempts"] == 2 and res["runs"]["pswift"][0]["restarts"] == 1, res["runs"]
        assert set(res["ratios"]) == {"goodput pswift/baseline", "jct pswift/baseline"}, res["ratios"]
