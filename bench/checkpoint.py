"""Checkpoint benchmark: signal -> committed checkpoint, and resume with another stage count.

For a ~100 MB model (tiny-gpt at hidden 1024, 2 blocks: 4 layers; 305 MB with Adam state)
trained locally with real DeepSpeed on CPU (`pswift run`, no Slurm needed), every round:

- save: SIGTERM right after a step -> MANIFEST.json committed, 2 stages. Seen from outside
  (signal -> commit: the step in flight, the stop consensus, both stages writing, the manifest)
  and inside (the checkpoint event's seconds: the save alone). The job's median step time is
  reported too: a signal waits for the step in flight, at most one step;
- resume 2 -> 4 stages and 4 -> 2 stages: the in-job load time (``load_s`` of the start event);
- periodic checkpoints (every 3 steps of an 8-step run) written in the background: how long
  training stalls for each (the state copied to host memory, the commit) against the
  signal's synchronous save;
- baseline, what a user training with DeepSpeed calls: the same job (the saving run's plan:
  layers, cut, data-parallel degree, DeepSpeed config) trained 3 steps by a bare DeepSpeed loop
  on as many ranks, then ``engine.save_checkpoint`` (every rank writing its files, as DeepSpeed
  does; timed from a barrier to a barrier, once as called and once with the ``sync`` that makes
  it as durable as pswift's fsynced files) and ``engine.load_checkpoint`` into the same layout
  (DeepSpeed reloads optimizer state only into the layout that wrote it); and the stop a
  DeepSpeed user writes for a signal, timed as pswift's is: SIGTERM to every rank once a step
  has ended and the page cache is flushed, a handler that sets a flag, the flag all-reduced at
  every step's end, ``engine.save_checkpoint`` at the step where it is set; signal -> saved on
  every rank, and -> synced (the headline ratio is against this, not the save alone);
- torch.distributed.checkpoint (DCP), as torchtitan checkpoints, in the same bare loop: every
  rank's module and optimizer state saved to one DCP folder (fsynced, as DCP does) and loaded
  back; and the background save's cost to training: the 5 steps after step 3 with DCP's
  ``async_save`` after steps 3 and 6 until the last write is done, against the same 5 steps with
  none (in the same process), per checkpoint; pswift's twin: steps 4-8 of an 8-step run with a
  periodic checkpoint every 3 steps (until its last commit) against the same steps of a run with
  none. Those two costs are differences of noisy times: their ratio is the ratio of their
  medians, with a bootstrap interval over the rounds;
- floor, same tensors (the merged model + optimizer state of a warm-up run): one plain
  ``torch.save`` (+ fsync) and ``torch.load`` in one process.

Two trainings, each against its own baseline: fp32 (2 stages on 2 nodes; resumes 2 -> 4 and
4 -> 2 stages) and bf16 + ZeRO-1 (2 stages x 2 data-parallel on 4 nodes: the fp32 master
weights and Adam state are sharded, each rank writing its own shard file; resumes into 2 x 1 on
2 nodes and back into 2 x 2 on 4).

Rounds alternate which goes first (the baselines or pswift), and the page cache's dirty data is
flushed (``sync``) and, when run as root, the clean page cache dropped before each timed write,
so neither pays for the other's writes (on this VM a write into never-used memory costs up to 4x
one into recycled page cache). Ratios are
medians of the per-round ratios, with their range.

    python bench/checkpoint.py [--repeats 5] [--quick] [--out bench/results/checkpoint.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


#: per training: (train.toml lines, [pipeline] lines, nodes of the saving run, the resumes:
#: (figure name, nodes) in order, each one step further than the last)
MODES = {
    "fp32": ("", "", 2, (("load_2_to_4_s", 4), ("load_4_to_2_s", 2))),
    "bf16_zero1": ('precision = "bf16"\nzero_stage = 1\n', "stages = 2\n", 4,
                   (("load_2x2_to_2x1_s", 2), ("load_2x1_to_2x2_s", 4))),
}


#: the modes whose resume into another layout DeepSpeed's universal checkpoint covers, and the
#: ranks of that resume (the mode's first): its conversion reads ZeRO's optimizer partitions,
#: which a plain fp32 optimizer does not write (DeepSpeed's pipeline reloads those per layer)
UNIVERSAL = {"bf16_zero1": 2}


def make_config(d: Path, ckpt: Path, steps: int, hidden: int = 1024, mode: str = "fp32") -> Path:
    shutil.copytree(ROOT / "examples" / "tiny-gpt", d, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    t = (d / "train.toml").read_text()
    t = re.sub(r"(?m)^nodes = .*$", "nodes = [2, 4]", t)
    t = re.sub(r"(?m)^num_layers = .*$", "num_layers = 4", t)
    t = re.sub(r"(?m)^kwargs = .*$", f"kwargs = {{ vocab = 96, hidden = {hidden}, heads = 8, blocks = 2, seq_len = 16 }}", t)
    t = re.sub(r"(?m)^layer_costs = .*$", "", t)   # the example's 6 layers' costs; this model has 4
    t = re.sub(r"(?m)^steps = .*$", f"steps = {steps}", t)
    t = re.sub(r"(?m)^global_batch_size = .*$", "global_batch_size = 8", t)
    t = re.sub(r"(?m)^micro_batch_size = .*$", "micro_batch_size = 2", t)
    t = re.sub(r"(?m)^checkpoint_interval = .*$", "checkpoint_interval = 0", t)
    t = t.replace("seed = 1", f'seed = 1\ncheckpoint_dir = "{ckpt}"\n{MODES[mode][0]}')
    if MODES[mode][1]:
        t = re.sub(r"(?m)^(stages|data_parallel) = .*$", "", t).replace("[pipeline]\n", "[pipeline]\n" + MODES[mode][1])
    (d / "train.toml").write_text(t)
    return d / "train.toml"


#: the DeepSpeed baseline's body after benchlib's DeepSpeed prelude: argv[6:] = checkpoint folder,
#: out.json. Trains 3 steps, saves with engine.save_checkpoint, loads it back, all timed between
#: barriers; rank 0 flushes (and, as root, drops) the page cache before each.
DS_SAVE = r'''
folder, out = sys.argv[6], sys.argv[7]
dp = engine.grid.data_parallel_id
for step in range(3):
    engine.train_batch(data_iter=iter([fn(step=step, index=dp * m + i, micro_batch_size=mbs, seed=seed, **kwargs) for i in range(m)]))
def drop_page_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
    except OSError:
        pass
def flushed():
    if rank == 0:
        drop_page_cache()
    dist.barrier()
flushed()
t0 = time.time()
engine.save_checkpoint(folder, tag="bench")
dist.barrier()
saved = time.time() - t0
if rank == 0:
    os.sync()
dist.barrier()
synced = time.time() - t0
flushed()
t0 = time.time()
engine.load_checkpoint(folder, tag="bench")
dist.barrier()
loaded = time.time() - t0
# torch.distributed.checkpoint (DCP), as torchtitan checkpoints: every rank's module and optimizer
# state in one DCP folder (files fsynced, as DCP's FileSystemWriter does by default), through a
# gloo group of its own (torchtitan gives async saves one: their collectives run beside training's)
import torch.distributed.checkpoint as dcp
side = torch.distributed.new_group(backend="gloo")
def dcp_state():
    return {"model": engine.module.state_dict(), f"optim_rank{rank}": engine.optimizer.state_dict()}
flushed()
t0 = time.time()
dcp.save(dcp_state(), checkpoint_id=folder + "-dcp", process_group=side)
dist.barrier()
dcp_saved = time.time() - t0
flushed()
t0 = time.time()
dcp.load(dcp_state(), checkpoint_id=folder + "-dcp", process_group=side)
dist.barrier()
dcp_loaded = time.time() - t0
# the background save's cost to training: steps 4-8 with DCP's async_save after steps 3 and 6
# (the pswift run's periodic checkpoints), until the last write is done, against the same
# number of steps with none, in this process
def window(first, saves):
    fut, t0 = None, time.time()
    for i in range(5):
        if i in saves:
            if fut is not None:
                fut.result()
            fut = dcp.async_save(dcp_state(), checkpoint_id=f"{folder}-async-{first + i}", process_group=side)
        engine.train_batch(data_iter=iter([fn(step=first + i, index=dp * m + j, micro_batch_size=mbs, seed=seed, **kwargs) for j in range(m)]))
    if fut is not None:
        fut.result()
    dist.barrier()
    return time.time() - t0
flushed()
clean = window(3, ())
flushed()
with_async = window(8, (0, 3))
# a DeepSpeed user's stop on SIGTERM, done well: the handler sets a flag, every step's end
# all-reduces it (a rank signalled a moment after a step's end must stop with the others), and
# the stop calls engine.save_checkpoint; signal -> saved on every rank (and synced). Rank 0
# signals every rank as the pswift side is signalled: once a step has ended, the page cache
# flushed (and dropped), half a second later
import signal, threading, torch.distributed as tdist
pids, asked, t_sig = [None] * world, [0.0], [0.0]
tdist.all_gather_object(pids, os.getpid())
signal.signal(signal.SIGTERM, lambda *_: asked.__setitem__(0, 1.0))
def signal_all():
    drop_page_cache()
    time.sleep(0.5)
    t_sig[0] = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
step, stop = 13, torch.zeros(1)
while not stop.item():
    engine.train_batch(data_iter=iter([fn(step=step, index=dp * m + j, micro_batch_size=mbs, seed=seed, **kwargs) for j in range(m)]))
    step += 1
    if rank == 0 and step == 16:
        threading.Thread(target=signal_all).start()
    step_end = time.time()
    stop[0] = asked[0]
    tdist.all_reduce(stop, op=tdist.ReduceOp.MAX)
engine.save_checkpoint(folder + "-signal", tag="signal")
dist.barrier()
signal_saved = time.time() - t_sig[0]
if rank == 0:
    os.sync()
dist.barrier()
signal_synced = time.time() - t_sig[0]
if rank == 0:
    size = sum(f.stat().st_size for f in __import__("pathlib").Path(folder, "bench").rglob("*") if f.is_file())
    with open(out, "w") as f:
        json.dump({"ds_save_s": saved, "ds_save_synced_s": synced, "ds_load_s": loaded, "ds_checkpoint_bytes": size,
                   "ds_signal_save_s": signal_saved, "ds_signal_save_synced_s": signal_synced,
                   "ds_signal_to_step_end_s": step_end - t_sig[0],
                   "dcp_save_s": dcp_saved, "dcp_load_s": dcp_loaded,
                   "dcp_async_cost_s": (with_async - clean) / 2, "dcp_window_clean_s": clean}, f)
'''


#: DeepSpeed's universal checkpoint's load, after benchlib's DeepSpeed prelude (the config with
#: checkpoint.load_universal): argv[6:] = checkpoint folder, out.json
DS_UNIVERSAL_LOAD = r'''
folder, out = sys.argv[6], sys.argv[7]
dist.barrier()
t0 = time.time()
engine.load_checkpoint(folder, tag="bench_universal")
dist.barrier()
if rank == 0:
    with open(out, "w") as f:
        json.dump({"ds_universal_load_s": time.time() - t0, "ds_universal_step": engine.global_steps}, f)
'''


def deepspeed_universal(plan: Path, folder: Path, world: int, out: Path) -> dict:
    """DeepSpeed's path to a resume in another layout (ZeRO's partitions resharded): the offline
    conversion of the saved checkpoint (``python -m deepspeed.checkpoint.ds_to_universal``, as
    its docs run it; ``--inject_missing_state``: a plain DeepSpeed job records no Megatron
    patterns), then ``load_checkpoint`` with ``load_universal`` on ``world`` ranks."""
    flush_dirty_pages()
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                    str(folder / "bench"), "--output_folder", str(folder / "bench_universal"), "--inject_missing_state"],
                   check=True, capture_output=True, cwd=ROOT)
    convert_s = time.time() - t0
    (folder / "latest_universal").write_text("bench_universal")
    flush_dirty_pages()
    benchlib.run_deepspeed_ranks(DS_UNIVERSAL_LOAD, plan, world, "cpu", str(folder), str(out),
                                 what="DeepSpeed universal checkpoint load",
                                 ds_config={"checkpoint": {"load_universal": True}})
    got = json.loads(out.read_text())
    if got.pop("ds_universal_step") != 3:
        raise SystemExit("DeepSpeed's universal load did not resume at step 3")
    return {"ds_universal_convert_s": convert_s, **got}


def deepspeed_baseline(plan: Path, work: Path, world: int, universal_into: int | None = None) -> dict:
    """DeepSpeed's own save_checkpoint / load_checkpoint of the job ``plan`` on ``world`` ranks;
    with ``universal_into``, its universal checkpoint's resume on that many ranks too."""
    out, folder = work / "ds.json", work / "ds-ckpt"
    benchlib.run_deepspeed_ranks(DS_SAVE, plan, world, "cpu", str(folder), str(out), what="DeepSpeed baseline")
    got = json.loads(out.read_text())
    if universal_into is not None:
        got.update(deepspeed_universal(plan, folder, universal_into, work / "ds-universal.json"))
    # what follows the step's end: the stop's consensus and the save (the wait for the step in
    # flight depends on where in a step the signal lands, a draw on either side)
    got["ds_step_end_to_save_s"] = got["ds_signal_save_s"] - got["ds_signal_to_step_end_s"]
    got["ds_step_end_to_synced_s"] = got["ds_signal_save_synced_s"] - got["ds_signal_to_step_end_s"]
    for f in work.glob(folder.name + "*"):
        shutil.rmtree(f, ignore_errors=True)
    return got


