"""Derive torch.distributed's environment from Slurm's (no torch import here: unit-testable).

Under srun every task has SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; virtual nodes on one host
(slurmd -N) have names that do not resolve, so MASTER_ADDR comes from SLURM_LAUNCH_NODE_IPADDR
(the address of the node that runs the batch script, which is the first node and holds rank 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


#: the rendezvous port of a Slurm attempt: from its job id, attempt and step, below Linux's ephemeral
#: range (32768 and up), where any process's outgoing connection may already hold a port
PORT_BASE, PORT_SPAN = 20000, 12000


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

    def exports(self) -> dict[str, str]:
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(self.local_rank), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}


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


def derive(env: Mapping[str, str]) -> DistEnv:
    attempt = _int(env, "SLURM_RESTART_COUNT", "PSWIFT_ATTEMPT", default=0)
    job_id = env.get("SLURM_JOB_ID")
    if "SLURM_PROCID" in env and "RANK" not in env:
        rank = _int(env, "SLURM_PROCID")
        world = _int(env, "SLURM_NTASKS", "SLURM_NPROCS")
        local = _int(env, "SLURM_LOCALID", default=0)
        nodes = _int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1)
        addr = env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
        jid = _int(env, "SLURM_JOB_ID", default=0)
        step = _int(env, "SLURM_STEP_ID", default=0)   # a re-layout launches a new step
        port = _int(env, "MASTER_PORT", default=PORT_BASE + (jid * 13 + attempt * 7 + step * 3) % PORT_SPAN)
    else:
        rank = _int(env, "RANK")
        world = _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK", default=rank)
        nodes = _int(env, "PSWIFT_NODES", default=1)
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        port = _int(env, "MASTER_PORT", default=29500)
    if not 0 <= rank < world:
        raise LaunchEnvError(f"rank {rank} is outside world size {world}")
    return DistEnv(rank=rank, world_size=world, local_rank=local, master_addr=addr,
                   master_port=port, nodes=nodes, attempt=attempt, job_id=job_id)
