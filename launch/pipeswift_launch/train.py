"""The training loop of one rank: build, resume, train, stop together, checkpoint, requeue."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from . import checkpoint as ckpt
from .dist_env import DistEnv
from .pipe import build_pipe, resolve
from .profile import PROFILE_STEPS, InstructionTimer, LayerProfiler
from .signals import STOP_NONE, STOP_TIME, requested
from .watchdog import Watchdog, end_attempt

class Events:
    """JSONL events of rank 0 in the run directory (other ranks write nothing)."""

    def __init__(self, run_dir: Path, enabled: bool, attempt: int, job_id: str | None) -> None:
        self.fh = open(run_dir / "events.jsonl", "a", encoding="utf-8") if enabled else None
        self.base = {"attempt": attempt, "job_id": job_id}

    def emit(self, event: str, **fields: Any) -> None:
        if self.fh is None:
            return
        rec = {"event": event, "time": round(time.time(), 3), **self.base, **fields}
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            os.fsync(self.fh.fileno())
            self.fh.close()


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"pswift: {msg}", flush=True)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def ds_config(plan: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    t = plan["training"]
    opt = {"type": "AdamW", "params": {"lr": 1e-3}}
    opt = _deep_merge(opt, t.get("optimizer") or {})
    opt["params"].setdefault("torch_adam", True)  # FusedAdam would JIT-compile for a minute on CPU
    cfg = {
        "train_batch_size": t["global_batch_size"],
        "train_micro_batch_size_per_gpu": layout["micro_batch_size"],
        "gradient_accumulation_steps": layout["micro_batches"],
        "optimizer": opt,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }
    if t.get("gradient_clipping"):
        cfg["gradient_clipping"] = t["gradient_clipping"]
    return _deep_merge(cfg, t.get("ds_config") or {})


def run(plan: dict[str, Any], denv: DistEnv, started: float | None = None) -> int:
    os.environ.update(denv.exports())
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if plan["device"] == "cuda" else "cpu")
    import deepspeed
    from deepspeed import comm as dist

    from . import ds_compat
    ds_compat.check_version()
    if plan["device"] != "cuda":
        ds_compat.skip_shm_build()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    torch.set_num_threads(int(plan.get("cpus_per_task") or 1))

    run_dir = Path(plan["run_dir"])
    rank = denv.rank
    events = Events(run_dir, rank == 0, denv.attempt, denv.job_id)
    layout = plan["layouts"].get(str(denv.nodes))
    if layout is None or layout["world_size"] != denv.world_size:
        msg = (f"the job got {denv.nodes} node(s) / {denv.world_size} tasks but plan.json has layouts "
               f"for {sorted(plan['layouts'], key=int)} nodes"
               + (f" ({plan['infeasible'][str(denv.nodes)]})" if str(denv.nodes) in plan.get("infeasible", {}) else ""))
        _log(rank, f"error: {msg}")
        events.emit("end", reason="failed", error=msg)
        events.close()
        return 2
    if denv.attempt > int(plan.get("max_requeues", 3)):
        msg = (f"attempt {denv.attempt} exceeds max_requeues = {plan['max_requeues']}: not training "
               f"again; raise [job] max_requeues and resubmit to continue from the last checkpoint")
        _log(rank, f"stopping: {msg}")
        events.emit("end", reason="requeue_budget", error=msg)
        events.close()
        return 3

    t0 = started or time.time()
    backend = "nccl" if plan["device"] == "cuda" else "gloo"
    if plan["device"] == "cuda":
        torch.cuda.set_device(denv.local_rank % max(1, torch.cuda.device_count()))
    deepspeed.init_distributed(dist_backend=backend)
    model = build_pipe(plan, layout)
    if plan["training"].get("gradient_clipping") and layout["stages"] > 1:
        ds_compat.mark_model_parallel(model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config(plan, layout))
    boundaries = [int(b) for b in engine.module.parts]
    device = engine.device
    ckpt_dir = Path(plan["training"]["checkpoint_dir"])
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        removed, aside = ckpt.remove_uncommitted(ckpt_dir)
        if removed:
            _log(rank, f"removed half-written checkpoint(s) {', '.join(removed)}")
            events.emit("checkpoint_discarded", names=removed)
        if aside:
            _log(rank, f"moved aside checkpoint(s) with an unusable manifest: {'; '.join(aside)}")
    dist.barrier()
    t_load = time.time()
    mid = model_id(plan)
    resumed_from = _resume(engine, ckpt_dir, mid, boundaries, layout, dist, denv)
    t_load = time.time() - t_load if resumed_from else 0.0
    step = int(engine.global_steps)
    setup_s = time.time() - t0
    events.emit("start", nodes=denv.nodes, world_size=denv.world_size, stages=layout["stages"],
                data_parallel=layout["data_parallel"], micro_batches=layout["micro_batches"],
                micro_batch_size=layout["micro_batch_size"], boundaries=boundaries,
                partition=layout["partition"], step=step, resumed_from=resumed_from,
                setup_s=round(setup_s, 3), load_s=round(t_load, 3))
    _log(rank, f"attempt {denv.attempt}: {layout['stages']} stage(s) x {layout['data_parallel']} "
               f"data-parallel on {denv.nodes} node(s), boundaries {boundaries}, m={layout['micro_batches']}, "
               f"from step {step}, setup {setup_s:.1f} s")

    t = plan["training"]
    data_fn = resolve(t["data"], plan["model"]["dir"])
    data_kwargs = dict(plan["model"].get("kwargs") or {})
    m, mbs, dp = layout["micro_batches"], layout["micro_batch_size"], layout["data_parallel"]
    dp_rank = engine.grid.data_parallel_id
    steps, interval = int(t["steps"]), int(t.get("checkpoint_interval") or 0)
    flag = torch.zeros(1, device=device)
    stop_code = STOP_NONE

    def save(reason: str) -> None:
        ts = time.time()
        meta = {"samples": int(engine.global_samples), "boundaries": boundaries, "model_id": mid,
                "stages": layout["stages"], "data_parallel": dp, "micro_batches": m,
                "world_size": denv.world_size, "data_position": step, "reason": reason,
                "job_id": denv.job_id, "attempt": denv.attempt}

        def gather(obj: Any) -> list[Any]:
            out: list[Any] = [None] * denv.world_size
            dist.all_gather_object(out, obj)
            return out

        path, phases = ckpt.save(engine, ckpt_dir, step, meta, gather, dist.barrier, rank)
        if rank == 0:
            ckpt.prune(ckpt_dir, int(t.get("keep_checkpoints") or 2))
        dur = time.time() - ts
        events.emit("checkpoint", step=step, path=str(path), seconds=round(dur, 3), reason=reason,
                    **{k: round(v, 4) for k, v in phases.items()})
        _log(rank, f"checkpoint {path.name} committed ({reason}) in {dur:.2f} s")

    dog = Watchdog(run_dir, rank, os.environ.get("SLURMD_NODENAME", "local"),
                   float(t.get("hang_timeout_factor", 10.0)), float(t.get("hang_timeout_min_s", 300.0)),
                   lambda info: end_attempt(run_dir, plan, denv, info))
    dog.start()
    profiler = LayerProfiler(engine.module, sync=plan["device"] == "cuda")
    timer = InstructionTimer(engine, sync=plan["device"] == "cuda")
    first = step  # the profiling window counts from this attempt's first step
    while step < steps:
        profiler.active = timer.active = (step + 1 - first) in PROFILE_STEPS
        batches = [data_fn(step=step, index=dp_rank * m + i, micro_batch_size=mbs, seed=int(t["seed"]),
                           **data_kwargs)
                   for i in range(m)]
        ts = time.time()
        loss = engine.train_batch(data_iter=iter(batches))
        dt = time.time() - ts
        if timer.active:
            timer.steps += 1
            timer.seconds["step"] += dt
        step = int(engine.global_steps)
        dog.beat(step, dt)
        if rank == 0:
            lv = float(loss.item())
            events.emit("step", step=step, loss=lv, loss_hex=lv.hex(), step_time=round(dt, 6))
            print(f"step {step}/{steps} loss {lv:.6f} ({dt * 1000:.1f} ms)", flush=True)
        if profiler.handles and (step - first == PROFILE_STEPS[-1] or step >= steps):
            _emit_profile(profiler, timer, engine, events, dist, denv.world_size, mbs, m, boundaries)
        # every rank, same point of every step: agree whether anyone was asked to stop
        flag.fill_(float(requested()))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop_code = int(flag.item())
        if stop_code or step >= steps or (interval and step % interval == 0):
            with dog.paused():
                save("signal" if stop_code else "final" if step >= steps else "periodic")
        if stop_code:
            break

    dog.stop()
    decision = [_ending(plan, denv, step, steps, stop_code) if rank == 0 else None]
    dist.broadcast_object_list(decision, src=0)  # one scontrol call, one decision for all ranks
    reason, requeue_by, rc = decision[0]
    events.emit("end", reason=reason, step=step, requeue=requeue_by is not None)
    events.close()
    _log(rank, f"attempt {denv.attempt} ended: {reason} at step {step}")
    dist.barrier()
    if rank == 0 and denv.job_id is not None:
        _requeue_or_not(denv, reason, requeue_by)
    dist.destroy_process_group()
    return rc


def model_id(plan: dict[str, Any]) -> str:
    """What a checkpoint records of the model that wrote it: entry point, arguments, layers."""
    import hashlib
    m = plan.get("model", {})
    blob = json.dumps([m.get("entry"), m.get("kwargs"), m.get("num_layers")], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resume(engine: Any, ckpt_dir: Path, mid: str, boundaries: list[int], layout: dict[str, Any],
            dist: Any, denv: DistEnv) -> str | None:
    """Load the newest committed checkpoint that every rank can load; on a corrupt file or
    another model's checkpoint, fall back to the previous one (all ranks together, one line
    each time). Returns the path loaded, None when there is none; raises when none loads."""
    first_error = None
    for path in reversed(ckpt.committed(ckpt_dir)):
        man, err = None, None
        try:
            man = ckpt.load(engine, path, mid, boundaries[-1])
        except ckpt.CheckpointError as e:
            err = str(e)
        errors: list[Any] = [None] * denv.world_size
        dist.all_gather_object(errors, err)  # fail together, or peers die in a collective
        problem = next((e for e in errors if e), None)
        if problem is None:
            _log(denv.rank, f"resumed from {path.name} (written by {man['stages']} stage(s) "
                            f"{man['boundaries']}) into {layout['stages']} stage(s) {boundaries}")
            return str(path)
        first_error = first_error or problem
        _log(denv.rank, f"cannot resume from {path.name}: {problem}; trying the previous committed checkpoint")
    if first_error is None:
        return None
    if denv.rank == 0:
        raise ckpt.CheckpointError(f"no committed checkpoint in {ckpt_dir} can be loaded: {first_error}")
    raise SystemExit(2)


def _emit_profile(profiler: LayerProfiler, timer: InstructionTimer, engine: Any, events: Events,
                  dist: Any, world: int, mbs: int, m: int, boundaries: list[int]) -> None:
    """Gather every stage's layer times and instruction times (data-parallel rank 0 of each)
    into one event."""
    mine = None
    if engine.grid.data_parallel_id == 0:
        mine = profiler.result()
        mine["instructions"] = {str(engine.stage_id): timer.result()}
    profiler.remove()
    timer.remove()
    allp: list[Any] = [None] * world
    dist.all_gather_object(allp, mine)
    merged: dict[str, Any] = {"seconds": {}, "param_bytes": {}, "activation_bytes": {}, "instructions": {}}
    samples = []
    for p in allp:
        if p:
            for k in merged:
                merged[k].update(p[k])
            samples.append(p["samples"])
    events.emit("layer_profile", micro_batch_size=mbs, micro_batches=m, boundaries=boundaries,
                samples=min(samples, default=0), **merged)


def _ending(plan: dict[str, Any], denv: DistEnv, step: int, steps: int,
            stop_code: int) -> tuple[str, str | None, int]:
    """(reason, who requeues the job: "pswift", "slurm" or None, exit code) of this attempt;
    rank 0 decides for all."""
    if step >= steps:
        return "completed", None, 0
    if denv.job_id is None:
        return ("time_limit" if stop_code == STOP_TIME else "stopped"), None, 0
    from pipeswift_slurm import slurm
    if stop_code == STOP_TIME:
        reason = "time_limit"
    else:
        try:
            reason = "preempted" if slurm.being_preempted(denv.job_id) else "cancelled"
        except Exception as e:  # cannot ask Slurm: assume preemption (requeue is the safe side)
            _log(denv.rank, f"cannot tell preemption from cancellation ({e}); assuming preemption")
            reason = "preempted"
    if reason == "cancelled":
        return reason, None, 0
    budget = int(plan.get("max_requeues", 3))
    if denv.attempt >= budget:
        _log(denv.rank, f"{reason} at step {step}, but this was attempt {denv.attempt} and "
                        f"max_requeues = {budget} is spent: not requeueing; raise [job] "
                        f"max_requeues and resubmit to continue from the checkpoint")
        return reason, None, 3
    # Slurm never requeues a timed-out job; a preempted one only from 24.05 on (slurm.py)
    return reason, "slurm" if reason == "preempted" and _slurm_requeues_preempted() else "pswift", 0


def _slurm_requeues_preempted() -> bool:
    from pipeswift_slurm import slurm
    try:
        return slurm.requeues_preempted_jobs()
    except Exception:  # cannot ask: requeue ourselves (at worst one attempt too many, never a lost job)
        return False


def _requeue_or_not(denv: DistEnv, reason: str, requeue_by: str | None) -> None:
    """After the checkpoint is committed: requeue the job where Slurm will not, and keep Slurm
    from requeueing a preempted job whose requeue budget is spent."""
    from pipeswift_slurm import slurm  # the one module that talks to Slurm
    if requeue_by == "pswift":
        _log(denv.rank, f"requeueing job {denv.job_id}")
        slurm.requeue(denv.job_id)
    elif requeue_by == "slurm":
        _log(denv.rank, f"Slurm requeues preempted job {denv.job_id} itself")
    elif reason == "preempted" and _slurm_requeues_preempted():
        slurm.forbid_requeue(denv.job_id)