def events(run: Path) -> list[dict]:
    f = run / "events.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def pswift_run(toml: Path, run: Path, nodes: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeswift_slurm.cli.main", "run", "--nodes", str(nodes),
                             "--run-dir", str(run), str(toml)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def flush_dirty_pages() -> bool:
    """Write back dirty data and, where permitted (root), drop the clean page cache, so every
    timed write starts from the same state whatever ran before it; True when dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        dropped = True
    except OSError:
        dropped = False
    time.sleep(0.5)
    return dropped


def signal_and_commit(toml: Path, run: Path, ckpt: Path, nodes: int) -> dict:
    """SIGTERM right after step 3 is reported; wall clock until the manifest exists."""
    p = pswift_run(toml, run, nodes)
    while sum(e["event"] == "step" for e in events(run)) < 3:
        if p.poll() is not None:
            raise SystemExit("training run failed; try `pswift run` on the config by hand")
        time.sleep(0.02)
    dropped = flush_dirty_pages()
    t_sig = time.time()
    p.send_signal(signal.SIGTERM)
    while not list(ckpt.glob("step_*/MANIFEST.json")):
        time.sleep(0.002)
    signal_to_commit = time.time() - t_sig
    p.wait()
    evs = events(run)
    (saved,) = [e for e in evs if e["event"] == "checkpoint"]
    steps = [e["step_time"] for e in evs if e["event"] == "step"]
    size = sum(f.stat().st_size for f in (ckpt / f"step_{saved['step']:08d}").glob("stage_*"))
    (step_end,) = [e["time"] for e in evs if e["event"] == "step" and e["step"] == saved["step"]]
    return {"step": saved["step"], "checkpoint_bytes": size, "signal_to_commit_s": signal_to_commit,
            "signal_to_step_end_s": step_end - t_sig, "step_end_to_commit_s": t_sig + signal_to_commit - step_end,
            "in_job_save_s": saved["seconds"], "stage_write_s": saved["write_s"],
            "commit_s": saved["commit_s"], "step_s": statistics.median(steps),
            "page_cache_dropped": dropped}


def _window_s(run: Path) -> float:
    """Seconds from step 3's event to step 8's or to the last periodic checkpoint's commit,
    whichever came later (the steps the background writes overlap, and the writes themselves)."""
    evs = events(run)
    at = {e["step"]: e["time"] for e in evs if e["event"] == "step"}
    commits = [e["time"] for e in evs if e["event"] == "checkpoint" and e.get("background")]
    return max([at[8], *commits]) - at[3]


def background_stall(work: Path, hidden: int, mode: str) -> dict:
    """A run that checkpoints every 3 steps of 8: what its periodic checkpoints (written in the
    background) stall training, against the signal's synchronous save of the same state, and
    what they cost it: steps 4-8 and the writes against the same steps of the same job with no
    checkpoint (a run of its own, before it), per checkpoint."""
    windows = {}
    for every in (0, 3):
        ckpt = work / f"bg-ckpt-{every}"
        toml = make_config(work / f"bg-cfg-{every}", ckpt, steps=8, hidden=hidden, mode=mode)
        toml.write_text(toml.read_text().replace("checkpoint_interval = 0", f"checkpoint_interval = {every}"))
        flush_dirty_pages()
        pswift_run(toml, work / f"bg-run-{every}", MODES[mode][2]).wait()
        windows[every] = _window_s(work / f"bg-run-{every}")
    periodic = [e for e in events(work / "bg-run-3") if e["event"] == "checkpoint" and e.get("background")]
    if len(periodic) != 2:
        raise SystemExit(f"expected 2 background checkpoints, got {periodic}")
    return {"background_stall_s": statistics.median(e["seconds"] for e in periodic),
            "background_write_s": statistics.median(e["write_s"] for e in periodic),
            "background_cost_s": (windows[3] - windows[0]) / 2, "background_window_clean_s": windows[0]}


def resume_loads(work: Path, ckpt: Path, step: int, hidden: int, mode: str) -> dict:
    """The mode's resumes: each trains one step and writes a final checkpoint in its layout,
    which the next one loads."""
    out = {}
    for i, (name, nodes) in enumerate(MODES[mode][3]):
        upto = step + 1 + i
        toml = make_config(work / "cfg", ckpt, steps=upto, hidden=hidden, mode=mode)
        run = work / f"resume-{nodes}"
        pswift_run(toml, run, nodes).wait()
        start = [e for e in events(run) if e["event"] == "start"][0]
        assert start["step"] == upto - 1, start
        out[name] = start["load_s"]
    return out


def merged_state(step_dir: Path) -> dict:
    """Every tensor of a committed checkpoint in one dict (the baseline saves and loads this)."""
    sys.path.insert(0, str(ROOT / "launch"))
    from pipeswift_launch import ckptfiles as checkpoint
    state = checkpoint.read_all(step_dir)
    merged = {"model." + k: v for k, v in state["model"].items()}
    merged.update({"master." + k: v for k, v in state["master"].items()})
    merged.update({f"optim.{k}.{n}": v for k, s in state["optim"].items() for n, v in s.items()})
    return merged


def torch_baseline(state: dict, path: Path) -> dict:
    import torch
    flush_dirty_pages()
    t0 = time.time()
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    saved = time.time() - t0
    t0 = time.time()
    torch.load(io.BytesIO(path.read_bytes()), weights_only=False)
    return {"torch_save_s": saved, "torch_load_s": time.time() - t0}


def warm_up(hidden: int, mode: str, keep: Path) -> tuple[dict, Path]:
    """One unmeasured run: its checkpoint's tensors are torch.save's state, its plan (kept in
    ``keep``) the job DeepSpeed's baseline trains and saves."""
    with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
        work = Path(tmp)
        toml = make_config(work / "cfg", work / "ckpt", steps=1000, hidden=hidden, mode=mode)
        got = signal_and_commit(toml, work / "run", work / "ckpt", MODES[mode][2])
        # the plan, with its model folder kept beside it (this one goes with the temporary folder)
        plan = json.loads((work / "run" / "plan.json").read_text())
        plan["model"]["dir"] = str(shutil.copytree(work / "cfg", keep / f"cfg-{mode}",
                                                   ignore=shutil.ignore_patterns("__pycache__")))
        (keep / f"plan-{mode}.json").write_text(json.dumps(plan))
        return merged_state(work / "ckpt" / f"step_{got['step']:08d}"), keep / f"plan-{mode}.json"


