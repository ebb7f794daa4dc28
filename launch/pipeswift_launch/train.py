"""The training loop of one rank: build, resume, train, stop together, checkpoint, requeue."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import deepspeed
import torch
from deepspeed import comm as dist
from pipeswift_slurm import runfiles
from pipeswift_slurm import events as events_schema
from pipeswift_slurm.codes import POSTED_BELOW_S, Action, Exit, Stop
from pipeswift_slurm.plan import relaid_out, write_plan
from pipeswift_slurm.planning import decide, interval, limits

from . import (collectives, data, ds_compat, grow, growwatch, members, metrics, probe, relayout, rendezvous, rng,
               zerobubble)
from .attempt import Attempt
from .checkpointer import Checkpointer
from .dsconfig import ds_config
from .dist_env import DistEnv, log0 as _log
from .pipe import build_pipe
from .layerprofile import PROFILE_STEPS, InstructionTimer, LayerProfiler
from .signals import requested
from . import outcome
from .slurmport import slurm
from .stepparts import StepParts
from .watchdog import Watchdog, end_attempt

if TYPE_CHECKING:
    from pipeswift_slurm.plan import LayoutSpec, Plan


#: the slots of the flags every rank all-reduces (MAX) at each step's end: the stop code
#: (pipeswift_slurm.codes.Stop), step times drifted (re-profile), rank 0: a periodic checkpoint
#: is due by time, a rank's background checkpoint is still being written, the step's seconds
FLAG_STOP, FLAG_DRIFT, FLAG_DUE, FLAG_WRITING, FLAG_STEP_S = range(5)
#: the step this rank is running (None before training): a crash's record says where it was
progress: dict[str, int | None] = {"step": None}


def run(plan: Plan, denv: DistEnv, started: float | None = None) -> int:
    """One rank's attempt: refuse what cannot run, set up, resume, train, finish."""
    os.environ.update(denv.exports())
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if plan["device"] == "cuda" else "cpu")
    events = events_schema.Writer(Path(plan["run_dir"]), denv.rank == 0, denv.attempt, denv.job_id)
    sink = metrics.attach(events, Path(plan["run_dir"]), plan["training"])
    try:
        return _run(plan, denv, events, started)
    finally:
        if sink is not None:
            sink.close()


def _run(plan: Plan, denv: DistEnv, events: events_schema.Writer, started: float | None) -> int:
    layout = plan["layouts"].get(str(denv.nodes))
    refusal = _refusal(plan, denv, layout)
    if refusal is not None:
        reason, msg, rc = refusal
        _log(denv.rank, f"error: {msg}" if rc == Exit.REFUSED else f"stopping: {msg}")
        events.emit("end", reason=reason, error=msg)
        events.close()
        return rc
    assert layout is not None   # _refusal refuses a node count the plan has no layout for
    att = Attempt(plan, denv, layout, events)
    t0 = started or time.time()
    _setup(att)
    t_load = time.time()
    resumed_from = _resume(att)
    att.setup_s, att.load_s = time.time() - t0, time.time() - t_load if resumed_from else 0.0
    _emit_start(att, att.setup_s, att.load_s, resumed_from)
    stop_code = _train(att)
    return _finish(att, stop_code)


def _refusal(plan: Plan, denv: DistEnv, layout: LayoutSpec | None) -> tuple[str, str, int] | None:
    """(end reason, message, exit code) when this attempt must not train at all."""
    if layout is None or layout["world_size"] != denv.world_size:
        msg = (f"the job got {denv.nodes} node(s) / {denv.world_size} tasks but plan.json has layouts "
               f"for {sorted(plan['layouts'], key=int)} nodes"
               + (f" ({plan['infeasible'][str(denv.nodes)]})" if str(denv.nodes) in plan["infeasible"] else ""))
        return "failed", msg, int(Exit.REFUSED)
    if not decide.may_train(denv.attempt, plan["max_requeues"]):
        return ("requeue_budget", f"attempt {denv.attempt} exceeds max_requeues = {plan['max_requeues']}: "
                f"not training again; raise [job] max_requeues and resubmit to continue from the last "
                f"checkpoint", int(Exit.BUDGET_SPENT))
    return None


