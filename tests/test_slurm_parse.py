"""Parsing of Slurm's JSON (unit level; the real thing is exercised in test_slurm_e2e)."""

import json

import pytest

from pipeswift_slurm import slurm
from pipeswift_slurm.errors import SlurmError

V0038 = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "jobs": [{
    "job_id": 12, "name": "tiny", "job_state": "RUNNING", "state_reason": "None", "partition": "low",
    "nodes": "node[1-2]", "node_count": 2, "restart_cnt": 1, "submit_time": 10, "start_time": 12,
    "end_time": 1000, "time_limit": 15}]}
V0040 = {"jobs": [{"job_id": 13, "name": "t", "job_state": ["PENDING"], "state_reason": "Resources",
                   "partition": "high", "nodes": "", "node_count": {"set": True, "infinite": False, "number": 4},
                   "restart_cnt": 0, "submit_time": {"set": True, "infinite": False, "number": 5},
                   "start_time": {"set": False, "infinite": False, "number": 0},
                   "end_time": {"set": False, "number": 0},
                   "time_limit": {"set": True, "infinite": True, "number": 0}}]}


def test_parse_v0038():
    (j,) = slurm.parse_squeue_json(json.dumps(V0038))
    assert (j.job_id, j.state, j.node_count, j.restarts, j.time_limit_min) == ("12", "RUNNING", 2, 1, 15)
    assert not j.terminal


def test_parse_newer_layout():
    (j,) = slurm.parse_squeue_json(json.dumps(V0040))
    assert (j.state, j.node_count, j.submit_time, j.start_time, j.time_limit_min) == ("PENDING", 4, 5, None, None)


def test_run_reports_command_exit_code_and_stderr():
    with pytest.raises(SlurmError, match=r"`sh -c 'echo oops >&2; exit 3'` failed \(exit 3\): oops"):
        slurm._run(["sh", "-c", "echo oops >&2; exit 3"])


def test_missing_command():
    with pytest.raises(SlurmError, match="command not found"):
        slurm._run(["no-such-slurm-binary-xyz"])