def one_round(state: dict | None, hidden: int, baseline_first: bool, mode: str, plan: Path | None) -> dict:
    """One round; with no warm-up ``state`` and ``plan`` (quick), the baselines run after
    pswift's save, torch.save on this round's own checkpoint and DeepSpeed on its plan."""
    with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
        work = Path(tmp)
        first = baseline_first and state is not None and plan is not None
        base = {**torch_baseline(state, work / "baseline.pt"),
                **deepspeed_baseline(plan, work, MODES[mode][2], UNIVERSAL.get(mode))} if first else {}
        ckpt = work / "ckpt"
        got = signal_and_commit(make_config(work / "cfg", ckpt, steps=1000, hidden=hidden, mode=mode),
                                work / "save", ckpt, MODES[mode][2])
        if state is None:
            state = merged_state(ckpt / f"step_{got['step']:08d}")
        plan = plan or Path(shutil.copy(work / "save" / "plan.json", work / "plan.json"))
        loads = resume_loads(work, ckpt, got.pop("step"), hidden, mode)
        stall = background_stall(work, hidden, mode)
        if not base:
            base = {**torch_baseline(state, work / "baseline.pt"), **deepspeed_baseline(plan, work, MODES[mode][2],
                                                                                     UNIVERSAL.get(mode))}
        return {**got, **loads, **stall, **base, "baseline_first": first}