def _setup(att: Attempt) -> None:
    """DeepSpeed, the process group, the engine; the checkpoint directory cleaned by rank 0."""
    plan, denv, layout = att.plan, att.denv, att.layout
    ds_compat.check_version()
    if plan["device"] != "cuda":
        ds_compat.skip_shm_build()
    ds_compat.eager_optimizers()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    torch.set_num_threads(int(plan["cpus_per_task"]))
    backend, device = "gloo", torch.device("cpu")
    if plan["device"] == "cuda":
        torch.cuda.set_device(denv.local_rank % max(1, torch.cuda.device_count()))
        backend, device = "nccl", torch.device("cuda", torch.cuda.current_device())
    # this launch's own store and secret (rendezvous.py); every rank proves it before anything else
    secret = rendezvous.init_group(backend, denv.rank, denv.world_size, denv.master_addr,
                                   rendezvous.folder_of(os.environ))
    rendezvous.prove(secret, denv.rank, denv.world_size, device)
    deepspeed.init_distributed(dist_backend=backend)
    seed = int(plan["training"]["seed"])
    rng.reseed(seed, 0, 0)  # every rank builds the same weights, whatever the model's code draws
    model = build_pipe(plan, layout)
    rng.reseed(seed, 0, denv.rank)
    if plan["training"]["gradient_clipping"] and layout["stages"] > 1:
        ds_compat.mark_model_parallel(model.parameters())
    att.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=ds_config(plan, layout, sum(p.numel() for p in model.parameters())))
    if plan["schedule"] == "zb-h1":
        att.weight_grads = zerobubble.install(att.engine)
    att.dist = dist
    att.boundaries = [int(b) for b in att.engine.module.parts]
    att.checkpoints = Checkpointer(att.engine, dist, Path(plan["training"]["checkpoint_dir"]), att.rank,
                                   denv.world_size, att.events, int(plan["training"]["keep_checkpoints"]),
                                   model_id(plan))
    att.checkpoints.clean_folder()
    # its first step is a barrier: no rank goes on before rank 0 has cleaned the folder
    att.hardware = probe.measure(att.engine, plan["device"])


def _emit_start(att: Attempt, setup_s: float, load_s: float, resumed_from: str | None) -> None:
    layout, denv = att.layout, att.denv
    att.step = int(att.engine.global_steps)
    att.events.emit("start", nodes=denv.nodes, world_size=denv.world_size, stages=layout["stages"],
                    data_parallel=layout["data_parallel"], micro_batches=layout["micro_batches"],
                    micro_batch_size=layout["micro_batch_size"], boundaries=att.boundaries,
                    partition=layout["partition"], schedule=att.plan["schedule"], step=att.step, resumed_from=resumed_from,
                    setup_s=round(setup_s, 3), load_s=round(load_s, 3), **att.hardware)
    _log(att.rank, f"attempt {denv.attempt}: {layout['stages']} stage(s) x {layout['data_parallel']} "
                   f"data-parallel on {denv.nodes} node(s), boundaries {att.boundaries}, "
                   f"m={layout['micro_batches']}, from step {att.step}, setup {setup_s:.1f} s")


def _meta(att: Attempt, reason: str) -> dict[str, Any]:
    layout, denv = att.layout, att.denv
    return {"samples": int(att.engine.global_samples), "boundaries": att.boundaries,
            "model_id": att.checkpoints.model_id, "stages": layout["stages"],
            "data_parallel": layout["data_parallel"], "micro_batches": layout["micro_batches"],
            "world_size": denv.world_size, "data_position": att.step, "reason": reason,
            "job_id": denv.job_id, "attempt": denv.attempt}


def _save(att: Attempt, reason: str) -> None:
    """A checkpoint of this step by every rank, committed before it returns."""
    att.checkpoints.save(att.step, _meta(att, reason))


