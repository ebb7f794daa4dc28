"""Checkpoint rules with real DeepSpeed, run locally (`pswift run`: same launcher, no Slurm)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PSWIFT, copy_example, pswift, run_events, slow_example

from pipeswift_slurm.codes import POSTED_BELOW_S

pytestmark = [pytest.mark.deepspeed]


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
    assert err and "written by another model" in err[0] and "step_00000002" in err[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_corrupt_stage_file_is_refused_with_the_fix(tmp_path):
    ckpt = tmp_path / "ckpt"
    a = with_ckpt(copy_example(tmp_path / "a", {"steps": "2", "checkpoint_interval": "0"}), ckpt)
    assert pswift("run", "--run-dir", str(tmp_path / "ra"), str(a)).returncode == 0
    f = ckpt / "step_00000002" / "stage_001.safetensors"
    data = bytearray(f.read_bytes())
    data[-100] ^= 0xFF  # same size: only the checksum can tell
    f.write_bytes(bytes(data))
    b = with_ckpt(copy_example(tmp_path / "b", {"steps": "4"}), ckpt)
    proc = pswift("run", "--run-dir", str(tmp_path / "rb"), str(b))
    assert proc.returncode != 0
    assert "no committed checkpoint in" in proc.stderr and "checksum mismatch (corrupt file)" in proc.stderr, proc.stderr[-3000:]


SAME_CUT = {"pipeline.partition": "[0, 3, 6]"}


@pytest.fixture(scope="module")
def committed_two(tmp_path_factory) -> Path:
    """The checkpoints of one run, committed at steps 1 and 2 (made once: each test that
    tampers with them works on its own copy)."""
    tmp = tmp_path_factory.mktemp("two-checkpoints")
    ckpt = tmp / "ckpt"
    # the example's cut, pinned: the resumes here load into the layout that wrote them, whatever a
    # measured profile in the stream's history would make the planner cut
    a = with_ckpt(copy_example(tmp / "a", {"steps": "2", "checkpoint_interval": "1", **SAME_CUT}), ckpt)
    assert pswift("run", "--run-dir", str(tmp / "ra"), str(a)).returncode == 0
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000001", "step_00000002"]
    return ckpt


@pytest.fixture
def two_checkpoints(tmp_path: Path, committed_two: Path) -> tuple[Path, Path]:
    """A copy of ``committed_two`` in this test's folder, and the TOML that resumes from it."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(committed_two, ckpt)
    return ckpt, with_ckpt(copy_example(tmp_path / "b", {"steps": "3", "checkpoint_interval": "0", **SAME_CUT}), ckpt)


def resume(tmp_path: Path, toml: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = pswift("run", "--run-dir", str(tmp_path / "rb"), str(toml))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, run_events(tmp_path / "rb")


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, two_checkpoints):
    ckpt, b = two_checkpoints
    f = ckpt / "step_00000002" / "stage_000.safetensors"
    data = bytearray(f.read_bytes())
    data[-100] ^= 0xFF
    f.write_bytes(bytes(data))
    proc, evs = resume(tmp_path, b)
    assert "cannot resume from step_00000002:" in proc.stdout and "checksum mismatch" in proc.stdout
    assert "resumed from step_00000001" in proc.stdout
    assert [e["step"] for e in evs if e["event"] == "start"] == [1]


