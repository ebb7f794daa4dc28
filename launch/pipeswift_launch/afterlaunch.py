"""``python -m pipeswift_launch.afterlaunch PLAN RC LAUNCH_DIR RESTARTS RELAYOUTS``: the batch
script asks this after every launch of the ranks what follows, and gets one line back:
``restart``, ``relayout`` or ``rejoin`` (launch again in this allocation; ``rejoin``: in the
next epoch of a run of members), ``shrink N NODELIST`` (launch
again on the N nodes Slurm left the job after a node failure) or ``exit N`` (end the script
with N). The rules are pipeswift_slurm.planning.decide's; this module gathers their facts (the ranks'
records, srun's report, the job's events), records the outcome (``crash`` and ``end`` events),
waits the backoff and requeues the job when the decision says so. No torch."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeswift_slurm.plan import Plan

from pipeswift_slurm import events as events_mod
from pipeswift_slurm.codes import Action, Exit
from pipeswift_slurm.errors import PswiftError
from pipeswift_slurm.plan import for_partition, read_plan, runnable
from pipeswift_slurm.planning import decide
from pipeswift_slurm.slurm import srun
from pipeswift_slurm.slurm.records import expand_hostlist

from . import launchrec, members, metrics
from . import outcome
from .rendezvous import EPOCH_ENV
from .dist_env import job_ref
from .slurmport import slurm


def deaths_of(records: list[dict[str, Any]], report: str) -> list[decide.Death]:
    """The ranks' exceptions (their own words) and what srun saw of the others."""
    raised = [decide.Death("exception", r["rank"], r.get("node"), r.get("step"), str(r["error"]))
              for r in records if r.get("error")]
    hangs = [decide.Death("hung", r.get("suspect_rank"), r.get("suspect_node"), r.get("step"), str(r["hang"]))
             for r in records if r.get("hang")]
    said = {d.rank for d in raised} | {r["rank"] for r in records if r.get("hang")}
    seen = [d for d in decide.srun_deaths(report) if not (d.rank in said and d.how.startswith("exit"))]
    return raised + hangs + seen


def _job_failures(evs: list[dict[str, Any]], job_id: str | None) -> list[str]:
    """The signatures of this job's earlier failures that repeat matters for: an exception (at
    its step) and a hang (on its node)."""
    return [decide.Death(e["how"], node=e.get("node"), step=e.get("step"), error=e.get("error")).signature
            for e in evs if e["event"] == "crash" and e.get("job_id") == job_id
            and (e.get("how") == "exception" and e.get("error") or e.get("how") == "hung" and e.get("node"))]


def decide_after(plan: Plan, rc: int, folder: Path, restarts: int, relayouts: int,
                 env: dict[str, str]) -> tuple[decide.Decision, int | None]:
    """The decision and the last step this attempt reached (from the events)."""
    records, report = launchrec.read(folder)
    ended_itself = any("rc" in r for r in records) and not any(r.get("error") for r in records)
    job_id, attempt = env.get("SLURM_JOB_ID"), int(env.get("SLURM_RESTART_COUNT") or 0)
    crashes, last_step = _crashes_and_last_step(plan["run_dir"], job_id, attempt) \
        if rc not in (Exit.OK, Exit.RELAYOUT) else ([], None)
    budgets = outcome.budgets(plan, attempt, job_id, restarts, relayouts)
    deaths = deaths_of(records, report)
    # nodes lost before Slurm knew: launchwatch found them silent, or srun could not reach them
    silent = tuple(dict.fromkeys([*launchrec.lost(folder), *(x.node for x in deaths
                                                             if x.how == "lost" and x.rank is None and x.node)]))
    alloc, ending = None, srun.job_ending(report) if rc != 0 and not ended_itself else None
    if rc != 0 and not ended_itself and not ending:
        alloc = (unannounced(plan, env, silent) if silent
                 else allocation(plan, env, any(x.how == "lost" for x in deaths)))
    d = decide.what_follows(decide.Launched(rc, ended_itself, deaths, _job_failures(crashes, job_id), alloc, ending),
                            budgets)
    return d, last_step