def _evaluate(att: Attempt, data_kwargs: dict[str, Any]) -> None:
    """The validation loss ([training] eval_every): ``eval_batches`` micro-batches of each
    data-parallel rank through the pipeline without gradients (DeepSpeed's eval_batch: every
    rank calls it, the mean loss comes back to each); rank 0 records it. Without [training]
    eval_data, the training data's batches of the step after the last, which the run never
    trains on: the same samples at every validation, so the losses compare."""
    t = att.plan["training"]
    n, mbs = int(t["eval_batches"]), att.layout["micro_batch_size"]
    own = t["eval_data"] is not None
    fn = data.source(att.plan, "eval_data" if own else "data")
    dp_rank = att.engine.grid.data_parallel_id
    batches = [fn(step=0 if own else int(t["steps"]), index=dp_rank * n + i, micro_batch_size=mbs,
                  seed=int(t["seed"]), **data_kwargs) for i in range(n)]
    ts = time.time()
    loss = float(att.engine.eval_batch(data_iter=iter(batches), num_micro_batches=n).item())
    if att.rank == 0:
        att.events.emit("eval", step=att.step, loss=loss, batches=n, seconds=round(time.time() - ts, 6))
        print(f"eval at step {att.step}: loss {loss:.6f}", flush=True)


def _train(att: Attempt) -> int:
    """Steps until the last one or a stop request every rank agrees on; returns the stop code."""
    plan, t, engine = att.plan, att.plan["training"], att.engine
    data_fn = data.source(plan)
    data_kwargs = dict(plan["model"]["kwargs"])
    m, mbs = att.layout["micro_batches"], att.layout["micro_batch_size"]
    dp_rank = engine.grid.data_parallel_id
    steps, every = int(t["steps"]), int(t["checkpoint_interval"])
    flags = collectives.StepFlags(5)   # FLAG_STOP, FLAG_DRIFT, FLAG_DUE, FLAG_WRITING, FLAG_STEP_S
    att.checkpoints.saved_at = time.time()
    stop_code = int(Stop.NONE)
    run_dir = Path(plan["run_dir"])
    dog = Watchdog(run_dir, att.rank, os.environ.get("SLURMD_NODENAME", "local"),
                   float(t["hang_timeout_factor"]), float(t["hang_timeout_min_s"]),
                   lambda info: end_attempt(run_dir, plan, att.denv, info),
                   launch=f"{att.denv.attempt}.{os.environ.get('SLURM_STEP_ID', 'local')}.{plan['revision']}")
    dog.start()
    profiler, timer = _profilers(att), InstructionTimer(engine, sync=plan["device"] == "cuda")
    first = att.step  # the profiling window counts from this attempt's first step
    att.trained_from = (att.step, time.time())
    step_times: list[float] = []
    proposal = watcher = profiled = None
    drift = relayout.Drift()
    parts = StepParts()   # rank 0's steady steps, part by part (the step_parts event)
    while att.step < steps:
        progress["step"] = att.step + 1
        profiler.active = timer.active = (att.step + 1 - first) in PROFILE_STEPS
        # counted: rank 0's steps after the profile window, but the last (its end is the final save)
        parts.begin(counting=att.rank == 0 and att.step - first >= PROFILE_STEPS[-1] and att.step + 1 < steps)
        batches = [data_fn(step=att.step, index=dp_rank * m + i, micro_batch_size=mbs, seed=int(t["seed"]),
                           **data_kwargs) for i in range(m)]
        parts.lap("data")
        ts = time.time()
        loss = engine.train_batch(data_iter=iter(batches))
        dt = time.time() - ts
        parts.lap("train_batch")
        if timer.active:
            timer.steps += 1
            timer.seconds["step"] += dt
        att.step = int(engine.global_steps)
        step_times.append(dt)
        dog.beat(att.step, dt)
        parts.lap("watchdog")
        if att.rank == 0:
            lv = float(loss.item())
            att.events.emit("step", step=att.step, loss=lv, loss_hex=lv.hex(), step_time=round(dt, 6),
                            lr=float(engine.get_lr()[0]))
            print(f"step {att.step}/{steps} loss {lv:.6f} ({dt * 1000:.1f} ms)", flush=True)
        parts.lap("events", carved_total=att.events.listeners_s)
        if t["eval_every"] and att.step % int(t["eval_every"]) == 0:   # every rank, at the same step
            _evaluate(att, data_kwargs)
        parts.lap("eval")
        if profiler.handles and (att.step - first == PROFILE_STEPS[-1] or att.step >= steps):
            profiled = _emit_profile(profiler, timer, att)
            if att.step < steps:
                window = step_times[-len(PROFILE_STEPS):]   # the profiled steps
                proposal = _relayout_proposal(att, profiled, window)
                drift.settle(att.step)
                watcher = watcher or growwatch.watch(att, step_times, profiled)
        parts.lap("profile")
        drifted = att.rank == 0 and not profiler.handles and drift.drifted(att.step, step_times)
        agreed = _agree(att, flags, drifted, dt)
        parts.lap("flags")
        stop_code = _step_end(att, agreed, dog, every, proposal, watcher, profiled)
        parts.lap("step_end")
        if stop_code:
            break
        if att.step < steps and agreed[FLAG_STEP_S] < POSTED_BELOW_S:   # the next step's end takes them
            _mine(att, flags, drifted, dt)
            flags.post()
            now = flags.early(FLAG_STOP)   # every rank asked to stop during this step: stop at its end
            if now is not None:
                stop_code = _step_end(att, now, dog, every, proposal, watcher, profiled)
                break
        parts.lap("flags")
        if agreed[FLAG_DRIFT] and not profiler.handles:   # every rank: profile the next steps again
            profiler, timer = _profilers(att), InstructionTimer(engine, sync=plan["device"] == "cuda")
            first = att.step
    dog.stop()
    if parts.steps:
        att.events.emit("step_parts", steps=parts.steps, seconds=parts.per_step())
    if watcher is not None:
        watcher.stop()
    return stop_code


