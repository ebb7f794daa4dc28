"""Stage files: written by pswift in one pass, read back by the safetensors library."""

from __future__ import annotations

import json
import zlib

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings, strategies as st  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from helpers import blob_of, zero_partitions  # noqa: E402
from pipeswift_launch import stagefile  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
          torch.uint8, torch.bool]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), max_size=3)),
                min_size=1, max_size=6))
def test_what_is_written_is_what_safetensors_reads(tmp_path_factory, specs):
    path = tmp_path_factory.mktemp("sf") / "stage_001.safetensors"
    g = torch.Generator().manual_seed(0)
    tensors = {f"{i}.w": (torch.randn(shape, generator=g) * 100).to(dt) for i, (dt, shape) in enumerate(specs)}
    blob = blob_of(tensors)
    rng = blob["rng"].clone()
    size, crc = stagefile.write(path, blob)
    assert size == path.stat().st_size and crc == f"{zlib.crc32(path.read_bytes()):08x}"
    assert stagefile.crc32_file(path) == crc
    raw = load_file(str(path))  # the library's own reader accepts the file
    for n, t in tensors.items():
        assert raw[f"model/{n}"].dtype == t.dtype and torch.equal(raw[f"model/{n}"], t)
    back = stagefile.read(path)
    assert back["model"].keys() == tensors.keys()
    assert all(torch.equal(back["optim"][n]["exp_avg"], t.float() * 2) and back["optim"][n]["step"] == 3
               for n, t in tensors.items())
    assert back["lr_scheduler"] == {"last_batch_iteration": 7} and back["stage"] == 1
    assert torch.equal(back["rng"], rng)


def test_read_keeps_only_the_wanted_parameters(tmp_path):
    path = tmp_path / "s.safetensors"
    stagefile.write(path, blob_of({"0.w": torch.ones(3), "1.w": torch.zeros(2)}))
    back = stagefile.read(path, {"1.w"})
    assert list(back["model"]) == ["1.w"] and list(back["optim"]) == ["1.w"]


def test_a_non_contiguous_tensor_is_written_by_value(tmp_path):
    t = torch.arange(12.0).reshape(3, 4).t()
    path = tmp_path / "s.safetensors"
    stagefile.write(path, blob_of({"0.w": t}))
    assert torch.equal(stagefile.read(path)["model"]["0.w"], t)


