"""What every benchmark writes: its figures as JSON, with the command that produced them and
the table row made from them (bench/readme.py puts the rows into docs/benchmarks.md; a test checks the
table matches bench/results/)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def command_line() -> str:
    """How this benchmark was started, as one would type it from the checkout (no --out)."""
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        if not a.startswith("--out="):
            args.append(a)
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    version = os.environ.get("PSWIFT_SLURM_VERSION")  # set by scripts/with-slurm
    prefix = f"scripts/with-slurm {version} " if version else ""
    return prefix + shlex.join(["python", str(script), *args])


def median_interval(values: list[float], level: float = 0.9, draws: int = 4000) -> tuple[float, float]:
    """A bootstrap interval of the median of ``values``: the median of ``draws`` resamples (with
    replacement, a fixed seed), their central ``level`` share. Says what a run's rounds resolve."""
    import random
    import statistics
    rnd = random.Random(0)
    meds = sorted(statistics.median(rnd.choices(values, k=len(values))) for _ in range(draws))
    cut = int(draws * (1 - level) / 2)
    return meds[cut], meds[draws - 1 - cut]


def ratio_of_medians_interval(xs: list[float], ys: list[float], level: float = 0.9,
                              draws: int = 4000) -> tuple[float | None, float | None]:
    """A bootstrap interval of median(xs) / median(ys), the pairs (x, y) of one round resampled
    together (a fixed seed); (None, None) when a resample's median of ``ys`` is not above 0 (a
    ratio whose denominator may be 0 or below resolves nothing)."""
    import random
    import statistics
    rnd, pairs = random.Random(0), list(zip(xs, ys))
    ratios = []
    for _ in range(draws):
        pick = rnd.choices(pairs, k=len(pairs))
        below = statistics.median(y for _, y in pick)
        if below <= 0:
            return None, None
        ratios.append(statistics.median(x for x, _ in pick) / below)
    ratios.sort()
    cut = int(draws * (1 - level) / 2)
    return ratios[cut], ratios[draws - 1 - cut]


def save(out: str | Path, result: dict[str, Any], *, quick: bool, what: str, figures: str) -> None:
    """Write ``result`` to ``out`` with the command, the host and the table row."""
    result = {**result, "command": command_line(), "quick": quick,
              "host": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
              "date": _dt.datetime.now(_dt.timezone.utc).date().isoformat(),
              "readme": {"what": what, "figures": figures}}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(figures)
    print(f"wrote {path}")


#: the start of one bare DeepSpeed rank (``python -c PRELUDE + body``): argv = plan.json, rank,
#: world size, port, device ("cpu" or "cuda"), then the body's own (``sys.argv[6:]``). It builds
#: the plan's pipeline exactly as pswift's launcher does (its seeds, its DeepSpeed config) with
#: DeepSpeed's own engine, and leaves ``engine``, ``dist``, ``plan``, ``layout``, ``seed``, the
#: data source ``fn`` with its ``kwargs``, ``m`` micro-batches of ``mbs`` and ``started`` (the
#: process's first instant). A body ends with DS_RANK_EXIT. $BENCH_DS_CONFIG (JSON; run_deepspeed_ranks'
#: ``ds_config``), where set, adds to the DeepSpeed config.
DS_RANK_PRELUDE = r'''
import json, os, sys, time
started = time.time()
plan_path, rank, world, port, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=port, DS_ACCELERATOR=device)
import logging, torch, deepspeed
from deepspeed import comm as dist
from pipeswift_slurm.plan import parse_plan
from pipeswift_launch import data, ds_compat, rng
from pipeswift_launch.pipe import build_pipe
from pipeswift_launch.dsconfig import ds_config
plan = parse_plan(open(plan_path, "rb").read())
layout = plan["layouts"][str(world)]
ds_compat.skip_shm_build()
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
torch.set_num_threads(int(plan["cpus_per_task"]))
if device == "cuda":
    torch.cuda.set_device(rank)
deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
seed = int(plan["training"]["seed"])
rng.reseed(seed, 0, 0)
model = build_pipe(plan, layout)
rng.reseed(seed, 0, rank)
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config={**ds_config(plan, layout, sum(p.numel() for p in model.parameters())),
                                               **json.loads(os.environ.get("BENCH_DS_CONFIG", "{}"))})
fn, kwargs, m, mbs = data.source(plan), dict(plan["model"]["kwargs"]), layout["micro_batches"], layout["micro_batch_size"]
'''
DS_RANK_EXIT = """
from pipeswift_launch.hardexit import exit_now   # gloo's threads may abort the interpreter's teardown
exit_now(0)
"""


def run_deepspeed_ranks(body: str, plan: Path, world: int, device: str, *args: str, what: str,
                        ds_config: dict | None = None) -> None:
    """``world`` ranks of DS_RANK_PRELUDE + ``body`` on this host, on a free port, ``ds_config``
    added to the plan's DeepSpeed config; exits with the ranks' logs (``what`` failed) when any
    fails."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "launch")]),
           **({"BENCH_DS_CONFIG": json.dumps(ds_config)} if ds_config else {})}
    procs = [subprocess.Popen([sys.executable, "-c", DS_RANK_PRELUDE + body + DS_RANK_EXIT, str(plan), str(rank),
                               str(world), port, device, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
             for rank in range(world)]
    logs = [proc.communicate(timeout=1800)[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit(f"{what} failed:\n" + "\n".join(log[-2000:] for log in logs))