def _agree(att: Attempt, flags: collectives.StepFlags, drifted: bool, step_s: float) -> list[float]:
    """The flags this step's end acts on, every rank's taken together: those posted at the last
    step's end, after its decisions (a step late, where steps are short), else this step's now."""
    agreed = flags.take()
    if agreed is None:
        _mine(att, flags, drifted, step_s)
        agreed = flags.agree()
    return agreed


def _mine(att: Attempt, flags: collectives.StepFlags, drifted: bool, step_s: float) -> None:
    """This rank's flags: a stop asked for, rank 0's step times ``drifted``, rank 0's periodic
    checkpoint due by time, this rank still writing one, the step's seconds."""
    flags.mine[FLAG_DRIFT] = float(att.rank == 0 and drifted)
    flags.mine[FLAG_DUE] = float(att.rank == 0 and time.time() - att.checkpoints.saved_at >= _checkpoint_every_s(att))
    flags.mine[FLAG_STOP] = float(requested())
    flags.mine[FLAG_WRITING] = float(att.checkpoints.writing())
    flags.mine[FLAG_STEP_S] = step_s


def _checkpoint_every_s(att: Attempt) -> float:
    """checkpoint_interval = "auto": seconds between periodic checkpoints on this node count
    (planning.interval.every), from what this launch's last checkpoint cost training and how
    long it took to write (else the planner's estimate for both)."""
    rec = att.plan["checkpoint_auto"]
    if not rec:
        return float("inf")
    cp = att.checkpoints
    planned = float(rec.get("cost_s") or 0.0)
    stall = cp.last_s if cp.last_s is not None else planned
    write = cp.last_write_s if cp.last_write_s is not None else planned
    return interval.every(stall, write, interval.from_record(rec).mtbf_s(att.denv.nodes),
                          float(att.plan["training"]["checkpoint_io_share"])).seconds


def _profilers(att: Attempt) -> LayerProfiler:
    profiler = LayerProfiler(att.engine.module, sync=att.plan["device"] == "cuda",
                             saved=not int(att.plan["training"]["activation_checkpoint_interval"]))
    if att.weight_grads is not None:
        att.weight_grads.watch = profiler    # ZB-H1: its weight passes timed per layer
    return profiler


