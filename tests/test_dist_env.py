"""RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from Slurm's environment (pure function, no torch)."""

import pytest

from pipeswift_launch.dist_env import LaunchEnvError, derive

SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_NUM_NODES": "2",
         "SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3", "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2",
         "PSWIFT_LAUNCH_DIR": "/run/launches/77.2.0"}


def test_from_slurm():
    d = derive(SLURM)
    assert (d.rank, d.world_size, d.local_rank, d.nodes, d.attempt) == (3, 4, 1, 2, 2)
    assert d.master_addr == "10.1.2.3"
    assert d.exports()["RANK"] == "3" and d.exports()["WORLD_SIZE"] == "4"


def test_no_port_comes_from_a_formula():
    """Job ids are public: a port derived from one can be held by another user in advance. Under
    Slurm the port is rank 0's choice, published in the launch folder (rendezvous.py)."""
    d = derive(SLURM)
    assert d.master_port == 0 and "MASTER_PORT" not in d.exports()
    with pytest.raises(LaunchEnvError, match=r"no \$PSWIFT_LAUNCH_DIR .* and no \$MASTER_PORT"):
        derive({k: v for k, v in SLURM.items() if k != "PSWIFT_LAUNCH_DIR"})


def test_explicit_master_wins():
    d = derive({**SLURM, "MASTER_ADDR": "node7", "MASTER_PORT": "1234"})
    assert (d.master_addr, d.master_port) == ("node7", 1234)


def test_local_run_env():
    d = derive({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "5555", "PSWIFT_NODES": "2"})
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.nodes, d.attempt) == (1, 2, 1, "127.0.0.1", 2, 0)


def test_missing_env_is_a_clear_error():
    with pytest.raises(LaunchEnvError, match=r"none of \$RANK is set"):
        derive({})
    with pytest.raises(LaunchEnvError, match="outside world size"):
        derive({"RANK": "2", "WORLD_SIZE": "2"})


def test_a_task_of_a_job_array_is_acted_on_as_array_task():
    """scontrol takes a job array's id for all its tasks, and a task's own id may be the array's:
    a member of a run is requeued or updated as ARRAY_TASK."""
    from pipeswift_launch.dist_env import job_ref
    assert job_ref({"SLURM_JOB_ID": "187", "SLURM_ARRAY_JOB_ID": "187", "SLURM_ARRAY_TASK_ID": "1"}) == "187_1"
    assert job_ref({"SLURM_JOB_ID": "42"}) == "42" and job_ref({}) is None
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "188", "SLURM_ARRAY_JOB_ID": "187",
           "SLURM_ARRAY_TASK_ID": "0", "PSWIFT_LAUNCH_DIR": "/x", "PSWIFT_RANK_OFFSET": "2",
           "PSWIFT_WORLD_SIZE": "3", "PSWIFT_RUN_NODES": "3"}
    d = derive(env)
    assert (d.rank, d.world_size, d.nodes, d.job_id, d.job_ref) == (2, 3, 3, "188", "187_0")
