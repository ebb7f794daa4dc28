"""Stage-consistent, layout-portable checkpoints with an atomic commit marker.

Layout of ``CKPT_DIR/step_00000040/``:

- ``stage_003.safetensors`` per pipeline stage (written by that stage's data-parallel rank 0,
  see stagefile.py): the stage's module state and a plain optimizer's state keyed by **global
  parameter name** (PipelineModule names layers by global index, so names do not depend on the
  split), plus the LR scheduler and the loss scale;
- ``stage_003.zero_001.safetensors`` per data-parallel rank of a stage whose optimizer keeps
  separate fp32 master weights (ZeRO-1, bf16): that rank's own partition of the master weights
  and optimizer state, with where each parameter lies in it; every rank writes its own at once
  (nothing is gathered at save, as DeepSpeed's own ``zero_pp_rank_*`` files), and a load puts
  each parameter it needs together from the pieces, whatever data-parallel degree reads it;
- ``rng.json``: every rank's random generators (rng.py), written by rank 0;
- ``MANIFEST.json`` (the commit marker): written by rank 0 after a barrier, via temp file +
  fsync + rename. It lists step, samples, boundaries, P, DP, m, world size, data position and
  every file with its size and CRC-32.

Only directories with a valid manifest are loaded. One without a manifest is a half-written
checkpoint and is removed at the next start; one whose manifest cannot be read or does not pass
the schema check (another version, edited by hand) is moved aside, never deleted. Loading reads
only the tensors of the stage files that overlap this rank's layers (safetensors: no code runs),
checks the files' checksums, and refuses a checkpoint of another model (the manifest records the
model's id and layer count) or whose names or shapes do not match; the launcher then falls back
to the previous committed checkpoint. Checkpoints of manifest version 2 (ZeRO state gathered
into the stage file) and 1 (``stage_003.pt``, ``torch.save`` pickles with SHA-256 sums) still
load, the latter through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import torch
from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

from . import ds_compat, rng, stagefile

MANIFEST = "MANIFEST.json"
RNG_FILE = "rng.json"
MANIFEST_VERSION = 3
#: manifest versions this launcher loads, with each one's stage-file suffix and checksum field
READABLE = {1: (".pt", "sha256"), 2: (stagefile.SUFFIX, "crc32"), 3: (stagefile.SUFFIX, "crc32")}
#: the first manifest version with ZeRO shard files (``stage_003.zero_001.safetensors``)
SHARDED = 3
#: fault injection for recovery tests: at this step, the last stage's writer SIGKILLs itself
#: right after writing its file and before the manifest exists (a crash mid-checkpoint), once
FAULT_ENV = "PSWIFT_FAULT_KILL_IN_CHECKPOINT"
#: at this step the last stage's writer fails to write its stage file (a full disk)
FAULT_FAIL_ENV = "PSWIFT_FAULT_FAIL_CHECKPOINT"
#: "STEP:SECONDS" ("*" for every step): at that step every writer waits that long between its stage file and the
#: manifest, so a test can preempt the job while a checkpoint is half written
FAULT_SLOW_ENV = "PSWIFT_FAULT_SLOW_CHECKPOINT"


class CheckpointError(RuntimeError):
    pass


def _fault_once(ckpt_dir: Path) -> None:
    """FAULT_ENV's SIGKILL, once a checkpoint folder (the restart that follows must get past it)."""
    marker = ckpt_dir.parent / f".fault-fired-{ckpt_dir.name}"
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    sha, buf = hashlib.sha256(), bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            sha.update(view[:n])
    return sha.hexdigest()


_STAGE_FILE = re.compile(r"^stage_[0-9]{3}(\.pt|\.safetensors)$")
_SHARD_FILE = re.compile(r"^stage_([0-9]{3})\.zero_([0-9]{3})\.safetensors$")
_DIGEST = {"sha256": re.compile(r"^[0-9a-f]{64}$"), "crc32": re.compile(r"^[0-9a-f]{8}$")}


def stage_file(stage: int, version: int = MANIFEST_VERSION) -> str:
    return f"stage_{stage:03d}{READABLE[version][0]}"


def shard_file(stage: int, dp_rank: int) -> str:
    return f"stage_{stage:03d}.zero_{dp_rank:03d}{stagefile.SUFFIX}"