RATIOS = {  # name: (pswift figure, baseline figures summed); and one per resume of the mode
    "signal_to_commit_vs_deepspeed_save": ("signal_to_commit_s", ("ds_signal_save_s",)),
    "signal_to_commit_vs_deepspeed_save_synced": ("signal_to_commit_s", ("ds_signal_save_synced_s",)),
    "step_end_to_commit_vs_deepspeed_save": ("step_end_to_commit_s", ("ds_step_end_to_save_s",)),
    "step_end_to_commit_vs_deepspeed_save_synced": ("step_end_to_commit_s", ("ds_step_end_to_synced_s",)),
    "in_job_save_vs_deepspeed_save": ("in_job_save_s", ("ds_save_s",)),
    "in_job_save_vs_deepspeed_save_synced": ("in_job_save_s", ("ds_save_synced_s",)),
    "signal_to_commit_vs_torch_save_plus_step": ("signal_to_commit_s", ("torch_save_s", "step_s")),
    "in_job_save_vs_torch_save": ("in_job_save_s", ("torch_save_s",)),
    "signal_to_commit_vs_torch_save": ("signal_to_commit_s", ("torch_save_s",)),
    "background_stall_vs_sync_save": ("background_stall_s", ("in_job_save_s",)),
    "in_job_save_vs_dcp_save": ("in_job_save_s", ("dcp_save_s",)),
}
#: ratios of two differences, each of which may be near 0 or below: their medians' ratio, with a
#: bootstrap interval over the rounds (a per-round ratio of two noisy differences means nothing)
COSTS = {"background_cost_vs_dcp_async_cost": ("background_cost_s", "dcp_async_cost_s")}


