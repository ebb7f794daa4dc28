"""Manifest version 3 without a training run: each data-parallel rank's ZeRO shard file is listed,
checked and read back whole through checkpoint.read_stage / read_all."""

from __future__ import annotations

import json
import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
from pipeswift_launch import ckptfiles as checkpoint, stagefile  # noqa: E402
from helpers import blob_of, zero_partitions  # noqa: E402


def sharded_checkpoint(d, dp: int = 2):
    """A committed 1-stage checkpoint as a bf16 + ZeRO-1 job on ``dp`` ranks writes it, and the
    master weights and moments it holds."""
    whole, parts = zero_partitions([5, 3, 7], [1, 0, 2], dp)
    d.mkdir()
    files = {}
    blob = blob_of({name: m.bfloat16() for name, (m, _) in whole.items()})
    blob["optim"] = {name: {"step": 3} for name in whole}
    size, crc = stagefile.write(d / "stage_000.safetensors", blob)
    files["stage_000.safetensors"] = {"size": size, "crc32": crc}
    for r in range(dp):
        name = checkpoint.shard_file(0, r)
        size, crc = stagefile.write_shard(d / name, parts[r], r)
        files[name] = {"size": size, "crc32": crc}
    man = {"version": 3, "step": 4, "samples": 32, "stages": 1, "data_parallel": dp, "boundaries": [0, 3],
           "files": files}
    (d / "MANIFEST.json").write_text(json.dumps(man))
    return whole, man


def test_every_ranks_shard_is_read_back_into_whole_parameters(tmp_path):
    whole, man = sharded_checkpoint(tmp_path / "step_00000004")
    assert checkpoint.manifest_problem(man) is None
    assert checkpoint.shard_files(man, 0) == ["stage_000.zero_000.safetensors", "stage_000.zero_001.safetensors"]
    state = checkpoint.read_all(tmp_path / "step_00000004")
    for name, (m, avg) in whole.items():
        assert torch.equal(state["master"][name], m) and torch.equal(state["optim"][name]["exp_avg"], avg)
        assert state["optim"][name]["step"] == 3 and state["model"][name].dtype == torch.bfloat16
    one = checkpoint.read_stage(tmp_path / "step_00000004", man, 0, {"1.weight"})
    assert set(one["master"]) == {"1.weight"}


@pytest.mark.parametrize("change,why", [
    (lambda m: m.update(version=2), "malformed"),                          # shards are version 3's
    (lambda m: m["files"].pop("stage_000.zero_000.safetensors"), "not numbered 0 to 0"),
    (lambda m: m["files"].update({"stage_004.zero_000.safetensors": m["files"]["stage_000.safetensors"]}),
     "a stage the checkpoint does not have"),
])
def test_a_manifest_with_shards_that_do_not_add_up_is_refused(tmp_path, change, why):
    _, man = sharded_checkpoint(tmp_path / "c")
    change(man)
    assert why in checkpoint.manifest_problem(man)


def test_a_shard_file_that_lost_a_parameter_is_a_checkpoint_error(tmp_path):
    d = tmp_path / "step_00000004"
    _, man = sharded_checkpoint(d, dp=1)
    # rank 0's file rewritten without the parameter "2.weight" (another model's shard, say)
    _, parts = zero_partitions([5, 3], [1, 0], 1)
    size, crc = stagefile.write_shard(d / "stage_000.zero_000.safetensors", parts[0], 0)
    man["files"]["stage_000.zero_000.safetensors"] = {"size": size, "crc32": crc}
    (d / "MANIFEST.json").write_text(json.dumps(man))
    with pytest.raises(checkpoint.CheckpointError, match="hold no master weights for 2.weight"):
        checkpoint.read_all(d)
    junk = b"not a shard"
    (d / "stage_000.zero_000.safetensors").write_bytes(junk)
    man["files"]["stage_000.zero_000.safetensors"] = {"size": len(junk), "crc32": f"{zlib.crc32(junk):08x}"}
    (d / "MANIFEST.json").write_text(json.dumps(man))
    with pytest.raises(checkpoint.CheckpointError, match="not a readable ZeRO shard file"):
        checkpoint.read_all(d)


def test_a_background_copy_reuses_the_last_checkpoints_host_memory():
    state = ({None: torch.arange(6.0), "exp_avg": torch.ones(6)}, [torch.zeros(2, 3)], {"step": 3, "lr": 0.1})
    first = checkpoint._snapshot(state)
    state[0][None].add_(1)                     # training changes the originals after the copy
    assert torch.equal(first[0][None], torch.arange(6.0))
    again = checkpoint._snapshot(state, first)
    assert again[0][None] is first[0][None] and torch.equal(again[0][None], torch.arange(6.0) + 1)
    assert again[1][0] is first[1][0] and again[2] == {"step": 3, "lr": 0.1}
    grown = ({None: torch.arange(8.0), "exp_avg": torch.ones(6)}, [torch.zeros(2, 3)], {})
    other = checkpoint._snapshot(grown, first)     # another shape: a fresh copy, the rest reused
    assert other[0][None] is not first[0][None] and other[0]["exp_avg"] is first[0]["exp_avg"]
    assert torch.equal(other[0][None], torch.arange(8.0))