def shard_files(man: dict[str, Any], stage: int) -> list[str]:
    """The ZeRO shard files of ``stage`` in a checkpoint's manifest, by data-parallel rank."""
    return sorted(n for n in man["files"] if (m := _SHARD_FILE.match(n)) and int(m.group(1)) == stage)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def manifest_problem(man: Any) -> str | None:
    """Why a parsed manifest is unusable (schema, version, file names), or None."""
    if not isinstance(man, dict):
        return "not a JSON object"
    version = man.get("version")
    if version not in READABLE or isinstance(version, bool):
        return f"manifest version {version!r}, this pswift reads {sorted(READABLE)}"
    suffix, digest = READABLE[version]
    if not all(_count(man.get(k)) for k in ("step", "samples", "stages")):
        return "step, samples or stages is not a count"
    b = man.get("boundaries")
    if not (isinstance(b, list) and len(b) == man["stages"] + 1 and all(_count(x) for x in b)
            and b[0] == 0 and all(x < y for x, y in zip(b, b[1:]))):
        return "boundaries are not increasing layer indices from 0, one more than the stages"
    files = man.get("files")
    if not isinstance(files, dict):
        return "no file list"
    for name, meta in files.items():
        if not (isinstance(name, str)
                and ((_STAGE_FILE.match(name) and name.endswith(suffix)) or (name == RNG_FILE and version >= 2)
                     or (_SHARD_FILE.match(name) and version >= SHARDED))
                and isinstance(meta, dict) and _count(meta.get("size"))
                and isinstance(meta.get(digest), str) and _DIGEST[digest].match(meta[digest])):
            return f"file entry {str(name)[:40]!r} is malformed"
    if any(stage_file(s, version) not in files for s in range(man["stages"])):
        return "a stage's file is not listed"
    if any((m := _SHARD_FILE.match(n)) and int(m.group(1)) >= man["stages"] for n in files):
        return "a ZeRO shard file of a stage the checkpoint does not have"
    for s in range(man["stages"]):
        shards = shard_files(man, s)
        if shards and shards != [shard_file(s, r) for r in range(len(shards))]:
            return f"stage {s}'s ZeRO shard files are not numbered 0 to {len(shards) - 1}"
    return None


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a committed checkpoint whose files are all present, else None."""
    return _manifest_state(path)[0]


def _manifest_state(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None) when committed and complete; (None, why) otherwise; why is "absent"
    when there is no manifest at all (a half-written checkpoint)."""
    try:
        text = (path / MANIFEST).read_text()
    except FileNotFoundError:
        return None, "absent"
    except OSError as e:
        return None, f"unreadable ({e.strerror})"
    try:
        man = json.loads(text)
    except (ValueError, RecursionError):
        return None, "not JSON"
    problem = manifest_problem(man)
    if problem:
        return None, problem
    for name, meta in man["files"].items():
        try:
            if (path / name).stat().st_size != meta["size"]:
                return None, f"{name} has another size than the manifest says"
        except OSError:
            return None, f"{name} is missing"
    return man, None


def committed(ckpt_dir: Path) -> list[Path]:
    """Committed checkpoints, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    dirs = sorted(p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith("step_"))
    return [p for p in dirs if read_manifest(p) is not None]


def remove_uncommitted(ckpt_dir: Path) -> tuple[list[str], list[str]]:
    """Delete half-written checkpoints (no manifest at all) and move those with a manifest that
    cannot be used aside (``unreadable-step_N``, with the reason in ``WHY``); call on one rank,
    before training. Returns (removed, moved aside with why)."""
    removed: list[str] = []
    aside: list[str] = []
    if not ckpt_dir.is_dir():
        return removed, aside
    for p in sorted(ckpt_dir.iterdir()):
        if not (p.is_dir() and p.name.startswith("step_")):
            continue
        man, why = _manifest_state(p)
        if why == "absent":
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
        elif why is not None:
            dest = p.with_name(f"unreadable-{p.name}")
            os.replace(p, dest)
            (dest / "WHY").write_text(why + "\n")
            aside.append(f"{p.name} ({why})")
    return removed, aside


def prune(ckpt_dir: Path, keep: int) -> None:
    for p in committed(ckpt_dir)[:-keep]:
        # remove the marker first: a crash mid-delete leaves an uncommitted dir, never a bad one
        (p / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(p, ignore_errors=True)


def _layer_of(name: str) -> int | None:
    head = name.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _zero_parts(engine: Any) -> list[stagefile.Part] | None:
    """This rank's ZeRO-1 / bf16 partitions (live, no copy) for its shard file; None for a
    plain torch optimizer (its whole state goes into the stage file)."""
    return ds_compat.master_parts(engine) if ds_compat.master_groups(engine) is not None else None


def _stage_blob(engine: Any, parts: list[stagefile.Part] | None) -> dict[str, Any]:
    """This stage's state for its stage file (references, no copy): a plain optimizer's state
    per parameter; with ZeRO partitions (``parts``, this rank's: every rank holds the same
    scalars) only the scalar state per parameter, such as Adam's step (the tensors go into each
    rank's shard file)."""
    opt = engine.optimizer
    if parts is None:
        name_of = {p: n for n, p in engine.module.named_parameters()}
        optim = {name_of[p]: opt.state[p] for g in opt.param_groups for p in g["params"] if p in opt.state}
    else:
        optim = {name: dict(scalars) for params, _, scalars, _ in parts for name, _, _ in params}
    return {
        "model": engine.module.state_dict(),
        "master": {},
        "optim": optim,
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
        "loss_scaler": ds_compat.loss_scale_state(engine),
        "rng": torch.get_rng_state(),
        "stage": engine.stage_id,
    }


