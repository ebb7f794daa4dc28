"""Derive torch.distributed's environment from Slurm's (no torch import here: unit-testable).

Under srun every task has SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; virtual nodes on one host
(slurmd -N) have names that do not resolve, so MASTER_ADDR comes from SLURM_LAUNCH_NODE_IPADDR
(the address of the node that runs the batch script, which is the first node and holds rank 0).
A run of members (pipeswift_launch.members) offsets a member's ranks into its epoch's world:
rank 0's member publishes the store's address in the epoch's folder, the others read it there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


def log0(rank: int, msg: str) -> None:
    """A line of the job's log, said once: by rank 0."""
    if rank == 0:
        print(f"pswift: {msg}", flush=True)


class LaunchEnvError(RuntimeError):
    pass


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    nodes: int
    attempt: int
    job_id: str | None
    #: what Slurm's commands that act on this job take (:func:`job_ref`)
    job_ref: str | None = None

    def exports(self) -> dict[str, str]:
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(self.local_rank), "MASTER_ADDR": self.master_addr,
                **({"MASTER_PORT": str(self.master_port)} if self.master_port else {})}


def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for n in names:
        v = env.get(n)
        if v not in (None, ""):
            try:
                return int(str(v).split("(")[0])
            except ValueError:
                raise LaunchEnvError(f"${n} = {v!r} is not an integer") from None
    if default is None:
        raise LaunchEnvError(f"none of ${', $'.join(names)} is set: run under srun or `pswift run`")
    return default


def job_ref(env: Mapping[str, str]) -> str | None:
    """This job as Slurm's commands that act on it take it (requeue, update): a task of a job
    array (a member of a run) as ``ARRAY_TASK``, since its own id may equal the array's, which
    those commands take for every task of the array; else its id."""
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else env.get("SLURM_JOB_ID")


def derive(env: Mapping[str, str]) -> DistEnv:
    attempt = _int(env, "SLURM_RESTART_COUNT", "PSWIFT_ATTEMPT", default=0)
    job_id = env.get("SLURM_JOB_ID")
    if "SLURM_PROCID" in env and "RANK" not in env:
        rank = _int(env, "SLURM_PROCID")
        world = _int(env, "SLURM_NTASKS", "SLURM_NPROCS")
        local = _int(env, "SLURM_LOCALID", default=0)
        nodes = _int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1)
        addr = env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
        port = _int(env, "MASTER_PORT", default=0)   # 0: rank 0 chooses it (rendezvous.py)
    else:
        rank = _int(env, "RANK")
        world = _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK", default=rank)
        nodes = _int(env, "PSWIFT_NODES", default=1)
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        port = _int(env, "MASTER_PORT", default=0)
    if env.get("PSWIFT_RANK_OFFSET"):   # a run of members: this member's ranks in the epoch (members.py)
        rank += _int(env, "PSWIFT_RANK_OFFSET")
        world = _int(env, "PSWIFT_WORLD_SIZE")
        nodes = _int(env, "PSWIFT_RUN_NODES")
    if not 0 <= rank < world:
        raise LaunchEnvError(f"rank {rank} is outside world size {world}")
    if not port and not env.get("PSWIFT_LAUNCH_DIR"):
        raise LaunchEnvError("no $PSWIFT_LAUNCH_DIR (the batch script and `pswift run` set one a launch, where "
                             "rank 0 publishes the rendezvous) and no $MASTER_PORT: set one of them")
    return DistEnv(rank=rank, world_size=world, local_rank=local, master_addr=addr,
                   master_port=port, nodes=nodes, attempt=attempt, job_id=job_id, job_ref=job_ref(env))