def summarize(rounds: list[dict], mode: str) -> dict:
    ratios = {}
    loads = {f"{name[:-2]}_vs_torch_load": (name, ("torch_load_s",)) for name, _ in MODES[mode][3]}
    if "ds_universal_convert_s" in rounds[0]:   # the first resume against DeepSpeed's universal path
        first = MODES[mode][3][0][0]
        loads[f"{first[:-2]}_vs_deepspeed_universal"] = (first, ("ds_universal_convert_s", "ds_universal_load_s"))
    for name, (mine, base) in {**RATIOS, **loads}.items():
        per = [r[mine] / sum(r[b] for b in base) for r in rounds]
        lo, hi = benchlib.median_interval(per)
        ratios[name] = {"median": statistics.median(per), "lo": lo, "hi": hi, "min": min(per), "max": max(per)}
    for name, (mine, base) in COSTS.items():
        xs, ys = [r[mine] for r in rounds], [r[base] for r in rounds]
        lo, hi = benchlib.ratio_of_medians_interval(xs, ys)
        ratios[name] = {"median": _ratio(statistics.median(xs), statistics.median(ys)), "lo": lo, "hi": hi,
                        mine: statistics.median(xs), base: statistics.median(ys)}
    figures = [k for k, v in rounds[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {"median": {k: statistics.median(r[k] for r in rounds) for k in figures},
            "min": {k: min(r[k] for r in rounds) for k in figures},
            "max": {k: max(r[k] for r in rounds) for k in figures}, "ratios": ratios}


def _ratio(x: float, y: float) -> float | None:
    return x / y if y > 0 else None


#: how the figures name each training mode
TITLES = {"fp32": "fp32, 2 stages", "bf16_zero1": "bf16 + ZeRO-1, 2 stages × 2 dp"}


def _span(v: dict) -> str:
    """A ratio and its 90 % interval, as the table row says it ("n/a" where it resolves nothing)."""
    f = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    return f"{f(v['median'])}× ({f(v['lo'])}–{f(v['hi'])})"


def mode_figures(mode: str, s: dict) -> str:
    """One mode's sentence of the table row: against DeepSpeed's save and DCP's, then torch.save's floor."""
    r, m = s["ratios"], s["median"]
    span = lambda k: _span(r[k])  # noqa: E731
    loads = " and ".join(f"{span(name[:-2] + '_vs_torch_load')} ({name[5:-2].replace('_to_', ' → ')})"
                         for name, _ in MODES[mode][3])
    return (f"{TITLES[mode]} ({m['checkpoint_bytes'] / 1e6:.0f} MB): signal → commit {m['signal_to_commit_s']:.2f} s = "
            f"{span('signal_to_commit_vs_deepspeed_save')} a DeepSpeed loop's signal → save_checkpoint "
            f"({m['ds_signal_save_s']:.2f} s), {span('signal_to_commit_vs_deepspeed_save_synced')} of it synced "
            f"({m['ds_signal_save_synced_s']:.2f} s); from the step's end (the signal landed "
            f"{m['signal_to_step_end_s']:.2f} s and {m['ds_signal_to_step_end_s']:.2f} s before it) "
            f"{m['step_end_to_commit_s']:.2f} s = {span('step_end_to_commit_vs_deepspeed_save')} "
            f"({span('step_end_to_commit_vs_deepspeed_save_synced')} synced); save_checkpoint alone {m['ds_save_s']:.2f} s "
            f"({m['ds_save_synced_s']:.2f} s synced), the in-job save {m['in_job_save_s']:.2f} s = "
            f"{span('in_job_save_vs_deepspeed_save')} of it, {span('in_job_save_vs_deepspeed_save_synced')} synced, "
            f"{span('in_job_save_vs_torch_save')} one torch.save; loads into another layout {loads} one "
            f"torch.load (DeepSpeed's load into the same layout {m['ds_load_s']:.2f} s){_universal(mode, s)}; "
            f"a periodic checkpoint "
            f"in the background stalls training {m['background_stall_s']:.3f} s = "
            f"{span('background_stall_vs_sync_save')} the synchronous save and costs it "
            f"{m['background_cost_s']:.2f} s against DCP's async_save's {m['dcp_async_cost_s']:.2f} s "
            f"({span('background_cost_vs_dcp_async_cost')}); against DCP's save "
            f"({m['dcp_save_s']:.2f} s) the in-job save is {span('in_job_save_vs_dcp_save')}")


def _universal(mode: str, s: dict) -> str:
    """The first resume against DeepSpeed's universal checkpoint, where the mode has it."""
    first = MODES[mode][3][0][0]
    key, m = f"{first[:-2]}_vs_deepspeed_universal", s["median"]
    if key not in s["ratios"]:
        return ""
    return (f"; the resume {first[5:-2].replace('_to_', ' → ')} {m[first]:.2f} s = {_span(s['ratios'][key])} "
            f"DeepSpeed's universal checkpoint path (ds_to_universal {m['ds_universal_convert_s']:.2f} s "
            f"offline + load_universal {m['ds_universal_load_s']:.2f} s)")


def readme_figures(by_mode: dict[str, dict], rounds: int) -> str:
    return (f"medians of {rounds} alternated round(s), 90 % intervals: "
            + "; ".join(mode_figures(mode, s) for mode, s in by_mode.items()))


def measure(mode: str, hidden: int, repeats: int, quick: bool = False) -> tuple[dict, list[dict]]:
    """(summary, rounds) of one training mode, each round alternating who goes first (quick: one
    round, no warm-up run: the baselines save the round's own checkpoint and plan)."""
    with tempfile.TemporaryDirectory(prefix="pswift-bench-plan-") as tmp:
        state, plan = (None, None) if quick else warm_up(hidden, mode, Path(tmp))
        rounds = []
        for i in range(repeats):
            rounds.append(one_round(state, hidden, baseline_first=i % 2 == 1, mode=mode, plan=plan))
            print(f"{mode} round {i + 1}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                                        for k, v in rounds[-1].items()), flush=True)
    s = summarize(rounds, mode)
    for k, v in s["ratios"].items():
        print(f"{mode} {k}: {_span(v)}")
    return s, rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "checkpoint.json"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="fp32 alone (2 ranks a run: the bf16 mode's 4 cost CI a minute more for the same "
                         "code), a small model, one round, no warm-up (CI: the bench still runs)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"the trainings to measure, comma-separated (of {', '.join(MODES)})")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        ap.error(f"--modes {args.modes!r}: name one or more of {', '.join(MODES)}, comma-separated")
    repeats = 1 if args.quick else args.repeats
    hidden = 128 if args.quick else 1024
    by_mode = {}
    for mode in ("fp32",) if args.quick else modes:
        summary, rounds = measure(mode, hidden, repeats, args.quick)
        by_mode[mode] = {**summary, "rounds": rounds}
    first = next(iter(by_mode.values()))
    # the names, each with ratio = its median and its 90 % interval
    headline = {f"{mode} {name}": {**s["ratios"][key], "ratio": s["ratios"][key]["median"]}
                for mode, s in by_mode.items() for name, key in
                (("signal_commit/deepspeed_save", "signal_to_commit_vs_deepspeed_save"),
                 ("signal_commit/deepspeed_save_synced", "signal_to_commit_vs_deepspeed_save_synced"),
                 ("in_job_save/deepspeed_save", "in_job_save_vs_deepspeed_save"),
                 ("in_job_save/dcp_save", "in_job_save_vs_dcp_save"),
                 ("background_slowdown/dcp_async", "background_cost_vs_dcp_async_cost"),
                 *[("reshard_resume/deepspeed_universal", k) for k in s["ratios"] if k.endswith("_vs_deepspeed_universal")])}
    benchlib.save(args.out, {"benchmark": "checkpoint", "repeats": repeats, "modes": by_mode, "ratios": headline},
                  quick=args.quick,
                  what=f"a {first['median']['checkpoint_bytes'] / 1e6:.0f} MB checkpoint (model + Adam state): "
                       f"SIGTERM → committed checkpoint (outside: the step in flight, consensus, every rank "
                       f"writing, manifest; inside: the save alone) vs the same job's bare DeepSpeed loop on as "
                       f"many ranks, signalled alike, stopping at the step's end with `engine.save_checkpoint` "
                       f"(and that save alone); resumes into another stage count or data-parallel "
                       f"degree; one plain `torch.save` (+ fsync) / `torch.load` of the same tensors as a "
                       f"floor; torch.distributed.checkpoint's save and its async_save's cost to training "
                       f"against the background save's; the stall of a periodic checkpoint written in the "
                       f"background against the synchronous save; "
                       + " and ".join(TITLES[m].split(",")[0] for m in by_mode),
                  figures=readme_figures(by_mode, repeats))


if __name__ == "__main__":
    main()
