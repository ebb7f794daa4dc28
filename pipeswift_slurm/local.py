"""`pswift run`: the same job on this machine, one local process per slot, without Slurm."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeswift_slurm.plan import Plan


def run_local(plan: Plan, plan_path: str, nodes: int, grace_s: float = 60.0) -> int:
    """Start ``world_size`` ranks of ``python -m pipeswift_launch``; forward TERM/INT/USR2 to them.

    If one rank fails the others are stopped (else they would wait in a collective until the
    gloo timeout). When every rank asks for a re-layout (RELAYOUT_EXIT) the ranks start again,
    as the batch script does, at most MAX_RELAYOUTS times. Returns 0 iff every rank exited 0.
    """
    from pipeswift_slurm.plan import MAX_RELAYOUTS, RELAYOUT_EXIT
    for _ in range(MAX_RELAYOUTS):
        codes = _launch_once(plan, plan_path, nodes, grace_s, RELAYOUT_EXIT)
        if not all(c == RELAYOUT_EXIT for c in codes):
            break
        print("pswift: re-layout: launching the ranks again", flush=True)
    else:
        codes = _launch_once(plan, plan_path, nodes, grace_s, RELAYOUT_EXIT)
    return 0 if all(c == 0 for c in codes) else max(c if c > 0 else 1 for c in codes if c != 0)


def _launch_once(plan: Plan, plan_path: str, nodes: int, grace_s: float, relayout_exit: int) -> list[int]:
    """One launch of every rank; their exit codes."""
    layout = plan["layouts"][str(nodes)]
    world = int(layout["world_size"])
    # the launch's own folder, where rank 0 publishes the rendezvous (pipeswift_launch.rendezvous)
    folder = tempfile.mkdtemp(prefix=f"local.{os.getpid()}.", dir=_launches(plan))
    procs: list[subprocess.Popen[bytes]] = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(r % layout["tasks_per_node"]), MASTER_ADDR="127.0.0.1",
                   PSWIFT_LAUNCH_DIR=folder, PSWIFT_NODES=str(nodes),
                   OMP_NUM_THREADS=str(plan.get("cpus_per_task") or 1))
        env.pop("MASTER_PORT", None)
        for k in [k for k in env if k.startswith("SLURM_")]:
            del env[k]  # a local run inside an allocation must not pick up Slurm's ranks
        procs.append(subprocess.Popen([plan["python"], "-m", "pipeswift_launch", plan_path], env=env))

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if any(c not in (None, 0, relayout_exit) for c in codes):
                _stop(procs, grace_s)
                break
            time.sleep(0.1)
        return [p.wait() for p in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _launches(plan: Plan) -> str:
    path = os.path.join(plan["run_dir"], "launches")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _stop(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + grace_s
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
