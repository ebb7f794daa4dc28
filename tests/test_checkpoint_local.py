"""Checkpoint rules with real DeepSpeed, run locally (`pswift run`: same launcher, no Slurm)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PSWIFT, copy_example, pswift

pytestmark = [pytest.mark.deepspeed]


def events(run: Path) -> list[dict]:
    f = run / "events.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def with_ckpt(toml: Path, ckpt: Path) -> Path:
    toml.write_text(toml.read_text().replace("seed = 1", f'seed = 1\ncheckpoint_dir = "{ckpt}"'))
    return toml


def test_a_checkpoint_of_another_model_is_refused_clearly(tmp_path):
    ckpt = tmp_path / "ckpt"
    a = with_ckpt(copy_example(tmp_path / "a", {"steps": "2", "checkpoint_interval": "0"}), ckpt)
    assert pswift("run", "--run-dir", str(tmp_path / "ra"), str(a)).returncode == 0
    b = with_ckpt(copy_example(tmp_path / "b", {"steps": "4", "num_layers": "7",
                                                "kwargs": "{ vocab = 96, hidden = 128, heads = 4, blocks = 5, seq_len = 32 }",
                                                "layer_costs": "[0.001, 0.005, 0.005, 0.005, 0.005, 0.005, 0.001]"}), ckpt)
    proc = pswift("run", "--run-dir", str(tmp_path / "rb"), str(b))
    assert proc.returncode != 0
    err = [x for x in proc.stderr.splitlines() if x.startswith("pswift-launch: error:")]
    assert err and "does not match the model" in err[0] and "step_00000002" in err[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_corrupt_stage_file_is_refused_with_the_fix(tmp_path):
    ckpt = tmp_path / "ckpt"
    a = with_ckpt(copy_example(tmp_path / "a", {"steps": "2", "checkpoint_interval": "0"}), ckpt)
    assert pswift("run", "--run-dir", str(tmp_path / "ra"), str(a)).returncode == 0
    f = ckpt / "step_00000002" / "stage_001.pt"
    data = bytearray(f.read_bytes())
    data[-100] ^= 0xFF  # same size: only the checksum can tell
    f.write_bytes(bytes(data))
    b = with_ckpt(copy_example(tmp_path / "b", {"steps": "4"}), ckpt)
    proc = pswift("run", "--run-dir", str(tmp_path / "rb"), str(b))
    assert proc.returncode != 0
    assert "checksum mismatch (corrupt file); delete" in proc.stderr, proc.stderr[-3000:]


def test_sigterm_to_a_local_run_stops_every_rank_at_one_step_with_a_checkpoint(tmp_path):
    toml = copy_example(tmp_path / "ex", {"steps": "100000", "checkpoint_interval": "0"})
    run = tmp_path / "run"
    p = subprocess.Popen([*PSWIFT, "run", "--run-dir", str(run), str(toml)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while sum(e["event"] == "step" for e in events(run)) < 3:
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out[-3000:]
    (end,) = [e for e in events(run) if e["event"] == "end"]
    (ck,) = [e for e in events(run) if e["event"] == "checkpoint"]
    assert end["reason"] == "stopped" and ck["reason"] == "signal" and ck["step"] == end["step"]
    man = json.loads((run / "checkpoints" / f"step_{end['step']:08d}" / "MANIFEST.json").read_text())
    assert man["step"] == end["step"] and man["stages"] == 2 and man["boundaries"] == [0, 3, 6]
    assert sorted(man["files"]) == ["stage_000.pt", "stage_001.pt"]
    assert all(len(v["sha256"]) == 64 and v["size"] > 0 for v in man["files"].values())


def test_a_resumed_attempt_profiles_its_layers_too(tmp_path):
    ckpt = tmp_path / "ckpt"
    a = with_ckpt(copy_example(tmp_path / "a", {"steps": "2", "checkpoint_interval": "0"}), ckpt)
    assert pswift("run", "--run-dir", str(tmp_path / "ra"), str(a)).returncode == 0
    b = with_ckpt(copy_example(tmp_path / "b", {"steps": "7", "checkpoint_interval": "0"}), ckpt)
    assert pswift("run", "--run-dir", str(tmp_path / "rb"), str(b)).returncode == 0
    evs = events(tmp_path / "rb")
    assert [e["step"] for e in evs if e["event"] == "start"] == [2]
    (prof,) = [e for e in evs if e["event"] == "layer_profile"]
    assert sorted(prof["seconds"], key=int) == [str(i) for i in range(6)]
    assert all(v > 0 for v in prof["seconds"].values())