def _step_end(att: Attempt, agreed: list[float], dog: Watchdog, every: int, proposal: Any, watcher: Any,
              profiled: dict[str, Any] | None) -> int:
    """Every rank, same point of every step, with the flags all ranks ``agreed`` on (whether
    anyone asked to stop: a signal, rank 0's growth watcher): save what the step calls for, or
    re-lay out; the stop code (0: go on)."""
    steps = int(att.plan["training"]["steps"])
    stop_code, writing = int(agreed[FLAG_STOP]), bool(agreed[FLAG_WRITING])
    if att.checkpoints.pending is not None and not writing:   # every rank's file is on disk: commit
        att.checkpoints.finish_pending()
    # a periodic checkpoint due while the last one is still being written starts once that one
    # is committed (a later step's end): training never waits for a write
    att.checkpoints.due |= bool((every and att.step % every == 0) or agreed[FLAG_DUE])
    periodic = att.checkpoints.due and not writing
    if stop_code or att.step >= steps:
        with dog.paused():
            _save(att, "grow" if stop_code == Stop.GROW else "signal" if stop_code else "final")
        if stop_code == Stop.GROW:
            growwatch.commit_growth(att, watcher, profiled)
    elif periodic:
        with dog.paused():
            att.checkpoints.save_in_background(att.step, _meta(att, "periodic"))
    elif proposal is not None and proposal.go and profiled is not None:
        with dog.paused():
            _save(att, "relayout")
        _commit_relayout(att, proposal, profiled)
        stop_code = int(Stop.RELAYOUT)
    return stop_code


def _finish(att: Attempt, stop_code: int) -> int:
    """Rank 0 gathers the facts of the attempt's end (one Slurm query for all) and decide says
    what follows; every rank records it, rank 0 carries it out (requeue or not)."""
    denv = att.denv
    leader = 0
    if stop_code == Stop.RELAYOUT:   # every rank knows: no fact to gather, nothing to send
        d = decide.what_follows(_stopped(att, Stop.RELAYOUT), _budgets(att))
    elif att.plan["members"]:   # each member's first rank decides for its own job
        d, leader = _member_decision(att, Stop(stop_code))
    else:   # rank 0 gathers the facts (one Slurm query for all) and decides for all
        mine = asdict(decide.what_follows(_stopped(att, Stop(stop_code)), _budgets(att))) if att.rank == 0 else None
        d = decide.Decision(**collectives.broadcast(mine, 0, att.rank, device=att.engine.device))
    reason, requeue_by = d.reason, d.requeue_by
    peaks = None
    if att.plan["device"] == "cuda":   # every rank's peak device memory, for the memory model's check
        peaks = collectives.all_gather(int(torch.cuda.max_memory_allocated()), denv.world_size,
                                       device=att.engine.device)
    att.events.emit("end", reason=reason, step=att.step, requeue=requeue_by is not None,
                    **({"device_peak_bytes": peaks} if peaks is not None else {}))
    att.events.close()
    _log(att.rank, f"attempt {denv.attempt} ended: {reason} at step {att.step}")
    att.dist.barrier()
    if att.rank == leader and denv.job_id is not None:
        _carry_out(att, d)
    if att.plan["members"] and att.rank == 0 and d.reason == "completed":
        members.finish(Path(att.plan["run_dir"]))   # a member requeued meanwhile ends when it starts
        _cancel_queued_members(att)
    att.dist.destroy_process_group()
    return d.exit_code