def _crashes_and_last_step(run_dir: str, job_id: str | None, attempt: int) -> tuple[list[dict[str, Any]], int | None]:
    """The run's crash events and the last step this attempt of ``job_id`` logged, read as a
    stream (a long run's events are never held whole)."""
    crashes: list[dict[str, Any]] = []
    last = None
    for e in events_mod.stream(run_dir, ("crash", "step")):
        if e["event"] == "crash":
            crashes.append(e)
        elif e["attempt"] == attempt and e.get("job_id") == job_id:
            last = e["step"]
    return crashes, last


#: how long a launch that lost a node waits for Slurm to drop it from the allocation
LOST_WAIT_S = 60.0


def unannounced(plan: Plan, env: dict[str, str], silent: tuple[str, ...]) -> decide.Allocation | None:
    """The launch's nodes less ``silent`` ones Slurm still counts in the allocation: the next
    launch leaves them out itself. None when the launch's nodes are not known."""
    try:
        launched = expand_hostlist(env.get("SLURM_JOB_NODELIST") or "")
    except PswiftError:
        return None
    left = [n for n in launched if n not in silent]
    if not launched or len(left) == len(launched):
        return None
    stages = {int(n): int(lay["stages"]) for n, lay in plan["layouts"].items()}
    return decide.Allocation(len(launched), len(left), tuple(n for n in silent if n in launched), stages,
                             ",".join(left), unannounced=True)


def allocation(plan: Plan, env: dict[str, str], lost_seen: bool) -> decide.Allocation | None:
    """The nodes the launch ran on (this script's environment) against those Slurm's allocation
    holds now; when srun saw a node lost, Slurm is given LOST_WAIT_S to drop it. None when
    Slurm cannot be asked."""
    job = env.get("SLURM_JOB_ID")
    try:
        launched = expand_hostlist(env.get("SLURM_JOB_NODELIST") or "")
    except PswiftError:
        return None
    if not job or not launched:
        return None
    stages = {int(n): int(lay["stages"]) for n, lay in plan["layouts"].items()}
    deadline = time.monotonic() + (LOST_WAIT_S if lost_seen else 0.0)
    while True:
        try:
            info = slurm().job_info(job)   # squeue --json: a job's comment cannot pose as its fields
            if info is None or info.state != "RUNNING" or not info.node_names:
                return None    # requeued or ending: not a node list to go on with
            now = info.node_names
        except PswiftError:
            return None
        lost = tuple(n for n in launched if n not in now)
        if lost or time.monotonic() >= deadline:
            return decide.Allocation(len(launched), len(now), lost, stages, info.nodes)
        time.sleep(2.0)


def _record(plan: Plan, d: decide.Decision, last_step: int | None, restarts: int,
            env: dict[str, str]) -> None:
    run_dir, job_id = Path(plan["run_dir"]), env.get("SLURM_JOB_ID")
    attempt = int(env.get("SLURM_RESTART_COUNT") or 0)
    death = d.death or decide.Death("exit")
    action = "restart" if d.action in (Action.RELAUNCH, Action.SHRINK) else d.action.value
    writer = events_mod.Writer(run_dir, True, attempt, job_id)
    sink = metrics.attach(writer, run_dir, plan["training"])
    try:
        writer.emit("crash", how=death.how, rank=death.rank, node=death.node,
                    step=death.step if death.step is not None else last_step, error=death.error,
                    action=action, restart=restarts + 1 if d.counts_as_restart else None, why=d.why)
        writer.emit("end", reason="failed" if d.action is Action.FAIL else "crashed", step=last_step,
                    requeue=d.action is Action.REQUEUE, error=d.why)
    finally:
        writer.close()
        if sink is not None:
            sink.close()