def test_an_unsupported_dtype_is_named(tmp_path):
    blob = dict(blob_of({}), model={"0.w": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(stagefile.StageFileError, match="complex64 cannot be checkpointed"):
        stagefile.write(tmp_path / "s.safetensors", blob)
    assert list(tmp_path.iterdir()) == []  # refused before any file exists


@pytest.mark.parametrize("junk", [b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ", b"x" * 64,
                                  (10**12).to_bytes(8, "little") + b"{}"])
def test_a_malformed_file_is_a_stage_file_error(tmp_path, junk):
    path = tmp_path / "s.safetensors"
    path.write_bytes(junk)
    with pytest.raises(stagefile.StageFileError, match="not a readable stage file"):
        stagefile.read(path)


def test_the_header_records_the_non_tensor_state_as_json(tmp_path):
    path = tmp_path / "s.safetensors"
    stagefile.write(path, blob_of({"0.w": torch.ones(1)}))
    n = int.from_bytes(path.read_bytes()[:8], "little")
    assert n % 8 == 0
    header = json.loads(path.read_bytes()[8:8 + n])
    assert json.loads(header["__metadata__"]["pswift"])["param_groups"][0]["lr"] == 1e-3


def test_tensor_hyper_parameters_are_recorded_as_numbers(tmp_path):
    """Some optimizers keep lr as a tensor: it is written as its value, read back as a number."""
    blob = blob_of({"0.w": torch.ones(2)})
    blob["param_groups"] = [{"lr": torch.tensor(0.01), "betas": (0.9, 0.99)}]
    path = tmp_path / "s.safetensors"
    stagefile.write(path, blob)
    assert stagefile.read(path)["param_groups"] == [{"lr": pytest.approx(0.01), "betas": [0.9, 0.99]}]


def test_state_that_json_cannot_hold_is_refused_by_name(tmp_path):
    blob = dict(blob_of({"0.w": torch.ones(2)}), lr_scheduler={"fn": object()})
    with pytest.raises(stagefile.StageFileError, match="holds a object"):
        stagefile.write(tmp_path / "s.safetensors", blob)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(1, 4), st.data())
def test_zero_shards_written_by_each_rank_make_every_parameter_whole_again(tmp_path_factory, sizes, dp, data):
    pads = data.draw(st.lists(st.integers(0, 3), min_size=len(sizes), max_size=len(sizes)))
    whole, parts = zero_partitions(sizes, pads, dp)
    d = tmp_path_factory.mktemp("zero")
    paths = [d / f"stage_000.zero_{r:03d}.safetensors" for r in range(dp)]
    for r, path in enumerate(paths):
        size, crc = stagefile.write_shard(path, parts[r], r)
        assert path.stat().st_size == size and stagefile.crc32_file(path) == crc
    master, optim = stagefile.read_shards(paths)
    assert sorted(master) == sorted(optim) == sorted(whole)
    for name, (m, avg) in whole.items():
        assert torch.equal(master[name], m) and torch.equal(optim[name]["exp_avg"], avg), name
    some = set(sorted(whole)[::2])
    master, optim = stagefile.read_shards(paths, some)
    assert set(master) == set(optim) == some
    held = set(parts[1][0][3]) if dp > 1 else set()
    if held:   # one rank's file missing: a parameter with a piece there is not whole
        with pytest.raises(stagefile.StageFileError, match="do not hold .* whole"):
            stagefile.read_shards(paths[:1] + paths[2:], held)


def test_a_stage_file_is_not_a_shard_file(tmp_path):
    path = tmp_path / "stage_000.safetensors"
    stagefile.write(path, blob_of({"0.w": torch.ones(3)}))
    with pytest.raises(stagefile.StageFileError, match="not a readable ZeRO shard file"):
        stagefile.read_shards([path])


def test_a_shard_file_whose_sizes_do_not_add_up_is_refused_before_anything_is_allocated(tmp_path):
    _, parts = zero_partitions([4], [0], 1)
    params, flats, scalars, starts = parts[0][0]
    lying = [([(params[0][0], torch.Size([10**6, 10**6]), 4)], flats, scalars, starts)]
    path = tmp_path / "stage_000.zero_000.safetensors"
    stagefile.write_shard(path, lying, 0)
    with pytest.raises(stagefile.StageFileError, match="does not hold 4 elements"):
        stagefile.read_shards([path])


def _rewrite_shard(path, change_meta=None, change_tensors=None):
    """Rewrite a shard file with its metadata or tensors changed (a hostile or damaged file)."""
    import json as _json

    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(str(path), framework="pt", device="cpu") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    key = next(k for k in meta if "zero_groups" in meta[k])
    doc = _json.loads(meta[key])
    if change_meta:
        change_meta(doc)
    if change_tensors:
        change_tensors(tensors)
    save_file(tensors, str(path), {**meta, key: _json.dumps(doc)})


@pytest.mark.parametrize("change_meta,change_tensors,why", [
    (lambda d: d["zero_groups"][0]["params"]["0.weight"].__setitem__(2, "41"), None, "are not integers"),
    (lambda d: d["zero_groups"][0]["params"]["0.weight"].__setitem__(0, 0.5), None, "is not an integer"),
    (None, lambda t: t.update({k: v.view(2, -1) for k, v in t.items() if k.endswith("/master")}),
     "is not a flat field of 4 elements"),
    (None, lambda t: t.update({k: v.view(4, 1).expand(4, 2).contiguous().view(-1)[:4].view(2, 2)
                               for k, v in t.items() if k.endswith("exp_avg")}), "is not a flat field"),
])
def test_a_shard_whose_shapes_lie_is_refused_not_raised(tmp_path, change_meta, change_tensors, why):
    """A string shape ("41" was read as [4, 1]), a fractional offset, a 2-D field (it passed the
    offset checks and raised RuntimeError outside the loader's handler): each is a
    StageFileError, so the load falls back to the previous checkpoint."""
    _, parts = zero_partitions([4], [0], 1)
    path = tmp_path / "stage_000.zero_000.safetensors"
    stagefile.write_shard(path, parts[0], 0)
    assert stagefile.read_shards([path])[0]["0.weight"].shape == (4, 1)
    _rewrite_shard(path, change_meta, change_tensors)
    with pytest.raises(stagefile.StageFileError, match=why):
        stagefile.read_shards([path])
