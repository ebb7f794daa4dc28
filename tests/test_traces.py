"""Public cluster traces as a workload (issue 58): bench/traces.py reads any SWF log and the
Alibaba GPU trace, and maps a seeded window of one to the jobs a benchmark submits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import traces  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
NASA, ALIBABA = SHARED / "nasa-ipsc-1993.swf.gz", SHARED / "alibaba-gpu-2023-pods.csv"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared/traces/ beside the checkout)")
    return path


def test_the_nasa_log_reads_as_its_header_says():
    jobs, machine = traces.read_trace(need(NASA))
    import gzip
    lines = [line.split() for line in gzip.open(NASA, "rt") if not line.startswith(";")]
    ran = [f for f in lines if float(f[3]) > 0 and float(f[4]) > 0]
    assert machine == 128 and len(lines) == 18239 and len(jobs) == len(ran) > 18000   # MaxProcs; jobs that ran
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    assert {j.size for j in jobs} == {1, 2, 4, 8, 16, 32, 64, 128}
    assert all(j.limit_s is None for j in jobs)                # the log has no requested times
    assert sum(j.high for j in jobs) > 0 and {j.user for j in jobs if j.high}   # group 2: system personnel


def test_the_alibaba_trace_keeps_the_tasks_that_ended():
    jobs, machine = traces.read_trace(need(ALIBABA))
    rows = list(__import__("csv").DictReader(open(ALIBABA)))
    ended = [r for r in rows if r["pod_phase"] in ("Succeeded", "Failed")
             and float(r["deletion_time"]) > float(r["scheduled_time"])]
    assert machine == 8 and len(jobs) == len(ended) > 1000
    assert {j.user for j in jobs} <= {"qos-LS", "qos-BE", "qos-Burstable", "qos-Guaranteed"}
    assert all(j.high == (j.user == "qos-LS") for j in jobs) and all(j.run_s > 0 and j.size >= 1 for j in jobs)


@pytest.mark.parametrize("line, what", [("1 2 3", "3 fields, not 18"), ("x " * 18, "not a number"),
                                        ("nan " + "1 " * 17, "not a finite number")])
def test_a_bad_swf_line_is_named(line, what):
    with pytest.raises(traces.TraceError, match=f"SWF line 2: .*{what}"):
        list(traces.read_swf(["; header", line]))


def swf_line(job: int, submit: int, run: int, procs: int, user: int, limit: int = -1) -> str:
    f = [-1] * 18
    f[0], f[1], f[3], f[4], f[8], f[11], f[12] = job, submit, run, procs, limit, user, 1
    return " ".join(map(str, f))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**5), st.integers(1, 10**4), st.sampled_from([1, 2, 4, 8, 16, 32]),
                          st.integers(1, 5), st.one_of(st.just(-1), st.integers(1, 10**5))), min_size=1, max_size=60),
       st.integers(1, 64), st.floats(60, 2e5), st.integers(0, 10**6), st.floats(0.5, 50))
def test_a_window_maps_every_job_inside_the_cluster_and_its_rules(rows, nodes, window, seed, compression):
    lines = [swf_line(i + 1, s, r, p, u, lim) for i, (s, r, p, u, lim) in enumerate(rows)]
    jobs = sorted(traces.read_swf(lines), key=lambda j: (j.submit_s, j.job))
    out = traces.workload(jobs, 32, nodes, window, seed, compression)
    assert out == traces.workload(jobs, 32, nodes, window, seed, compression)      # seeded: the same window
    assert out and out[0].arrival_s == 0 and [j.arrival_s for j in out] == sorted(j.arrival_s for j in out)
    assert all(j.arrival_s < window / compression for j in out)
    for j in out:
        assert 1 <= j.nodes_lo <= j.nodes_asked <= j.nodes_hi <= nodes
        assert j.training == (j.nodes_asked >= 2) and (j.training or j.nodes_lo == j.nodes_hi)
        assert j.limit_s >= j.run_s > 0


def test_the_command_prints_the_window_and_refuses_a_bad_trace_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "traces.py"), str(need(NASA)), "--nodes", "64",
                           "--window", "21600", "--seed", "3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    *jobs, total = [json.loads(line) for line in proc.stdout.splitlines()]
    assert total["jobs"] == len(jobs) > 0 and total["training"] == sum(j["training"] for j in jobs)
    assert all(j["nodes_hi"] <= 64 for j in jobs) and total["machine"] == 128
    bad = tmp_path / "bad.swf"
    bad.write_text("; Version: 2.2\n1 2 3\n")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "traces.py"), str(bad)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "SWF line 2" in proc.stderr


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**4), st.integers(1, 10**4), st.sampled_from([1, 2, 4, 8, 16, 32, 64])),
                min_size=1, max_size=40), st.integers(1, 8), st.sampled_from([4, 16, 32]))
def test_on_a_small_cluster_the_trace_size_decides_who_trains(rows, nodes, min_size):
    """4 nodes for a 128-processor log: scaling leaves almost every job on one node, so a job of
    ``train_min_size`` processors or more trains, with a range above the one node it scaled to."""
    lines = [swf_line(i + 1, s, r, p, 1) for i, (s, r, p) in enumerate(rows)]
    jobs = sorted(traces.read_swf(lines), key=lambda j: (j.submit_s, j.job))
    size = {j.job: j.size for j in jobs}
    for j in traces.workload(jobs, 128, nodes, 2e4, 0, train_min_size=min_size):
        assert j.training == (size[j.job] >= min_size)
        assert 1 <= j.nodes_lo <= j.nodes_asked <= j.nodes_hi <= nodes
        if j.training and nodes >= 2:
            assert j.nodes_hi > j.nodes_asked or j.nodes_asked == nodes


def _job(at: float, run: float, nodes: int, high: bool = False, training: bool = False) -> traces.WorkloadJob:
    return traces.WorkloadJob(job=f"j{at}", arrival_s=at, run_s=run, nodes_lo=nodes, nodes_hi=nodes, nodes_asked=nodes,
                              limit_s=run * 2, user="u", high=high, training=training)


def test_a_high_arrival_is_contended_only_when_the_cluster_is_full_with_a_training_job_on_it():
    train, plain = _job(0, 100, 2, training=True), _job(0, 100, 1)
    assert traces.contended([train, plain, _job(10, 5, 2, high=True)], nodes=4) == 1      # 3 busy + 2 > 4
    assert traces.contended([train, plain, _job(10, 5, 1, high=True)], nodes=4) == 0      # it fits beside them
    assert traces.contended([train, plain, _job(150, 5, 4, high=True)], nodes=4) == 0     # they ended
    assert traces.contended([_job(0, 100, 4), _job(10, 5, 1, high=True)], nodes=4) == 0   # no training job to take
    assert traces.contended([train, _job(10, 5, 3, high=True), _job(20, 5, 3, high=True)], nodes=4) == 2
