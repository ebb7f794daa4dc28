"""`pswift run`: the same job on this machine, one local process per slot, without Slurm.

The launches are driven as the batch script drives them: after each, ``python -m
pipeswift_launch.afterlaunch`` (pipeswift_slurm.planning.decide's rules) says what follows, from
the ranks' records and a report of how each process ended written as srun writes its own. So a
rank killed by a signal restarts the ranks from the newest committed checkpoint, within ``[job]
max_restarts``, and a re-layout launches them again on plan.json's new cut, as in a Slurm job
(a local run has no requeue: what would requeue ends the run).

A run of members (``[resources] members``) runs each member as its array task's batch script
would (:func:`run_members`): a loop of its own that takes a seat in the run's next epoch
(``python -m pipeswift_launch.members``), launches its ranks there and asks afterlaunch what
follows. A member whose ranks alone are signalled (``SLURM_ARRAY_TASK_ID`` in their
environment names it) leaves the run and, as Slurm would requeue it, starts again
``requeue_s`` later; the others train on in the next epoch."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeswift_slurm import memberfiles, runfiles
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
    world = int(plan["layouts"][str(nodes)]["world_size"])
    while True:
        folder, codes = _launch_ranks(plan, plan_path, world, nodes, env, grace_s, forward=True)
        step = _after_launch(plan, plan_path, folder, codes, restarts, relayouts, env)
        if step == "relayout":
            relayouts += 1
            print(f"pswift: re-layout {relayouts}: launching the ranks again", flush=True)
        elif step == "restart":
            restarts += 1
            print(f"pswift: restart {restarts}: launching the ranks again", flush=True)
        else:
            return int(step[len("exit "):]) if step.startswith("exit ") and step[5:].isdigit() else 1


def _after_launch(plan: Plan, plan_path: str, folder: str, codes: list[int], restarts: int, relayouts: int,
                  env: dict[str, str]) -> str:
    """srun's report of the launch written, afterlaunch's line: what follows."""
    rc = srun.exit_code(codes)
    with open(os.path.join(folder, "srun.err"), "w") as report:
        report.write(srun.report(NODE, codes))
    ask = subprocess.run([plan["python"], "-m", "pipeswift_launch.afterlaunch", plan_path, str(rc), folder,
                          str(restarts), str(relayouts)], stdout=subprocess.PIPE, text=True, env=env)
    return ask.stdout.strip() if ask.returncode == 0 else f"exit {rc or 1}"


#: seconds after a member left the run before it starts again, as Slurm's requeue would
REQUEUE_S = 3.0


def run_members(plan: Plan, plan_path: str, members: int, grace_s: float = 60.0,
                requeue_s: float = REQUEUE_S) -> int:
    """Run ``members`` members of the run, each in a thread of its own (:func:`_member`);
    TERM/INT/USR2 to this process stop them all (the run cancelled). 0 once the run trained
    every step, else the first member's failing code."""
    stopping = threading.Event()
    codes: dict[int, int] = {}
    threads = [threading.Thread(target=lambda t=t: codes.__setitem__(t, _member(
        plan, plan_path, t, grace_s, requeue_s, stopping)), daemon=True) for t in range(members)]

    def stop_all(signum: int, frame: Any) -> None:
        stopping.set()
        _signal_members(plan_path, signum)

    old = {s: signal.signal(s, stop_all) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    try:
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            time.sleep(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if memberfiles.finished(Path(plan["run_dir"])):
        return 0
    return next((c for _, c in sorted(codes.items()) if c), 1)


def _member(plan: Plan, plan_path: str, task: int, grace_s: float, requeue_s: float,
            stopping: threading.Event) -> int:
    """Member ``task``'s batch script: join, launch, ask what follows, until its run is done or
    it ends; once it left the run (its ranks signalled alone), again after ``requeue_s``."""
    nodes = int(plan["member_nodes"])
    ranks = nodes * _tasks_per_node(plan)
    hosts = ",".join(f"member{task}n{k}" for k in range(nodes))
    base = dict(_local_env(), SLURM_ARRAY_TASK_ID=str(task))
    attempt = restarts = relayouts = 0
    while not stopping.is_set():
        rc, joined = _join(plan, plan_path, dict(base, SLURM_JOB_ID=f"local{task}", SLURM_JOB_NODELIST=hosts,
                                                 SLURM_NTASKS=str(ranks)), stopping)
        if rc != 0 or joined == "done":
            return rc
        epoch = dict(kv.split("=", 1) for kv in shlex.split(joined)[1:])   # "export K=V ..."
        env = dict(base, PSWIFT_ATTEMPT=str(attempt), **epoch)
        folder, codes = _launch_ranks(plan, plan_path, ranks, nodes, env, grace_s)
        line = _after_launch(plan, plan_path, folder, codes, restarts, relayouts, env)
        restarts += line == "restart"
        relayouts += line == "relayout"
        if line in ("rejoin", "restart", "relayout"):
            continue
        if not memberfiles.left_mark(Path(epoch["PSWIFT_RENDEZVOUS_DIR"]), task).exists() or stopping.wait(requeue_s):
            return int(line[5:]) if line.startswith("exit ") and line[5:].isdigit() else 1
        attempt, restarts, relayouts = attempt + 1, 0, 0   # requeued: its next attempt
    return 1


def _join(plan: Plan, plan_path: str, env: dict[str, str], stopping: threading.Event) -> tuple[int, str]:
    """``python -m pipeswift_launch.members``: its exit code and its line; stopped (143) when
    the run is (a member may wait an hour for an epoch)."""
    proc = subprocess.Popen([plan["python"], "-m", "pipeswift_launch.members", plan_path], stdout=subprocess.PIPE,
                            text=True, env=env)
    while proc.poll() is None:
        if stopping.wait(0.2):
            proc.terminate()
    out = proc.stdout.read() if proc.stdout is not None else ""
    return (proc.returncode if not stopping.is_set() else 143), out.strip()


def _signal_members(plan_path: str, signum: int) -> None:
    """Every rank of this run's members (their environment names the plan's run)."""
    for pid in member_ranks(plan_path):
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def member_ranks(plan_path: str, task: int | None = None) -> list[int]:
    """The pids of the ranks of this run's members (of member ``task`` only when given)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if b"pipeswift_launch" not in cmd or plan_path.encode() not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        tasks = [e[len(b"SLURM_ARRAY_TASK_ID="):] for e in env if e.startswith(b"SLURM_ARRAY_TASK_ID=")]
        if tasks and (task is None or tasks[0] == str(task).encode()):
            out.append(int(pid))
    return out


def _local_env() -> dict[str, str]:
    """This environment less Slurm's: a local run inside an allocation must not pick up its ranks."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "MASTER_PORT"}


def _launch_ranks(plan: Plan, plan_path: str, world: int, nodes: int, env: dict[str, str], grace_s: float,
                  forward: bool = False) -> tuple[str, list[int]]:
    """One launch of ``world`` ranks on ``nodes`` emulated nodes, in ``env``: its folder and the
    ranks' exit codes; ``forward``: TERM/INT/USR2 to this process go to them (the main thread
    only). One rank's failure stops the others (as srun's --kill-on-bad-exit: else they would
    wait in a collective)."""
    # the launch's own folder: rank 0 publishes the rendezvous there, each rank its record
    folder = tempfile.mkdtemp(prefix=f"local.{os.getpid()}.", dir=_launches(plan))
    procs: list[subprocess.Popen[bytes]] = []
    for r in range(world):
        rank_env = dict(env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r % _tasks_per_node(plan)),
                        MASTER_ADDR="127.0.0.1", PSWIFT_LAUNCH_DIR=folder, PSWIFT_NODES=str(nodes),
                        OMP_NUM_THREADS=str(plan.get("cpus_per_task") or 1))
        procs.append(subprocess.Popen([plan["python"], "-m", "pipeswift_launch", plan_path], env=rank_env))

    def to_ranks(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, to_ranks) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)} if forward else {}
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if any(c not in (None, Exit.OK, Exit.RELAYOUT, Exit.REJOIN) for c in codes):   # the others follow
                _stop(procs, grace_s)
                break
            time.sleep(0.1)
        return folder, [p.wait() for p in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _tasks_per_node(plan: Plan) -> int:
    return int(next(iter(plan["layouts"].values()))["tasks_per_node"])


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