#: a file this rank wrote into a checkpoint: (name, size, checksum, seconds writing it)
Written = tuple[str, int, str, float]


def _write_files(engine: Any, path: Path, step: int, blob: dict[str, Any] | None,
                 parts: list[stagefile.Part] | None) -> list[Written]:
    """This rank's files of the checkpoint: its ZeRO shard file (``parts``), and the stage file
    when it is the stage's data-parallel rank 0 (``blob``; None elsewhere)."""
    out: list[Written] = []
    if parts is not None:
        t0, dp_rank = time.perf_counter(), engine.grid.data_parallel_id
        name = shard_file(engine.stage_id, dp_rank)
        out.append((name, *stagefile.write_shard(path / name, parts, dp_rank), time.perf_counter() - t0))
    if blob is None:
        return out
    t0, name = time.perf_counter(), stage_file(engine.stage_id)
    if os.environ.get(FAULT_FAIL_ENV) == str(step) and engine.stage_id == engine.num_stages - 1:
        raise OSError(errno.ENOSPC, f"No space left on device ({FAULT_FAIL_ENV})", str(path / name))
    size, digest = stagefile.write(path / name, blob)
    if os.environ.get(FAULT_ENV) == str(step) and engine.stage_id == engine.num_stages - 1:
        _fault_once(path.parent)
    slow_step, _, slow_s = os.environ.get(FAULT_SLOW_ENV, "").partition(":")
    if slow_step in (str(step), "*"):      # "*": every checkpoint's
        time.sleep(float(slow_s or 0))     # a slow disk: the write takes that much longer
    return [*out, (name, size, digest, time.perf_counter() - t0)]


def _commit(path: Path, step: int, meta: dict[str, Any], mine: list[Written] | None, generators: Any,
            gather: Callable[[Any], list[Any]], barrier: Callable[[], None], rank: int) -> dict[str, float]:
    """Every rank: its files are on disk (``mine``; None: this rank could not write them); rank
    0 writes the generators and the manifest (the checkpoint counts from here), then all meet.
    Where the time went (see :func:`save`); raises on every rank when a rank could not write."""
    gathered = gather((mine, generators))  # every rank's files are on disk, or it failed
    failed = [r for r, (written, _) in enumerate(gathered) if written is None]
    if failed:   # every rank knows it from the same gather: none waits for another
        raise CheckpointError(f"rank {failed[0]} could not write its files of {path.name}: not committed")
    files = [f for written, _ in gathered for f in written]
    t_commit = time.perf_counter()
    if rank == 0:
        record = json.dumps({"layout": layout_key(meta), "ranks": [g for _, g in gathered]}).encode()
        _atomic_write(path / RNG_FILE, record)
        listed = {n: {"size": s, "crc32": h} for n, s, h, _ in sorted(files)}
        listed[RNG_FILE] = {"size": len(record), "crc32": f"{zlib.crc32(record):08x}"}
        man = dict(meta, version=MANIFEST_VERSION, step=step, created=time.time(), files=listed)
        _atomic_write(path / MANIFEST, (json.dumps(man, indent=1, sort_keys=True) + "\n").encode())
        _fsync_dir(path)
    barrier()  # committed before anyone moves on (or exits)
    return {"write_s": max(f[3] for f in files), "commit_s": time.perf_counter() - t_commit}


