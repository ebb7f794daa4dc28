"""One stage's checkpoint file, in the safetensors format, written in a single pass.

Writing: a header, then every tensor's bytes straight from its memory (no pickling, no copy of
the state), a CRC-32 of the file computed while the kernel syncs it to disk (the data is never
read back), then an atomic rename. Reading goes through the safetensors library: no code runs at
load, and only the tensors a rank asks for are read. Non-tensor state (optimizer hyper-parameters,
the LR scheduler, step counters kept as numbers) travels as JSON in the header's metadata.

A stage blob is ``{"model": {name: tensor}, "master": {param name: fp32 tensor} (optimizers
with separate master weights: ZeRO-1, bf16), "optim": {param name: {key: tensor | number}},
"param_groups": [...], "lr_scheduler": {...} | None, "loss_scaler": {...} | None, "rng": tensor,
"stage": int}``.

A ZeRO shard file holds one data-parallel rank's flat fp32 partitions as DeepSpeed keeps them
(``g{group}/master`` and ``g{group}/{state key}``, no copy into per-parameter tensors), with
each group's place in the stage's whole buffer and where each parameter begins in it: every
rank writes its own (nothing is gathered at save), and :func:`read_shards` puts a parameter
together at load from the pieces of the files that hold one, reading only those pieces.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import safe_open

SUFFIX = ".safetensors"
_META_KEY = "pswift"
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
           torch.uint8: "U8", torch.bool: "BOOL"}
#: bytes per write() call: measured faster than one call per tensor (bench/checkpoint.py)
_CHUNK = 1 << 20
#: after this many bytes, ask the kernel to start writing them back (the fsync then finds less)
_KICK = 16 << 20


class StageFileError(RuntimeError):
    pass


def flatten(blob: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors by file key, JSON-able rest) of a stage blob."""
    tensors: dict[str, torch.Tensor] = {f"model/{k}": v for k, v in blob["model"].items()}
    tensors.update({f"master/{k}": v for k, v in (blob.get("master") or {}).items()})
    scalars: dict[str, dict[str, Any]] = {}
    for name, state in blob["optim"].items():
        for key, v in state.items():
            if torch.is_tensor(v):
                tensors[f"optim/{name}/{key}"] = v
            else:
                scalars.setdefault(name, {})[key] = v
    tensors["rng"] = blob["rng"]
    rest = {"param_groups": blob["param_groups"], "lr_scheduler": blob["lr_scheduler"],
            "loss_scaler": blob.get("loss_scaler"), "stage": blob["stage"], "optim_scalars": scalars}
    return tensors, rest


