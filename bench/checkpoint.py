"""Checkpoint benchmark: signal -> committed checkpoint, and resume with another stage count.

For a ~100 MB model (tiny-gpt at hidden 1024, 2 blocks: 4 layers) trained locally with real
DeepSpeed on CPU (`pswift run`, no Slurm needed):

- save: SIGTERM after a few steps -> MANIFEST.json committed (wall clock seen from outside, and
  the in-job save time from the events), 2 stages;
- resume 2 -> 4 stages and 4 -> 2 stages: the in-job load time (``load_s`` of the start event);
- baseline, same run, same tensors: one plain ``torch.save`` (+fsync) / ``torch.load`` of the
  merged model + optimizer state. Ratios = pswift / baseline.

    python bench/checkpoint.py [--out bench/results/checkpoint.json] [--repeats 3]
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

ROOT = Path(__file__).resolve().parents[1]


def make_config(d: Path, ckpt: Path, steps: int, hidden: int = 1024) -> Path:
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
    t = t.replace("seed = 1", f'seed = 1\ncheckpoint_dir = "{ckpt}"')
    (d / "train.toml").write_text(t)
    return d / "train.toml"


def events(run: Path) -> list[dict]:
    f = run / "events.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def pswift_run(toml: Path, run: Path, nodes: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeswift_slurm.cli", "run", "--nodes", str(nodes),
                             "--run-dir", str(run), str(toml)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one_round(work: Path, hidden: int) -> dict:
    ckpt = work / "ckpt"
    toml = make_config(work / "cfg", ckpt, steps=1000, hidden=hidden)
    # 1) 2 stages, SIGTERM after 3 steps -> committed checkpoint
    run = work / "save"
    p = pswift_run(toml, run, 2)
    while sum(e["event"] == "step" for e in events(run)) < 3:
        if p.poll() is not None:
            raise SystemExit("training run failed; try `pswift run` on the config by hand")
        time.sleep(0.05)
    t_sig = time.time()
    p.send_signal(signal.SIGTERM)
    while not list(ckpt.glob("step_*/MANIFEST.json")):
        time.sleep(0.005)
    signal_to_commit = time.time() - t_sig
    p.wait()
    (saved,) = [e for e in events(run) if e["event"] == "checkpoint"]
    step = saved["step"]
    size = sum(f.stat().st_size for f in (ckpt / f"step_{step:08d}").glob("stage_*.pt"))

    # 2) resume 2 -> 4 stages (one more step, then a final checkpoint written by 4 stages)
    toml4 = make_config(work / "cfg", ckpt, steps=step + 1, hidden=hidden)
    r4 = work / "resume4"
    pswift_run(toml4, r4, 4).wait()
    load_2_to_4 = [e for e in events(r4) if e["event"] == "start"][0]["load_s"]
    # 3) resume 4 -> 2 stages
    toml2 = make_config(work / "cfg", ckpt, steps=step + 2, hidden=hidden)
    r2 = work / "resume2"
    pswift_run(toml2, r2, 2).wait()
    start2 = [e for e in events(r2) if e["event"] == "start"][0]
    assert start2["step"] == step + 1, start2
    load_4_to_2 = start2["load_s"]

    # baseline: the same tensors, one torch.save / torch.load
    import torch
    merged = {}
    for f in sorted((ckpt / f"step_{step + 1:08d}").glob("stage_*.pt")):
        blob = torch.load(f, weights_only=False)
        merged.update({"model." + k: v for k, v in blob["model"].items()})
        merged.update({"optim." + k: v for k, v in blob["optim"].items()})
    base = work / "baseline.pt"
    t0 = time.time()
    with open(base, "wb") as fh:
        torch.save(merged, fh)
        fh.flush()
        os.fsync(fh.fileno())
    torch_save = time.time() - t0
    t0 = time.time()
    torch.load(io.BytesIO(base.read_bytes()), weights_only=False)
    torch_load = time.time() - t0
    return {"checkpoint_bytes": size, "signal_to_commit_s": signal_to_commit,
            "in_job_save_s": saved["seconds"], "load_2_to_4_s": load_2_to_4,
            "load_4_to_2_s": load_4_to_2, "torch_save_s": torch_save, "torch_load_s": torch_load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "checkpoint.json"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a 2 MB model, one round (CI: the bench still runs)")
    args = ap.parse_args()
    if args.quick:
        args.repeats = 1
    hidden = 128 if args.quick else 1024
    rounds = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
            rounds.append(one_round(Path(tmp), hidden))
            print(f"round {i + 1}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                                 for k, v in rounds[-1].items()), flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    result = {
        "benchmark": "checkpoint", "repeats": args.repeats, "median": med, "rounds": rounds,
        "ratios": {
            "in_job_save_vs_torch_save": med["in_job_save_s"] / med["torch_save_s"],
            "signal_to_commit_vs_torch_save": med["signal_to_commit_s"] / med["torch_save_s"],
            "load_2_to_4_vs_torch_load": med["load_2_to_4_s"] / med["torch_load_s"],
            "load_4_to_2_vs_torch_load": med["load_4_to_2_s"] / med["torch_load_s"],
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"checkpoint {med['checkpoint_bytes'] / 1e6:.0f} MB (weights + Adam state)")
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.2f}x")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