def _cancel_queued_members(att: Attempt) -> None:
    """The run trained every step: its members still in the queue (requeued by a preemption)
    are cancelled, not left to wait for a node ahead of other users' jobs only to find the run
    done (the workload bench's zombie members). Their array then ends with those tasks
    CANCELLED; `pswift status` and `--wait` read the run as COMPLETED (reports.watch)."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if not array or att.denv.job_id is None:
        return
    try:
        slurm().cancel_pending(array)
        _log(att.rank, f"the run is done: its members still queued (array {array}) are cancelled")
    except Exception as e:   # noqa: BLE001 - they then start, find the run done and end
        _log(att.rank, f"could not cancel the run's queued members ({e}); each ends when it starts")


def _member_decision(att: Attempt, stop: Stop) -> tuple[decide.Decision, int]:
    """A run of members (pipeswift_launch.members): a member Slurm signalled (preempted,
    cancelled, out of time) ends as a job of its own would, its first rank deciding and carrying
    it out for its job, and says it left; the others launch again in the run's next epoch
    (Exit.REJOIN), as every member does after a stop for a member waiting to join. Returns the
    decision and the rank that carries it out. Two all-gathers, on every rank."""
    denv, done = att.denv, att.step >= int(att.plan["training"]["steps"])
    offset = int(os.environ.get("PSWIFT_RANK_OFFSET") or 0)
    flags = collectives.all_gather([offset, int(requested() in (Stop.TERM, Stop.TIME))], denv.world_size,
                                   device=att.engine.device)
    signalled = any(s for o, s in flags if o == offset)
    decides = att.rank == 0 if done else (signalled and att.rank == offset)
    decided = asdict(decide.what_follows(_stopped(att, stop), _budgets(att))) if decides else None
    every = collectives.all_gather(decided, denv.world_size, device=att.engine.device)
    if done:
        return decide.Decision(**every[0]), 0
    if signalled:
        task, epoch = os.environ.get("SLURM_ARRAY_TASK_ID"), os.environ.get(rendezvous.EPOCH_ENV)
        if att.rank == offset and task and epoch:   # (an epoch: the batch script, `pswift run` of members)
            members.leave(Path(epoch), int(task))
        return decide.Decision(**every[offset]), offset
    why = "a member waits to join" if stop == Stop.GROW else "a member of the run left"
    return decide.Decision(Action.REJOIN, f"{why} at step {att.step}: the run's next epoch", int(Exit.REJOIN),
                           reason="members_changed"), offset


def model_id(plan: Plan) -> str:
    """What a checkpoint records of the model that wrote it: entry point, arguments, layers."""
    m = plan["model"]
    blob = json.dumps([m["entry"], m["kwargs"], m["num_layers"]], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resume(att: Attempt) -> str | None:
    """The newest committed checkpoint every rank can load (Checkpointer.resume), the random
    generators continued from it; the path loaded, None when there is none."""
    def loaded(path: Path, man: dict[str, Any], generators: dict[str, Any] | None) -> None:
        _log(att.rank, f"resumed from {path.name} (written by {man['stages']} stage(s) "
                       f"{man['boundaries']}) into {att.layout['stages']} stage(s) {att.boundaries}")
        _continue_generators(att, generators, int(man["step"]))
    layout = {**att.layout, "boundaries": att.boundaries, "world_size": att.denv.world_size}
    return att.checkpoints.resume(att.boundaries[-1], layout, loaded)


def _continue_generators(att: Attempt, saved: dict[str, Any] | None, step: int) -> None:
    """Each rank's random generators as they were at the checkpoint (same layout), else seeded
    from (seed, step, rank): another layout has no rank whose streams match. A model of
    LayerSpecs needs neither for its layers: DeepSpeed seeds each layer's forward from (seed,
    micro-batch, layer), whatever the stage count."""
    if saved is not None:
        try:
            rng.restore(saved)
            return
        except ValueError as e:  # rng.json edited or damaged (rng.restore says so)
            _log(att.rank, f"cannot restore the saved random generators ({type(e).__name__}); "
                           f"seeding them from (seed, step, rank)")
    rng.reseed(int(att.plan["training"]["seed"]), step, att.rank)
    if not att.engine.module.seed_layers:
        _log(att.rank, "random generators seeded from (seed, step, rank): the checkpoint was written "
                       "in another layout, so dropout masks from here differ from an uninterrupted run's")


def _emit_profile(profiler: LayerProfiler, timer: InstructionTimer, att: Attempt) -> dict[str, Any]:
    """Gather every stage's layer times and instruction times (data-parallel rank 0 of each)
    into one event; returns its content (every rank has it)."""
    engine, world = att.engine, att.denv.world_size
    mine = None
    if engine.grid.data_parallel_id == 0:
        mine = profiler.result()
        mine["instructions"] = {str(engine.stage_id): timer.result()}
    profiler.remove()
    timer.remove()
    allp = collectives.all_gather(mine, world, device=engine.device)
    merged: dict[str, Any] = {"seconds": {}, "weight_seconds": {}, "param_bytes": {}, "activation_bytes": {},
                              "saved_bytes": {}, "instructions": {}}
    samples = []
    for p in allp:
        if p:
            for k in merged:
                merged[k].update(p[k])
            samples.append(p["samples"])
    att.events.emit("layer_profile", micro_batch_size=att.layout["micro_batch_size"],
                    micro_batches=att.layout["micro_batches"], boundaries=att.boundaries,
                    samples=min(samples, default=0), **merged)
    return merged


def _relayout_proposal(att: Attempt, profiled: dict[str, Any], step_times: list[float]) -> Any:
    """Rank 0's re-layout proposal, the same on every rank (None: the TOML's explicit cut is
    the user's and stays)."""
    if att.layout["partition"] == "explicit" or att.layout["stages"] == 1 or not att.plan["rebalance"]:
        return None
    done = sum(1 for r in att.plan["relayouts"]
               if r.get("job_id") == att.denv.job_id and r.get("attempt") == att.denv.attempt)
    mine = None
    if att.rank == 0:
        mine = relayout.propose(att.plan, att.layout, att.boundaries, profiled, step_times, att.step,
                                att.setup_s + att.load_s, att.checkpoints.last_s, done)
        _log(att.rank, f"re-layout {'to ' + str(mine.boundaries) if mine.go else 'not needed'}: {mine.why}")
    got = collectives.broadcast(asdict(mine) if mine is not None else None, 0, att.rank, device=att.engine.device)
    return relayout.Proposal(**got)


