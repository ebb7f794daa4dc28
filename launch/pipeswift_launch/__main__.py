"""``python -m pipeswift_launch PLAN.json``: one rank of a pipeswift job."""

from __future__ import annotations

import os
import sys
import time
import traceback

from pipeswift_slurm.codes import Exit   # imports nothing: safe before the signal handlers


def main(argv: list[str] | None = None) -> int:
    started = time.time()  # setup counts from here: imports, process group, model, checkpoint load
    # before anything slow: an early SIGTERM must set the flag, not kill the rank
    from . import signals
    signals.install()
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipeswift_launch RUN_DIR/plan.json", file=sys.stderr)
        return Exit.REFUSED
    from . import launchrec   # after the signal handlers (as the imports below)
    rank = int(os.environ.get("SLURM_PROCID") or os.environ.get("RANK") or 0)
    launchrec.began(rank)   # the node this rank runs on, for launchwatch
    try:
        # here, not at the top: an install without the training side ends with one line below
        from pipeswift_slurm.errors import PswiftError
        from pipeswift_slurm.plan import for_partition, read_plan, runnable

        from .ckptfiles import CheckpointError
        from .dist_env import LaunchEnvError, derive
        from .ds_compat import DeepSpeedVersionError
    except ModuleNotFoundError as e:   # a login-only install: one line, and no retry of it
        print(f"pswift-launch: error: this Python ({sys.executable}) cannot import {e.name}: install "
              f"pipeswift-slurm's training side (pip install 'pipeswift-slurm[train]') or set [job] python",
              file=sys.stderr, flush=True)
        launchrec.exited(rank, Exit.REFUSED)
        return Exit.REFUSED
    try:
        plan = for_partition(runnable(read_plan(argv[0]), argv[0]), os.environ.get("SLURM_JOB_PARTITION"))
        denv = derive(os.environ)
        os.environ.setdefault("OMP_NUM_THREADS", str(plan["cpus_per_task"]))
        from .train import run   # torch and DeepSpeed: after the plan is read and found runnable
        rc = run(plan, denv, started)
    except (PswiftError, LaunchEnvError, CheckpointError, DeepSpeedVersionError) as e:
        print(f"pswift-launch: error: {e}", file=sys.stderr, flush=True)
        rc = Exit.REFUSED
    except Exception as e:  # the job log keeps the traceback; the last line says what failed
        traceback.print_exc()
        error = f"{type(e).__name__}: {' '.join(str(e).split())}"
        train = sys.modules.get(f"{__package__}.train")
        step = getattr(train, "progress", {}).get("step") if train is not None else None
        print(f"pswift-launch: rank {rank} failed" + (f" at step {step}" if step is not None else "")
              + f": {error}", file=sys.stderr, flush=True)
        launchrec.raised(rank, step, error)   # the batch script's helper tells a bug from a fault
        return Exit.FAILED
    launchrec.exited(rank, rc)
    return rc


if __name__ == "__main__":
    # Everything is committed by now (events closed, checkpoints fsynced, process group
    # destroyed): end without the interpreter's teardown, which gloo's threads can abort.
    from .hardexit import exit_now
    exit_now(main())
