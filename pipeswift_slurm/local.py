"""`pswift run`: the same job on this machine, one local process per slot, without Slurm.

The launches are driven as the batch script drives them: after each, ``python -m
pipeswift_launch.afterlaunch`` (pipeswift_slurm.planning.decide's rules) says what follows, from
the ranks' records and a report of how each process ended written as srun writes its own. So a
rank killed by a signal restarts the ranks from the newest committed checkpoint, within ``[job]
max_restarts``, and a re-layout launches them again on plan.json's new cut, as in a Slurm job
(a local run has no requeue: what would requeue ends the run)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from typing import TYPE_CHECKING, Any

from pipeswift_slurm import runfiles
from pipeswift_slurm.codes import Exit
from pipeswift_slurm.slurm import srun

if TYPE_CHECKING:
    from pipeswift_slurm.plan import Plan

#: the node name a local run's ranks report under (srun's report names one)
NODE = "localhost"


def run_local(plan: Plan, plan_path: str, nodes: int, grace_s: float = 60.0) -> int:
    """Launch ``world_size`` ranks of ``python -m pipeswift_launch`` (TERM/INT/USR2 forwarded to
    them) until the helper says the run ends; its exit code (0: every rank finished)."""
    restarts = relayouts = 0
    env = _local_env()
    while True:
        folder, codes = _launch_once(plan, plan_path, nodes, grace_s)
        rc = srun.exit_code(codes)
        with open(os.path.join(folder, "srun.err"), "w") as report:
            report.write(srun.report(NODE, codes))
        ask = subprocess.run([plan["python"], "-m", "pipeswift_launch.afterlaunch", plan_path, str(rc), folder,
                              str(restarts), str(relayouts)], stdout=subprocess.PIPE, text=True, env=env)
        step = ask.stdout.strip() if ask.returncode == 0 else ""
        if step == "relayout":
            relayouts += 1
            print(f"pswift: re-layout {relayouts}: launching the ranks again", flush=True)
        elif step == "restart":
            restarts += 1
            print(f"pswift: restart {restarts}: launching the ranks again", flush=True)
        else:
            return int(step[len("exit "):]) if step.startswith("exit ") and step[5:].isdigit() else rc or 1


def _local_env() -> dict[str, str]:
    """This environment less Slurm's: a local run inside an allocation must not pick up its ranks."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "MASTER_PORT"}


def _launch_once(plan: Plan, plan_path: str, nodes: int, grace_s: float) -> tuple[str, list[int]]:
    """One launch of every rank: its folder and the ranks' exit codes. One rank's failure stops
    the others (as srun's --kill-on-bad-exit: else they would wait in a collective)."""
    layout = plan["layouts"][str(nodes)]
    world = int(layout["world_size"])
    # the launch's own folder: rank 0 publishes the rendezvous there, each rank its record
    folder = tempfile.mkdtemp(prefix=f"local.{os.getpid()}.", dir=_launches(plan))
    procs: list[subprocess.Popen[bytes]] = []
    for r in range(world):
        env = dict(_local_env(), RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r % layout["tasks_per_node"]),
                   MASTER_ADDR="127.0.0.1", PSWIFT_LAUNCH_DIR=folder, PSWIFT_NODES=str(nodes),
                   OMP_NUM_THREADS=str(plan.get("cpus_per_task") or 1))
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
            if any(c not in (None, Exit.OK, Exit.RELAYOUT) for c in codes):   # a re-layout: the others follow
                _stop(procs, grace_s)
                break
            time.sleep(0.1)
        return folder, [p.wait() for p in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _launches(plan: Plan) -> str:
    path = os.path.join(plan["run_dir"], runfiles.LAUNCHES)
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