def _commit_relayout(att: Attempt, proposal: Any, profiled: dict[str, Any]) -> None:
    """After the checkpoint: plan.json cut from the measured times (rank 0), and the event."""
    if att.rank == 0:
        profile = relayout.measured_profile(att.plan, att.layout, profiled, att.boundaries)
        cuts = relayout.cuts_for_all(att.plan, profile) if profile is not None else {}
        cuts[str(att.denv.nodes)] = proposal.boundaries
        record = {"job_id": att.denv.job_id, "attempt": att.denv.attempt, "step": att.step,
                  "nodes": att.denv.nodes, "from": att.boundaries, **proposal.record()}
        with grow.PLAN_WRITES:
            write_plan(relaid_out(att.plan, cuts, record), Path(att.plan["run_dir"]) / runfiles.PLAN)
        att.events.emit("relayout", step=att.step, nodes=att.denv.nodes, boundaries_from=att.boundaries,
                        boundaries_to=proposal.boundaries, step_s=round(proposal.step_s, 6),
                        predicted_step_s=round(proposal.predicted_step_s, 6),
                        gain_s=round(proposal.gain_s, 3), cost_s=round(proposal.cost_s, 3),
                        remaining=proposal.remaining)
    att.dist.barrier()


def _budgets(att: Attempt) -> decide.Budgets:
    return outcome.budgets(att.plan, att.denv.attempt, att.denv.job_id)


def _stopped(att: Attempt, stop: Stop) -> decide.Stopped:
    """The facts of the ranks' stop: Slurm is asked only what a signal leaves open (preempted
    or cancelled; whether Slurm requeues a preempted job itself), and, for a stop that may
    requeue, the cluster the requeued attempt's node count is decided from."""
    denv, steps = att.denv, int(att.plan["training"]["steps"])
    if denv.job_id is None or att.step >= steps or stop == Stop.RELAYOUT:
        return decide.Stopped(stop, att.step, steps)
    facts = _requeue_facts(att)
    if stop in (Stop.GROW, Stop.TIME):
        return decide.Stopped(stop, att.step, steps, requeue=facts)
    try:
        preempted: bool | None = slurm().being_preempted(denv.job_id, denv.attempt)
    except Exception as e:  # cannot ask Slurm: decide takes it for a preemption (requeue is the safe side)
        _log(denv.rank, f"cannot tell preemption from cancellation ({e}); assuming preemption")
        preempted = None
    return decide.Stopped(stop, att.step, steps, preempted=preempted,
                          slurm_requeues=preempted is not False and _slurm_requeues_preempted(), requeue=facts)