def to_version_1(d: Path, evil: object = None) -> None:
    """Rewrite checkpoint ``d`` as manifest version 1 wrote it (torch.save pickles, SHA-256);
    with ``evil``, stage 1's file is a pickle of that object instead (its sums forged to match)."""
    import hashlib

    import torch
    from pipeswift_launch import stagefile
    man = json.loads((d / "MANIFEST.json").read_text())
    files = {}
    for s in range(man["stages"]):
        new = d / f"stage_{s:03d}.safetensors"
        blob = stagefile.read(new)
        old = d / f"stage_{s:03d}.pt"
        torch.save({"model": evil} if evil is not None and s == 1 else blob, old)
        new.unlink()
        data = old.read_bytes()
        files[old.name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (d / "MANIFEST.json").write_text(json.dumps({**man, "version": 1, "files": files}))


def test_a_version_1_checkpoint_still_resumes(tmp_path, two_checkpoints):
    ckpt, b = two_checkpoints
    to_version_1(ckpt / "step_00000002")
    proc, evs = resume(tmp_path, b)
    assert "resumed from step_00000002" in proc.stdout, proc.stdout[-2000:]
    assert [e["step"] for e in evs if e["event"] == "start"] == [2]


def test_generators_that_cannot_be_restored_are_seeded_and_said_so(tmp_path, two_checkpoints):
    """rng.json edited into something that is JSON with a valid checksum but no generator state:
    the run resumes with seeded generators and one line; a corrupt rng.json (checksum) makes
    the checkpoint unusable like any corrupt file."""
    import zlib
    ckpt, b = two_checkpoints
    d = ckpt / "step_00000002"
    saved = json.loads((d / "rng.json").read_text())
    saved["ranks"] = [{"torch": "AAAA", "numpy": [], "python": []} for _ in saved["ranks"]]
    blob = json.dumps(saved).encode()
    (d / "rng.json").write_bytes(blob)
    man = json.loads((d / "MANIFEST.json").read_text())
    man["files"]["rng.json"] = {"size": len(blob), "crc32": f"{zlib.crc32(blob):08x}"}
    (d / "MANIFEST.json").write_text(json.dumps(man))
    proc, evs = resume(tmp_path, b)
    assert "resumed from step_00000002" in proc.stdout, proc.stdout[-2000:]
    assert "cannot restore the saved random generators (" in proc.stdout, proc.stdout[-2000:]
    shutil.rmtree(ckpt / "step_00000003")   # the resumed run's own final checkpoint (step 1 is pruned)
    (d / "rng.json").write_bytes(blob[:-1] + b" ")   # same size, another checksum
    proc = pswift("run", "--run-dir", str(tmp_path / "again"), str(b))
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert "cannot resume from step_00000002" in proc.stdout and "rng.json: checksum mismatch" in proc.stdout
    assert "no committed checkpoint in" in proc.stdout + proc.stderr


def test_a_crafted_stage_file_runs_no_code(tmp_path, two_checkpoints):
    """A version-1 stage file rewritten to run code on unpickling, with a manifest forged to
    match it (sizes and sha256 are written by the same hand): torch.load(weights_only=True)
    refuses it, and the launcher falls back to the previous checkpoint."""
    ckpt, b = two_checkpoints
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    to_version_1(ckpt / "step_00000002", evil=Evil())
    proc, evs = resume(tmp_path, b)
    assert not marker.exists()
    assert "cannot be loaded safely" in proc.stdout and "resumed from step_00000001" in proc.stdout


def test_a_stage_file_that_is_not_safetensors_is_refused(tmp_path, two_checkpoints):
    """Garbage with a matching checksum (a forged manifest): the safetensors reader refuses it."""
    import zlib
    ckpt, b = two_checkpoints
    d = ckpt / "step_00000002"
    junk = (10**12).to_bytes(8, "little") + b'{"model/0.weight": {"dtype": "F32"}}' * 10
    (d / "stage_001.safetensors").write_bytes(junk)
    man = json.loads((d / "MANIFEST.json").read_text())
    man["files"]["stage_001.safetensors"] = {"size": len(junk), "crc32": f"{zlib.crc32(junk):08x}"}
    (d / "MANIFEST.json").write_text(json.dumps(man))
    proc, evs = resume(tmp_path, b)
    assert "is not a readable stage file" in proc.stdout and "resumed from step_00000001" in proc.stdout


def test_an_unreadable_manifest_is_moved_aside_never_deleted(tmp_path, two_checkpoints):
    ckpt, b = two_checkpoints
    man_path = ckpt / "step_00000002" / "MANIFEST.json"
    man = json.loads(man_path.read_text())
    man_path.write_text(json.dumps({**man, "version": 99}))
    proc, evs = resume(tmp_path, b)
    aside = ckpt / "unreadable-step_00000002"
    assert aside.is_dir() and sorted(p.name for p in aside.glob("stage_*")) == ["stage_000.safetensors", "stage_001.safetensors"]
    assert "manifest version 99" in (aside / "WHY").read_text()
    assert "moved aside" in proc.stdout and [e["step"] for e in evs if e["event"] == "start"] == [1]


def test_sigterm_to_a_local_run_stops_every_rank_at_one_step_with_a_checkpoint(tmp_path):
    toml = copy_example(tmp_path / "ex", {"steps": "100000", "checkpoint_interval": "0"})
    run = tmp_path / "run"
    p = subprocess.Popen([*PSWIFT, "run", "--run-dir", str(run), str(toml)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while sum(e["event"] == "step" for e in run_events(run)) < 3:
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out[-3000:]
    (end,) = [e for e in run_events(run) if e["event"] == "end"]
    (ck,) = [e for e in run_events(run) if e["event"] == "checkpoint"]
    assert end["reason"] == "stopped" and ck["reason"] == "signal" and ck["step"] == end["step"]
    man = json.loads((run / "checkpoints" / f"step_{end['step']:08d}" / "MANIFEST.json").read_text())
    assert man["step"] == end["step"] and man["stages"] == 2 and man["boundaries"] == [0, 3, 6]
    assert sorted(man["files"]) == ["rng.json", "stage_000.safetensors", "stage_001.safetensors"]
    assert all(len(v["crc32"]) == 8 and v["size"] > 0 for v in man["files"].values())


def _mid_step(run: Path) -> int:
    """The last step ended, once the next is well under way (0.2 s after that step's event
    was seen, with no step ended since)."""
    deadline = time.time() + 60
    while time.time() < deadline:
        steps = [e["step"] for e in run_events(run, torn_ok=True) if e["event"] == "step"]
        time.sleep(0.2)
        if steps and steps[-1] == [e["step"] for e in run_events(run, torn_ok=True) if e["event"] == "step"][-1]:
            return steps[-1]
    raise AssertionError(f"no step under way for 0.2 s within 60 s: {run_events(run, torn_ok=True)[-3:]}")


def test_a_signal_every_rank_gets_within_a_step_stops_at_its_end_though_flags_are_posted(tmp_path):
    """Steps under POSTED_BELOW_S agree on their flags a step late; a SIGTERM that reaches every
    rank during one step (as Slurm signals every task at once) still stops at that step's end
    (StepFlags.early), not the next one's."""
    toml = slow_example(tmp_path / "ex", {"steps": "100000", "checkpoint_interval": "0"}, sleep_s=0.15)
    run = tmp_path / "run"
    p = subprocess.Popen([*PSWIFT, "run", "--run-dir", str(run), str(toml)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while sum(e["event"] == "step" for e in run_events(run, torn_ok=True)) < 3:
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.1)
    last = _mid_step(run)      # ~0.6 s a step (4 micro-batches sleeping 0.15 s): inside the next
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out[-3000:]
    evs = run_events(run)
    # the flags were posted (the first step, warming up, may take longer on a busy host: it is
    # not near the signal)
    assert max(e["step_time"] for e in evs if e["event"] == "step" and e["step"] > 1) < POSTED_BELOW_S
    (ck,) = [e for e in evs if e["event"] == "checkpoint"]
    assert ck["reason"] == "signal" and ck["step"] == last + 1, (last, ck)


def test_a_resumed_attempt_profiles_its_layers_too(tmp_path):
    ckpt = tmp_path / "ckpt"
    a = with_ckpt(copy_example(tmp_path / "a", {"steps": "2", "checkpoint_interval": "0"}), ckpt)
    assert pswift("run", "--run-dir", str(tmp_path / "ra"), str(a)).returncode == 0
    b = with_ckpt(copy_example(tmp_path / "b", {"steps": "7", "checkpoint_interval": "0"}), ckpt)
    assert pswift("run", "--run-dir", str(tmp_path / "rb"), str(b)).returncode == 0
    evs = run_events(tmp_path / "rb")
    assert [e["step"] for e in evs if e["event"] == "start"] == [2]
    (prof,) = [e for e in evs if e["event"] == "layer_profile"]
    assert sorted(prof["seconds"], key=int) == [str(i) for i in range(6)]
    assert all(v > 0 for v in prof["seconds"].values())
    # each stage's compute passes: their CPU time beside their wall time, never more than it
    assert sorted(prof["instructions"]) == ["0", "1"]
    for ins in prof["instructions"].values():
        for name in ("ForwardPass", "BackwardPass"):
            assert 0 < ins[f"{name}:cpu"] <= ins[name] + 1e-3, ins
        assert "SendActivation:cpu" not in ins and "WeightPass:cpu" not in ins


SLOW_DATA = '''
import time
from model import batch as _batch


def batch(**kw):
    time.sleep(0.06)
    return _batch(**kw)
'''


def test_a_periodic_checkpoint_is_written_in_the_background_and_counts_only_once_committed(tmp_path):
    """Each stage file of step 12 takes 6 s more to write (the fault hook) while steps take
    ~0.3 s: training goes on meanwhile, and the checkpoint is committed at a later step's end,
    once every file is on disk. The one due at step 16 waits for that commit rather than
    training waiting for the write; a run resumed from a background checkpoint has the
    uninterrupted run's losses. How many steps the write spans is the host's: CI's three
    streams on two cores ran ~1 s steps, so 4 s of writing ended at step 16's own end, where
    nothing was left to wait for. The rule holds either way: the next periodic checkpoint comes
    at the first due step at or after the commit, and 16's is deferred whenever the commit
    came later."""
    ckpt = tmp_path / "ckpt"

    def config(d):
        toml = with_ckpt(copy_example(d, {"steps": "30", "checkpoint_interval": "4"}), ckpt)
        (toml.parent / "slow.py").write_text(SLOW_DATA)
        toml.write_text(toml.read_text().replace('data = "model:batch"', 'data = "slow:batch"'))
        return toml
    run = tmp_path / "run"
    proc = pswift("run", "--run-dir", str(run), str(config(tmp_path / "a")),
                  env={"PSWIFT_FAULT_SLOW_CHECKPOINT": "12:6"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    evs = run_events(run)
    saved = [e for e in evs if e["event"] == "checkpoint"]
    (c12,) = [e for e in saved if e["step"] == 12]
    assert c12["background"] is True and c12["reason"] == "periodic"
    assert c12["write_s"] >= 2 and c12["seconds"] < 1.0, c12      # training stalled far less than the write
    later = [e for e in evs if e["event"] == "step" and e["step"] > 12 and e["time"] < c12["time"]]
    assert len(later) >= 3, "steps did not go on while step 12's checkpoint was being written"
    periodic = [e for e in saved if e["reason"] == "periodic"]
    after = min(e["step"] for e in periodic if e["step"] > 12)
    committed_at = 12 + len(later)      # the step at whose end step 12's checkpoint was committed
    if committed_at < 16:       # committed before 16 was due: nothing to defer
        assert after == 16, (after, committed_at)
    else:                       # 16's (or 20's) waits for the commit, then comes at once
        assert committed_at <= after <= committed_at + 1, (after, committed_at)
    assert all(e["seconds"] < 1.0 for e in periodic), periodic
    final = [e for e in saved if e["reason"] == "final"]
    assert final and final[0]["background"] is False
    shutil.rmtree(ckpt / "step_00000030")     # resume from the newest background checkpoint
    newest = max(e["step"] for e in periodic)
    again = tmp_path / "again"
    assert pswift("run", "--run-dir", str(again), str(config(tmp_path / "b"))).returncode == 0
    start = next(e for e in run_events(again) if e["event"] == "start")
    assert start["resumed_from"] == str(ckpt / f"step_{newest:08d}")
    got = {e["step"]: e["loss_hex"] for e in run_events(again) if e["event"] == "step"}
    want = {e["step"]: e["loss_hex"] for e in evs if e["event"] == "step"}
    assert sorted(got) == list(range(newest + 1, 31)) and all(got[s] == want[s] for s in got)


def test_a_background_checkpoint_one_rank_cannot_write_fails_every_rank_promptly(tmp_path):
    """Step 8's checkpoint: the last stage's writer finds the disk full (the fault hook). Its
    thread still meets the others at the commit, so none waits for it: the checkpoint is not
    committed and the run ends with the error within a few steps (before, the others' threads
    waited for it for good: no checkpoint was ever started again, and the error came out only
    at the end of training), and step 4's checkpoint stays."""
    ckpt = tmp_path / "ckpt"
    toml = with_ckpt(copy_example(tmp_path / "ex", {"steps": "100", "checkpoint_interval": "4"}), ckpt)
    t0 = time.time()
    proc = pswift("run", "--run-dir", str(tmp_path / "run"), str(toml), env={"PSWIFT_FAULT_FAIL_CHECKPOINT": "8"},
                  timeout=120)
    assert proc.returncode != 0 and time.time() - t0 < 120, proc.stderr[-3000:]
    assert "No space left on device" in proc.stdout + proc.stderr
    assert (ckpt / "step_00000004" / "MANIFEST.json").is_file()
    assert not (ckpt / "step_00000008" / "MANIFEST.json").exists()
    # ended while the others' writes finished (a few steps on a busy host), far from step 100
    assert max(e["step"] for e in run_events(tmp_path / "run") if e["event"] == "step") <= 30