def save(engine: Any, ckpt_dir: Path, step: int, meta: dict[str, Any],
         gather: Callable[[Any], list[Any]], barrier: Callable[[], None],
         rank: int) -> tuple[Path, dict[str, float]]:
    """Every rank calls this at the same step. Returns the committed directory and where the
    time went: ``write_s`` (the slowest rank's files: every rank writes its own ZeRO shard, the
    stage's data-parallel rank 0 the stage file too) and ``commit_s`` (from the last file on
    disk to the manifest committed on every rank)."""
    path = ckpt_dir / tag_for(step)
    path.mkdir(parents=True, exist_ok=True)
    parts = _zero_parts(engine)
    blob = _stage_blob(engine, parts) if engine.grid.data_parallel_id == 0 else None
    mine = _write_files(engine, path, step, blob, parts)
    return path, _commit(path, step, meta, mine, rng.capture(), gather, barrier, rank)


def _snapshot(obj: Any, into: Any = None) -> Any:
    """A copy of every tensor in ``obj`` (training goes on changing the originals), made in the
    tensors of ``into`` (an earlier snapshot of the same state) where shape and dtype match:
    host memory touched before takes a copy several times faster than fresh pages."""
    if isinstance(obj, torch.Tensor):
        if isinstance(into, torch.Tensor) and into.device.type == "cpu" and into.shape == obj.shape \
                and into.dtype == obj.dtype:
            return into.copy_(obj.detach())
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        earlier = into if isinstance(into, dict) else {}
        return {k: _snapshot(v, earlier.get(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        same = isinstance(into, (list, tuple)) and len(into) == len(obj)
        return type(obj)(_snapshot(v, into[i] if same else None) for i, v in enumerate(obj))
    return obj


class Pending:
    """A checkpoint written in the background (as torch.distributed.checkpoint's async save,
    with CheckFreq's pipelined snapshot): this rank's state (its ZeRO shard; the stage file's
    state on the stage's data-parallel rank 0) is copied to host memory by a thread while the
    next step's forward and backward run (they read the weights and the optimizer state, never
    write them), and the next optimizer step waits for that copy (:meth:`wait_copied`, run by
    the fence :func:`ds_compat.before_optimizer_step` installs); then the thread writes this
    rank's files and the threads of all ranks commit together over ``gather`` / ``barrier``
    (collectives of a process group of the checkpoints' own: training's go on meanwhile): rank
    0 writes the manifest once every rank's files are durable -- until then the checkpoint does
    not count, and a crash leaves a folder without manifest (removed at the next start).
    Training waits for none of it, only for the copy. ``staging``: the copies of an earlier
    checkpoint of this launch, committed: the copy reuses their memory (as DCP's staging cache);
    :attr:`copies` holds this one's for the next."""

    def __init__(self, engine: Any, ckpt_dir: Path, step: int, meta: dict[str, Any],
                 gather: Callable[[Any], list[Any]], barrier: Callable[[], None], rank: int,
                 staging: Any = None) -> None:
        self.path, self.step, self.meta = ckpt_dir / tag_for(step), step, meta
        self.path.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        # references only, here; what is not a tensor (scheduler, loss scale, generators) is
        # taken as it is now
        parts = _zero_parts(engine)
        state = _stage_blob(engine, parts) if engine.grid.data_parallel_id == 0 else None
        self.generators = rng.capture()
        self.copied = threading.Event()
        self.stall_s = time.perf_counter() - t0
        self.phases: dict[str, float] = {}
        self.copies: Any = None
        self.error: BaseException | None = None

        def write() -> None:
            mine, copy_s = None, 0.0
            try:
                t_copy = time.perf_counter()
                try:
                    self.copies = copies, blob = _snapshot((parts, state), staging)
                finally:
                    self.copied.set()
                copy_s = time.perf_counter() - t_copy
                mine = _write_files(engine, self.path, step, blob, copies)
            except BaseException as e:  # noqa: BLE001 - re-raised in the training thread by commit()
                self.error = e
            try:   # with the others even when this rank failed: they would wait for it forever
                self.phases = dict(_commit(self.path, step, meta, mine, self.generators, gather, barrier, rank),
                                   copy_s=copy_s)
            except BaseException as e:  # noqa: BLE001 - as above
                self.error = self.error or e
        self.thread = threading.Thread(target=write, name=f"pswift-save-{step}", daemon=True)
        self.thread.start()

    def wait_copied(self) -> None:
        """Before the optimizer changes the weights: wait for the thread's copy of them (the
        wait counts as the checkpoint's stall)."""
        t0 = time.perf_counter()
        self.copied.wait()
        self.stall_s += time.perf_counter() - t0

    def done(self) -> bool:
        return not self.thread.is_alive()

    def commit(self) -> dict[str, float]:
        """Wait for the thread: files written and the checkpoint committed (a wait its caller
        counts, as a synchronous save does); where its time went."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.phases


def layout_key(meta: dict[str, Any]) -> list[Any]:
    """What must be equal for a rank's saved generators to be its own after a resume."""
    return [meta["stages"], meta["data_parallel"], list(meta["boundaries"]), meta["world_size"]]


def saved_generators(path: Path, man: dict[str, Any], rank: int, layout: list[Any]) -> dict[str, Any] | None:
    """This rank's generators saved in the committed checkpoint ``path`` when it was written in
    ``layout`` (see :func:`layout_key`); None when another layout wrote it or it has none."""
    meta = man["files"].get(RNG_FILE)
    if meta is None or meta["size"] > rng.MAX_BYTES:
        return None
    blob = (path / RNG_FILE).read_bytes()
    if f"{zlib.crc32(blob):08x}" != meta["crc32"]:
        raise CheckpointError(f"{path / RNG_FILE}: checksum mismatch (corrupt file)")
    try:
        saved = json.loads(blob)
        return saved["ranks"][rank] if saved["layout"] == layout else None
    except (ValueError, KeyError, IndexError, TypeError):
        raise CheckpointError(f"{path / RNG_FILE} is not a generator record") from None


def _check_sum(path: Path, name: str, man: dict[str, Any]) -> None:
    _, digest = READABLE[man["version"]]
    actual = stagefile.crc32_file(path / name) if digest == "crc32" else _sha256_file(path / name)
    if actual != man["files"][name][digest]:
        raise CheckpointError(f"{path / name}: checksum mismatch (corrupt file)")


def read_stage(path: Path, man: dict[str, Any], stage: int, wanted: set[str] | None = None) -> dict[str, Any]:
    """Stage ``stage``'s blob of the committed checkpoint ``path`` (only the ``wanted``
    parameters; None: all), its ZeRO shards put together into ``master`` and ``optim``; every
    file's checksum is checked first."""
    blob = _read_stage(path, stage_file(stage, man["version"]), man, wanted)
    shards = shard_files(man, stage)
    if not shards:
        return blob
    for name in shards:
        _check_sum(path, name, man)
    try:
        master, optim = stagefile.read_shards([path / n for n in shards], wanted)
    except stagefile.StageFileError as e:
        raise CheckpointError(str(e)) from None
    held = set(blob["optim"]) if wanted is None else set(blob["optim"]) & wanted
    if held - set(master):
        raise CheckpointError(f"{path}: stage {stage}'s ZeRO shard files hold no master weights for "
                              f"{', '.join(sorted(held - set(master))[:5])}")
    for name, values in optim.items():
        blob["optim"].setdefault(name, {}).update(values)
    return dict(blob, master=master)


def read_all(path: Path) -> dict[str, Any]:
    """Every stage's state of the committed checkpoint ``path``, merged: ``{"model": {name:
    tensor}, "master": {...}, "optim": {name: {key: value}}}``, each tensor owning its memory
    (benchmarks and tests compare and save checkpoints with it)."""
    man, why = _manifest_state(path)
    if man is None:
        raise CheckpointError(f"{path} is not a committed checkpoint ({why})")
    out: dict[str, Any] = {"model": {}, "master": {}, "optim": {}}
    for s in range(man["stages"]):
        blob = read_stage(path, man, s)
        for key in out:
            out[key].update(blob.get(key) or {})
    out["master"] = {n: t.clone() for n, t in out["master"].items()}
    out["optim"] = {n: {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
                    for n, state in out["optim"].items()}
    return out


def _read_stage(path: Path, name: str, man: dict[str, Any], wanted: set[str] | None) -> dict[str, Any]:
    """One stage file's blob (only ``wanted`` parameters), its checksum checked first."""
    _check_sum(path, name, man)
    try:
        if man["version"] >= 2:
            return stagefile.read(path / name, wanted)
        # version 1: torch.save pickles; weights_only: tensors and plain containers, never code
        blob = torch.load(path / name, map_location="cpu", weights_only=True, mmap=True)
        return dict(blob, model={k: v for k, v in blob["model"].items() if wanted is None or k in wanted},
                    optim={k: v for k, v in blob["optim"].items() if wanted is None or k in wanted})
    except stagefile.StageFileError as e:
        raise CheckpointError(str(e)) from None
    except Exception as e:  # UnpicklingError (code refused), truncation, a wrong structure
        raise CheckpointError(f"{path / name} cannot be loaded safely ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None


def _check_identity(path: Path, man: dict[str, Any], model_id: str | None, layers: int | None) -> None:
    if model_id is not None and man.get("model_id") not in (None, model_id):
        raise CheckpointError(f"{path} was written by another model (model id "
                              f"{str(man.get('model_id'))[:16]}, this one {model_id})")
    if layers is not None and man["boundaries"][-1] != layers:
        raise CheckpointError(f"{path} holds {man['boundaries'][-1]} layers, this model has {layers}")


def _check_match(path: Path, own: dict[str, Any], model: dict[str, Any]) -> None:
    missing = sorted(set(own) - set(model), key=str)
    if missing:
        raise CheckpointError(f"{path} does not match the model: no saved value for "
                              f"{', '.join(missing[:5])}{'...' if len(missing) > 5 else ''} "
                              f"(different model or layer count?)")
    for k, v in model.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise CheckpointError(f"{path} does not match the model: {k} has shape "
                                  f"{tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} here")


def load(engine: Any, path: Path, model_id: str | None = None, layers: int | None = None) -> dict[str, Any]:
    """Load a committed checkpoint into this rank's stage, whatever layout wrote it; refuse one
    of another model (``model_id``, total ``layers``) or with a corrupt file."""
    man, why = _manifest_state(path)
    if man is None:
        raise CheckpointError(f"{path} is not a committed checkpoint ({why})")
    _check_identity(path, man, model_id, layers)
    own = engine.module.state_dict()
    own_layers = {_layer_of(k) for k in own}
    old_b = man["boundaries"]
    model: dict[str, Any] = {}
    master: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    hyper = sched = scaler = None
    for s in range(len(old_b) - 1):
        if not (own_layers & set(range(old_b[s], old_b[s + 1])) or None in own_layers):
            continue  # another stage's layers only: not read at all
        blob = read_stage(path, man, s, set(own))
        model.update(blob["model"])
        master.update(blob.get("master") or {})
        optim.update(blob["optim"])
        hyper = blob["param_groups"]
        sched = blob.get("lr_scheduler") if blob.get("lr_scheduler") is not None else sched
        scaler = blob.get("loss_scaler") or scaler
    _check_match(path, own, model)
    engine.module.load_state_dict(model, strict=True)
    _load_optimizer(engine, model, master, optim)
    opt = engine.optimizer
    if hyper is not None:
        for g, h in zip(opt.param_groups, hyper):
            g.update(h)
    if sched is not None and engine.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(sched)
    if scaler:
        ds_compat.set_loss_scale_state(engine, scaler)
    ds_compat.set_progress(engine, man["step"], man["samples"], engine.micro_batches)
    return man


def _load_optimizer(engine: Any, model: dict[str, Any], master: dict[str, Any],
                    optim: dict[str, dict[str, Any]]) -> None:
    """Full per-parameter state into whatever optimizer this run has, whatever wrote it: a
    plain torch optimizer takes it per parameter; ZeRO-1 / bf16 take this rank's fragment of
    each value. The fp32 master weights are the saved ones, or the model's weights when the
    writer kept none (fp32, ZeRO-0)."""
    named = list(engine.module.named_parameters())
    groups = ds_compat.master_groups(engine)
    if groups is None:
        for n, p in named:
            if n in master:  # written with separate fp32 masters: they are the exact weights
                p.data.copy_(master[n])
            if n in optim:
                engine.optimizer.state[p] = {k: (v.clone() if torch.is_tensor(v) else v)
                                             for k, v in optim[n].items()}
        return
    shape_of = {n: tuple(p.shape) for n, p in named}
    first = next((n for n, _ in named if optim.get(n)), None)
    elementwise: list[str] = []
    if first is not None:
        elementwise = [k for k, v in optim[first].items()
                       if torch.is_tensor(v) and tuple(v.shape) == shape_of[first]]
        scalars = {k: v for k, v in optim[first].items() if k not in elementwise}
        ds_compat.create_master_state(engine, elementwise, scalars)
    for n, p in named:
        safe_set_full_fp32_param(p, master.get(n, model[n]).to(torch.float32))
        for k in elementwise:
            safe_set_full_optimizer_state(p, optim[n][k].to(torch.float32), k)