def _requeue_facts(att: Attempt) -> decide.RequeueFacts | None:
    """What decide needs for a requeued attempt's node count: the cluster (one Slurm query,
    asked only for a node range with several layouts), the job's nodes, a growth's target."""
    plan, denv = att.plan, att.denv
    if not decide.requeue_may_resize(plan):
        return None
    cpus = int(att.layout["tasks_per_node"]) * int(plan["cpus_per_task"])
    try:
        state = slurm().cluster_state()
    except Exception as e:   # cannot ask: the next attempt asks for what this one did
        return decide.RequeueFacts(plan, None, cpus_per_node=cpus, grow_to=att.grow_to, error=str(e))
    mine = frozenset(n for j in state.running if j.job_id == denv.job_id for n in j.nodes)
    return decide.RequeueFacts(plan, state, mine, cpus, att.grow_to)


def _ask_for_what_remains(att: Attempt) -> None:
    """[job] time_policy = "predicted": the requeued (pending) job's limit becomes the remaining
    prediction, from this attempt's own wall time per step (pipeswift_slurm.planning.limits)."""
    plan = att.plan
    started_step, started_at = att.trained_from
    done = att.step - started_step
    if plan["time_policy"] != "predicted" or not plan["signal_lead_s"] or done <= 0:
        return
    ckpt_s = float((plan["prediction"] or {}).get("checkpoint_cost_s") or 10.0)
    limit_s = limits.remaining(int(plan["training"]["steps"]) - att.step, (time.time() - started_at) / done,
                               att.setup_s, ckpt_s, int(plan["signal_lead_s"]), plan["time_written_s"])
    time_min_s = min(plan["time_min_s"], limit_s) if plan["time_min_s"] else None
    try:
        slurm().set_time_limit(str(att.denv.job_ref), limit_s, time_min_s)
        _log(att.rank, f"the next attempt asks for {limit_s // 60} min (what remains at "
                       f"{(time.time() - started_at) / done:.3g} s a step)")
    except Exception as e:   # the next attempt then has this one's limit
        _log(att.rank, f"could not set the next attempt's time limit to {limit_s // 60} min: {e}")


def _slurm_requeues_preempted() -> bool:
    try:
        return slurm().requeues_preempted_jobs()
    except Exception:  # cannot ask: requeue ourselves (at worst one attempt too many, never a lost job)
        return False


def _carry_out(att: Attempt, d: decide.Decision) -> None:
    """Rank 0, after the checkpoint is committed: requeue the job where Slurm will not (asking
    for the node count that can start soonest), and keep Slurm from requeueing a preempted job
    whose requeue budget is spent."""
    denv, job_id = att.denv, att.denv.job_ref
    if job_id is None:   # pswift run: no Slurm job to requeue
        return
    if d.exit_code == Exit.BUDGET_SPENT:
        _log(denv.rank, d.why)
    if d.requeue_by == "pswift":
        nodes, why = d.nodes, "; ".join(d.notes)
        _log(denv.rank, f"requeueing job {denv.job_id}" + (f" for {nodes} node(s) ({why})" if nodes else ""))
        outcome.requeue(att.plan, job_id, nodes=nodes, say=lambda m: _log(denv.rank, m))
        if d.reason == "preempted" and att.plan["time_policy"] == "predicted":
            # slurmctld refuses a preempted job's TimeLimit until its attempt has ended (job_mgr.c:
            # preempt_time, cleared in batch_requeue_fini), past this process's life
            _log(denv.rank, "Slurm keeps a preempted job's time limit until this attempt has ended: the next "
                            "attempt runs under this one's")
        else:
            _ask_for_what_remains(att)
    elif d.requeue_by == "slurm":
        _log(denv.rank, f"Slurm requeues preempted job {denv.job_id} itself")
    elif d.forbid_requeue:
        slurm().forbid_requeue(job_id)