def carry_out(plan: Plan, d: decide.Decision, last_step: int | None, restarts: int,
              env: dict[str, str]) -> str:
    """Record the outcome, wait or requeue; the line for the batch script."""
    if d.death is not None or d.action in (Action.FAIL, Action.REQUEUE):
        _record(plan, d, last_step, restarts, env)
    job = job_ref(env)   # an array task (a member of a run) as ARRAY_TASK: its own id may be the array's
    who = f"job {env.get('SLURM_JOB_ID')}" if job else "the local run"
    if d.action is Action.SHRINK:
        print(f"pswift: {who}: {d.why}; launching again in {d.backoff_s:g} s", file=sys.stderr, flush=True)
        if d.exclude and d.nodelist:   # Slurm still counts the silent node: give it back
            try:
                slurm().shrink_job(str(job), d.nodelist)
            except Exception as e:   # noqa: BLE001 - the launches leave it out all the same
                print(f"pswift: could not give {d.exclude} back to Slurm ({e}); the job's end waits "
                      f"for Slurm to find it down", file=sys.stderr, flush=True)
        time.sleep(d.backoff_s)
        return f"shrink {d.nodes} {d.nodelist}" + (f" {d.exclude}" if d.exclude else "")
    if d.action is Action.RELAYOUT:
        return "relayout"
    if d.action is Action.REJOIN:
        return "rejoin"
    if d.action is Action.RELAUNCH:
        print(f"pswift: {who}: {d.why}; launching again in {d.backoff_s:g} s", file=sys.stderr, flush=True)
        time.sleep(d.backoff_s)
        return "restart"
    if d.action is Action.REQUEUE:
        print(f"pswift: {who}: {d.why}", file=sys.stderr, flush=True)
        # the requeue SIGTERMs the job's processes, this one too: it must live to exclude the node
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if outcome.requeue(plan, str(job), exclude=d.exclude):
                print(f"pswift: the next attempt will not use node {d.exclude}", file=sys.stderr, flush=True)
        except Exception as e:   # noqa: BLE001 - Slurm's word goes to the log; the job then ends
            print(f"pswift: the requeue failed: {e}", file=sys.stderr, flush=True)
            return "exit 1"
        return "exit 0"
    if d.action is Action.FAIL:
        print(f"pswift: {who} failed: {d.why}", file=sys.stderr, flush=True)
    return f"exit {d.exit_code}"


def _leave_epoch(env: dict[str, str]) -> None:
    """A member whose batch script ends here (requeued, failed, its job ending) leaves the epoch
    it launched in: the run's next epoch does not wait for it (members.REJOIN_WAIT_S)."""
    task, epoch = env.get("SLURM_ARRAY_TASK_ID"), env.get(EPOCH_ENV)
    if task and task.isdigit() and epoch:
        members.leave(Path(epoch), int(task))


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print("usage: python -m pipeswift_launch.afterlaunch PLAN RC LAUNCH_DIR RESTARTS RELAYOUTS",
              file=sys.stderr)
        return 2
    plan = for_partition(runnable(read_plan(argv[0]), argv[0]), os.environ.get("SLURM_JOB_PARTITION"))
    rc, folder, restarts, relayouts = int(argv[1]), Path(argv[2]), int(argv[3]), int(argv[4])
    env = dict(os.environ)
    d, last_step = decide_after(plan, rc, folder, restarts, relayouts, env)
    if d.death is None and d.action is not Action.FAIL:   # nothing went wrong: nothing to keep
        shutil.rmtree(folder, ignore_errors=True)
    line = carry_out(plan, d, last_step, restarts, env)
    if line.startswith("exit") and plan["members"] and not members.finished(Path(plan["run_dir"])):
        _leave_epoch(env)   # (a run trained to its end: nobody waits for anyone)
    try:
        print(line, flush=True)
    except BrokenPipeError:   # the batch script is gone (cancelled while this decided): nothing to tell
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