def _bytes_of(t: torch.Tensor) -> Any:
    """A zero-copy byte view of a CPU tensor's data (a host copy first for device tensors)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


class _Writer:
    """Writes in chunks, starting the disk write-back of what is written every _KICK bytes
    (POSIX_FADV_DONTNEED starts write-back of dirty pages on Linux): the disk works while later
    chunks are copied, and the final fsync has less left to wait for."""

    def __init__(self, fd: int) -> None:
        self.fd, self.offset, self.kicked = fd, 0, 0

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.write(self.fd, view[:_CHUNK])
            view, self.offset = view[n:], self.offset + n
            if self.offset - self.kicked >= _KICK and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, self.kicked, self.offset - self.kicked, os.POSIX_FADV_DONTNEED)
                self.kicked = self.offset


def _plain(v: Any) -> Any:
    """JSON for what optimizers and schedulers keep besides numbers (a tensor hyper-parameter,
    a tuple); anything else is refused with its type."""
    if torch.is_tensor(v):
        return v.tolist()
    if isinstance(v, (tuple, set, frozenset)):
        return list(v)
    raise StageFileError(f"optimizer or scheduler state holds a {type(v).__name__}, which a "
                         f"checkpoint cannot record")


def _header(tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> tuple[bytes, list[Any]]:
    header: dict[str, Any] = {"__metadata__": {_META_KEY: json.dumps(rest, default=_plain)}}
    views, offset = [], 0
    for key, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise StageFileError(f"{key}: dtype {t.dtype} cannot be checkpointed "
                                 f"(supported: {', '.join(str(d) for d in _DTYPES)})")
        data = _bytes_of(t)
        header[key] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                       "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
        views.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)   # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text, views


def _fsync_while(fd: int, work: Iterable[Any], crc: int) -> int:
    """fsync ``fd`` in a thread while the CRC of ``work`` is computed here (both release the GIL)."""
    failed: list[OSError] = []

    def sync() -> None:
        try:
            os.fsync(fd)
        except OSError as e:
            failed.append(e)

    syncer = threading.Thread(target=sync, name="pswift-fsync")
    syncer.start()
    for data in work:
        crc = zlib.crc32(data, crc)
    syncer.join()
    if failed:
        raise failed[0]
    return crc


def write(path: Path, blob: dict[str, Any]) -> tuple[int, str]:
    """Write ``blob`` to ``path`` atomically and durably; returns (size, crc32 as 8 hex digits)."""
    return _write_tensors(path, *flatten(blob))


#: one parameter group's ZeRO partition on one rank, as ds_compat.master_parts gives it: ([(name,
#: shape, numel)], {None: flat fp32 partition, state key: its flat state}, scalar state, {name:
#: where the parameter begins, counted from the partition's first element} for the parameters
#: with a piece here)
Part = tuple[list[tuple[str, Any, int]], dict[Any, Any], dict[str, Any], dict[str, int]]


def write_shard(path: Path, parts: list[Part], rank: int) -> tuple[int, str]:
    """Write data-parallel rank ``rank``'s ZeRO partitions (one :data:`Part` per parameter
    group) to ``path`` atomically and durably; returns (size, crc32). The scalar state is the
    stage file's (every rank holds the same). The partition's place in the group's whole buffer
    is ``rank`` partitions from its start (ZeRO's partitions are of equal size)."""
    tensors: dict[str, torch.Tensor] = {}
    groups = []
    for g, (params, flats, _, starts) in enumerate(parts):
        numel = flats[None].numel()
        base = rank * numel
        keys = [k for k in flats if k is not None]
        tensors[f"g{g}/master"] = flats[None]
        tensors.update({f"g{g}/state/{k}": flats[k] for k in keys})
        # every parameter of the group, where it begins when a piece of it is here (else null):
        # a reader then knows what a missing file would have held
        at = {name: base + start for name, start in starts.items()}
        groups.append({"base": base, "numel": numel, "keys": keys,
                       "params": {name: [at.get(name), n, list(shape)] for name, shape, n in params}})
    return _write_tensors(path, tensors, {"zero_groups": groups})


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> tuple[int, str]:
    head, views = _header(tensors, rest)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        out = _Writer(fd)
        out.write(head)
        for data in views:
            out.write(data)
        crc = _fsync_while(fd, views, zlib.crc32(head))
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return len(head) + sum(v.nbytes for v in views), f"{crc:08x}"


def crc32_file(path: Path, chunk: int = 8 << 20) -> str:
    crc, buf = 0, bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return f"{crc:08x}"


def read(path: Path, wanted: set[str] | None = None) -> dict[str, Any]:
    """The stage blob of ``path`` holding only the parameters named in ``wanted`` (model and
    optimizer state; None: all); raises StageFileError when the file is not a stage file."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            rest = json.loads((f.metadata() or {})[_META_KEY])
            model: dict[str, Any] = {}
            master: dict[str, Any] = {}
            optim: dict[str, dict[str, Any]] = {}
            rng = None
            for key in f.keys():
                kind, _, name = key.partition("/")
                if kind == "model" and (wanted is None or name in wanted):
                    model[name] = f.get_tensor(key)
                elif kind == "master" and (wanted is None or name in wanted):
                    master[name] = f.get_tensor(key)
                elif kind == "optim" and (wanted is None or name.rpartition("/")[0] in wanted):
                    param, _, field = name.rpartition("/")
                    optim.setdefault(param, {})[field] = f.get_tensor(key)
                elif key == "rng":
                    rng = f.get_tensor(key)
    except Exception as e:  # SafetensorError, a missing metadata key, bad JSON
        raise StageFileError(f"{path} is not a readable stage file ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    for param, values in (rest.get("optim_scalars") or {}).items():
        if wanted is None or param in wanted:
            optim.setdefault(param, {}).update(values)
    return {"model": model, "master": master, "optim": optim, "param_groups": rest.get("param_groups"),
            "lr_scheduler": rest.get("lr_scheduler"), "loss_scaler": rest.get("loss_scaler"),
            "rng": rng, "stage": rest.get("stage")}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shape_of(name: str, shape: Any, n: Any) -> tuple[list[int], int]:
    """A shard file's record of a parameter's shape and size, checked (a list of integers, the
    size the shape's: a string "23" is no shape)."""
    if not isinstance(shape, list) or not all(_is_int(d) for d in [*shape, n]):
        raise ValueError(f"{name}: shape {shape!r} and size {n!r} are not integers")
    dims, numel = list(shape), int(n)
    if any(d < 0 for d in dims) or math.prod(dims) != numel:
        raise ValueError(f"{name}: shape {dims} does not hold {numel} elements")
    return dims, numel


def read_shards(paths: list[Path], wanted: set[str] | None = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(fp32 master weights by parameter name, their element-wise optimizer state by name) put
    together from every data-parallel rank's shard file of one stage (:func:`write_shard`), only
    the parameters in ``wanted`` (None: all), reading only their pieces; raises StageFileError
    when a file is not a shard file or the pieces do not make a parameter whole. A parameter
    held in one file is a view into that file's mapped data (no copy: a load copies it into
    its partition at once); clone what is to be kept."""
    pieces: dict[tuple[str, str], list[tuple[int, torch.Tensor]]] = {}
    shapes: dict[str, tuple[list[int], int]] = {}
    keys: dict[str, list[str]] = {}
    for path in paths:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                groups = json.loads((f.metadata() or {})[_META_KEY])["zero_groups"]
                for g, group in enumerate(groups):
                    base, numel = int(group["base"]), int(group["numel"])
                    for key in ["master", *group["keys"]]:   # every field flat, the group's size
                        field = f"g{g}/master" if key == "master" else f"g{g}/state/{key}"
                        if list(f.get_slice(field).get_shape()) != [numel]:
                            raise ValueError(f"{field} is not a flat field of {numel} elements")
                    for name, (at, n, shape) in group["params"].items():
                        if wanted is not None and name not in wanted:
                            continue
                        shapes[name], keys[name] = _shape_of(name, shape, n), ["master", *group["keys"]]
                        if at is not None and not _is_int(at):
                            raise ValueError(f"{name}: offset {at!r} is not an integer")
                        lo, hi = (max(at, base), min(at + n, base + numel)) if at is not None else (0, 0)
                        if lo >= hi:
                            continue
                        for key in keys[name]:
                            field = f"g{g}/master" if key == "master" else f"g{g}/state/{key}"
                            pieces.setdefault((name, key), []).append((lo - at, f.get_slice(field)[lo - base:hi - base]))
        except Exception as e:  # SafetensorError, a missing metadata key, bad JSON or numbers
            raise StageFileError(f"{path} is not a readable ZeRO shard file ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    master: dict[str, Any] = {}
    optim: dict[str, dict[str, Any]] = {}
    for (name, key) in ((name, key) for name in shapes for key in keys[name]):
        shape, n = shapes[name]
        got = sorted(pieces.get((name, key), []), key=lambda piece: piece[0])
        if [at for at, _ in got] != [sum(t.numel() for _, t in got[:i]) for i in range(len(got))] \
                or sum(t.numel() for _, t in got) != n:
            raise StageFileError(f"the ZeRO shard files {', '.join(p.name for p in paths)} do not hold "
                                 f"{name} ({key}) whole")
        # one piece (a parameter within one rank's partition): no copy beyond the file's read
        try:
            whole = (got[0][1] if len(got) == 1 else torch.cat([t for _, t in got])).view(shape) if got \
                else torch.zeros(shape)
        except (RuntimeError, ValueError) as e:   # a dtype or layout a shard never has
            raise StageFileError(f"{name} ({key}) cannot be put together from its pieces: "
                                 f"{str(e).splitlines()[0][:200]}") from None
        if key == "master":
            master[name] = whole
        else:
            optim.setdefault(name, {})[key] = whole
    return master, optim
