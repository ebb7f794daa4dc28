"""train.toml: strict parsing into typed, immutable sections (named tuples: a tenth of a frozen
dataclass's start-up cost, which `pswift sbatch` pays on every submission).

Unknown keys are rejected with the list of valid ones; wrong types and out-of-range values name
the key, the value and the fix. Cross-section invariants that depend on the node count
(pp x dp = world size, micro-batch x m x dp = global batch) are checked in :mod:`plan`.
Paths resolve relative to the TOML file.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import ConfigError
from .numbers import finite

SECTIONS = ("job", "resources", "model", "training", "pipeline")
_ENTRY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_TIME_RE = re.compile(
    r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$"
)


#: [job] max_restarts: its default and its largest value (pipeswift_slurm.decide uses them)
MAX_RESTARTS_DEFAULT = 3
MAX_RESTARTS_LIMIT = 100
#: [job] max_requeues: its default (requeues after preemption, time limit or node loss)
MAX_REQUEUES_DEFAULT = 3


class JobSection(NamedTuple):
    name: str
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch_options: tuple[str, ...] = ()
    max_requeues: int = MAX_REQUEUES_DEFAULT
    #: restarts of the ranks inside one allocation after a crash (pipeswift_slurm.decide)
    max_restarts: int = MAX_RESTARTS_DEFAULT
    python: str | None = None
    #: what the planner minimises: the expected JCT, or its median or 90th percentile (risk)
    objective: str = "mean"
    #: a job below the top of its node range checks this often whether growing pays (0: never)
    grow_check_s: int = 60

    @property
    def time_seconds(self) -> int | None:
        return None if self.time is None else slurm_time_seconds(self.time)


class ResourcesSection(NamedTuple):
    nodes_min: int = 1
    nodes_max: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    device: str = "cpu"

    @property
    def node_counts(self) -> range:
        return range(self.nodes_min, self.nodes_max + 1)

    @property
    def nodes_spec(self) -> str:
        """Slurm's --nodes value: ``2`` or ``2-4``."""
        if self.nodes_min == self.nodes_max:
            return str(self.nodes_min)
        return f"{self.nodes_min}-{self.nodes_max}"


class ModelSection(NamedTuple):
    entry: str
    kwargs: dict[str, Any] = {}    # never mutated: the parser gives each config its own
    loss: str | None = None
    num_layers: int | None = None
    layer_costs: tuple[float, ...] | None = None
    layer_memory: tuple[int, ...] | None = None


class TrainingSection(NamedTuple):
    steps: int
    global_batch_size: int
    #: the micro-batch size [model] layer_costs are for: the TOML's integer, the first size of a
    #: list, 1 (one sample) with "auto"
    micro_batch_size: int
    #: "module:function", or {"tokens": path, "dtype", "seq_len"}, or {"dataset": "module:fn",
    #: "kwargs"} (see pipeswift_launch/data.py)
    data: str | dict[str, Any]
    seed: int = 1
    optimizer: dict[str, Any] = {}
    ds_config: dict[str, Any] = {}
    gradient_clipping: float = 0.0
    #: "fp32", "bf16" or "fp16" (fp16: dynamic loss scaling; needs a GPU)
    precision: str = "fp32"
    #: 0, or 1: optimizer state and fp32 master weights sharded over the data-parallel ranks
    zero_stage: int = 0
    #: recompute activations every this many layers in the backward pass (0: keep them)
    activation_checkpoint_interval: int = 0
    #: learning rate: linear warm-up over this many steps, then "constant" or "cosine" decay to
    #: lr x lr_min_ratio at the last step
    lr_warmup_steps: int = 0
    lr_decay: str = "constant"
    lr_min_ratio: float = 0.0
    checkpoint_dir: Path | None = None
    #: steps between periodic checkpoints; 0: only on a signal and at the end; "auto": every
    #: Young/Daly interval of training (pipeswift_slurm.interval)
    checkpoint_interval: int | str = "auto"
    keep_checkpoints: int = 2
    #: a rank making no progress for max(hang_timeout_min_s, hang_timeout_factor x p95 step
    #: time) ends the attempt and requeues it (the hung rank's node excluded where possible)
    hang_timeout_factor: float = 10.0
    hang_timeout_min_s: float = 300.0
    #: the micro-batch sizes the planner may choose from (a list, or every power of two dividing
    #: the global batch with "auto"); () = micro_batch_size only
    micro_batch_sizes: tuple[int, ...] = ()

    @property
    def micro_batch_options(self) -> tuple[int, ...]:
        return self.micro_batch_sizes or (self.micro_batch_size,)


class PipelineSection(NamedTuple):
    stages: int | str = "auto"
    micro_batches: int | str = "auto"
    partition: str | tuple[int, ...] = "auto"
    data_parallel: int | None = None
    #: re-cut the stages in place from measured layer times when that pays (explicit
    #: boundaries are never re-cut)
    rebalance: bool = True


class TrainConfig(NamedTuple):
    path: Path
    job: JobSection
    resources: ResourcesSection
    model: ModelSection
    training: TrainingSection
    pipeline: PipelineSection
    raw: dict[str, Any]

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    @property
    def layer_count(self) -> int | None:
        """Number of pipeline layers if the TOML tells (num_layers, layer_costs or boundaries)."""
        m = self.model
        if m.num_layers is not None:
            return m.num_layers
        if m.layer_costs is not None:
            return len(m.layer_costs)
        if isinstance(self.pipeline.partition, tuple):
            return self.pipeline.partition[-1]
        return None


# ----------------------------------------------------------------------------- value checkers
def _where(section: str, key: str) -> str:
    return f"[{section}] {key}"


def _type_name(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(v), type(v).__name__)


#: the largest sizes pswift plans for (each a clear error above it): enough for any cluster job,
#: small enough that enumerating and simulating every candidate stays well under a second
LIMITS = {"nodes": 4096, "node_range": 16, "tasks_per_node": 16, "micro_batches": 4096,
          "layers": 512, "int": 2**31 - 1, "depth": 16}


def _int(section: str, key: str, v: Any, lo: int = 1, hi: int = LIMITS["int"]) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{_where(section, key)} must be an integer, got {_type_name(v)} {_short(v)}")
    if v < lo:
        raise ConfigError(f"{_where(section, key)} = {_short(v)} must be >= {lo}")
    if v > hi:
        raise ConfigError(f"{_where(section, key)} = {_short(v)} is larger than pswift supports "
                          f"({hi}); use a smaller value")
    return v


def _short(v: Any) -> str:
    text = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else f"<{len(str(abs(v)))}-digit integer>"
    return text if len(text) <= 80 else text[:77] + "..."


def _json_value(where: str, v: Any, depth: int = 0) -> None:
    """Tables passed on to Python code and DeepSpeed (kwargs, ds_config, optimizer params) must
    be JSON-like: no dates or times, finite numbers, int64 integers, bounded nesting."""
    if depth > LIMITS["depth"]:
        raise ConfigError(f"{where} is nested deeper than {LIMITS['depth']} levels; flatten it")
    if isinstance(v, dict):
        for k, x in v.items():
            _json_value(f"{where}.{k}", x, depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _json_value(f"{where}[{i}]", x, depth + 1)
    elif isinstance(v, bool) or isinstance(v, str) or v is None:
        return
    elif isinstance(v, int):
        if not -2**63 <= v < 2**63:
            raise ConfigError(f"{where} = {_short(v)} does not fit in 64 bits; use a smaller number")
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigError(f"{where} = {v} is not a finite number; use a finite value")
    else:
        raise ConfigError(f"{where} = {_short(v)} is a TOML {_type_name(v)}, which cannot be passed "
                          f"on; write it as a string")


def _str(section: str, key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{_where(section, key)} must be a string, got {_type_name(v)} {v!r}")
    if not v.strip():
        raise ConfigError(f"{_where(section, key)} must not be empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ConfigError(f"{_where(section, key)} = {v!r} contains a control character "
                          f"(newline, tab...): remove it")
    return v


def _float(section: str, key: str, v: Any, lo: float = 0.0) -> float:
    f = finite(v)
    if f is None:
        shown = (f"an integer of {len(str(abs(v)))} digits, too large for a float" if isinstance(v, int)
                 and not isinstance(v, bool) else f"{_type_name(v)} {v!r}")
        raise ConfigError(f"{_where(section, key)} must be a finite number, got {shown}")
    if f < lo:
        raise ConfigError(f"{_where(section, key)} = {v} must be >= {lo}")
    return f


def _table(section: str, key: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(f"{_where(section, key)} must be a table, got {_type_name(v)} {_short(v)}")
    _json_value(_where(section, key), v)
    return v


def _entry(section: str, key: str, v: Any, base_dir: Path) -> str:
    v = _str(section, key, v)
    if not _ENTRY_RE.match(v):
        raise ConfigError(f"{_where(section, key)} = {v!r} must look like 'module:function' "
                          f"(e.g. 'model:build_layers')")
    module = v.split(":")[0]
    top = module.split(".")[0]
    rel = Path(*module.split("."))
    if not ((base_dir / f"{rel}.py").is_file() or (base_dir / rel / "__init__.py").is_file()
            or (base_dir / top).is_dir() or importlib.util.find_spec(top) is not None):
        raise ConfigError(f"{_where(section, key)} = {v!r}: module {module!r} not found next to "
                          f"{base_dir} nor on the Python path: create {base_dir / rel}.py or fix the name")
    return v


def slurm_time_seconds(text: str) -> int:
    """Seconds in a Slurm time string: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    m = _TIME_RE.match(text.strip())
    if not m:
        raise ValueError(text)
    d, a, b, c = (int(x) if x is not None else None for x in m.group("d", "a", "b", "c"))
    if d is not None:  # D-H[:M[:S]]
        return ((d * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None:  # H:M:S
        return (a * 60 + b) * 60 + c
    if b is not None:  # M:S
        return a * 60 + b
    return a * 60  # M


# ----------------------------------------------------------------------------- sections
def _check_keys(section: str, table: dict[str, Any], valid: tuple[str, ...],
                required: tuple[str, ...] = ()) -> None:
    for key in table:
        if key not in valid:
            import difflib
            near = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"unknown key {_where(section, key)}{hint}; valid keys: {', '.join(valid)}")
    for key in required:
        if key not in table:
            raise ConfigError(f"missing required key {_where(section, key)}")


#: [job] objective: expected JCT, or a quantile of its distribution (pipeswift_slurm.risk)
OBJECTIVES = ("mean", "p50", "p90")


def _grow_check(v: Any) -> int:
    s = _int("job", "grow_check_s", v, lo=0, hi=86400)
    if 0 < s < 5:
        raise ConfigError(f"[job] grow_check_s = {s}: check at most every 5 s (each check asks "
                          f"Slurm), or 0 never to grow")
    return s


def _job(t: dict[str, Any]) -> JobSection:
    valid = ("name", "partition", "time", "account", "qos", "sbatch_options", "max_requeues", "python",
             "objective", "grow_check_s", "max_restarts")
    _check_keys("job", t, valid, ("name",))
    time = t.get("time")
    if time is not None:
        if isinstance(time, int) and not isinstance(time, bool):
            time = str(_int("job", "time", time))
        time = _str("job", "time", time)
        try:
            if slurm_time_seconds(time) <= 0:
                raise ValueError(time)
        except ValueError:
            raise ConfigError(f"[job] time = {time!r} is not a Slurm time limit: use minutes, "
                              f"'H:MM:SS' or 'D-HH:MM:SS' (e.g. '0:30:00')") from None
    opts = t.get("sbatch_options", [])
    if not isinstance(opts, list):
        raise ConfigError(f"[job] sbatch_options must be an array of strings like '--qos=high', "
                          f"got {_type_name(opts)} {opts!r}")
    for o in opts:
        o = _str("job", "sbatch_options", o)
        if not o.startswith("-"):
            raise ConfigError(f"[job] sbatch_options entry {o!r} must be an sbatch option "
                              f"starting with '-' (e.g. '--qos=high')")
    return JobSection(
        name=_str("job", "name", t["name"]),
        partition=_str("job", "partition", t["partition"]) if "partition" in t else None,
        time=time,
        account=_str("job", "account", t["account"]) if "account" in t else None,
        qos=_str("job", "qos", t["qos"]) if "qos" in t else None,
        sbatch_options=tuple(opts),
        max_requeues=_int("job", "max_requeues", t.get("max_requeues", MAX_REQUEUES_DEFAULT), lo=0),
        max_restarts=_int("job", "max_restarts", t.get("max_restarts", MAX_RESTARTS_DEFAULT), lo=0,
                          hi=MAX_RESTARTS_LIMIT),
        python=_str("job", "python", t["python"]) if "python" in t else None,
        objective=_choice("job", "objective", t.get("objective", "mean"), OBJECTIVES),
        grow_check_s=_grow_check(t.get("grow_check_s", 60)),
    )


def _resources(t: dict[str, Any]) -> ResourcesSection:
    valid = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "device")
    _check_keys("resources", t, valid)
    nodes = t.get("nodes", 1)
    if isinstance(nodes, list):
        if len(nodes) != 2:
            raise ConfigError(f"[resources] nodes = {nodes!r} must be an integer or a [min, max] pair")
        lo = _int("resources", "nodes", nodes[0], hi=LIMITS["nodes"])
        hi = _int("resources", "nodes", nodes[1], hi=LIMITS["nodes"])
        if lo > hi:
            raise ConfigError(f"[resources] nodes = [{lo}, {hi}]: min > max; write [{hi}, {lo}]")
        if hi - lo >= LIMITS["node_range"]:
            raise ConfigError(f"[resources] nodes = [{lo}, {hi}] spans {hi - lo + 1} node counts; "
                              f"pswift plans at most {LIMITS['node_range']}: narrow the range")
    else:
        lo = hi = _int("resources", "nodes", nodes, hi=LIMITS["nodes"])
    device = _str("resources", "device", t.get("device", "cpu"))
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"[resources] device = {device!r} must be 'cpu' or 'cuda'")
    gpus = _int("resources", "gpus_per_node", t.get("gpus_per_node", 0), lo=0)
    tasks = _int("resources", "tasks_per_node", t.get("tasks_per_node", gpus or 1), hi=LIMITS["tasks_per_node"])
    if device == "cuda" and gpus == 0:
        raise ConfigError("[resources] device = 'cuda' needs gpus_per_node >= 1 "
                          "(set gpus_per_node = tasks_per_node, one GPU per task)")
    if device == "cuda" and tasks > gpus:
        raise ConfigError(f"[resources] tasks_per_node = {tasks} > gpus_per_node = {gpus}: one task "
                          f"drives one GPU; set tasks_per_node = {gpus}")
    return ResourcesSection(nodes_min=lo, nodes_max=hi, tasks_per_node=tasks, gpus_per_node=gpus,
                            cpus_per_task=_int("resources", "cpus_per_task", t.get("cpus_per_task", 1)),
                            device=device)


def _model(t: dict[str, Any], base_dir: Path) -> ModelSection:
    valid = ("entry", "kwargs", "loss", "num_layers", "layer_costs", "layer_memory")
    _check_keys("model", t, valid, ("entry",))
    costs = mem = None
    for key in ("layer_costs", "layer_memory"):
        if isinstance(t.get(key), list) and len(t[key]) > LIMITS["layers"]:
            raise ConfigError(f"[model] {key} has {len(t[key])} layers; pswift plans at most "
                              f"{LIMITS['layers']}: group layers into larger blocks")
    if "layer_costs" in t:
        v = t["layer_costs"]
        if not isinstance(v, list) or not v:
            raise ConfigError(f"[model] layer_costs must be a non-empty array of seconds per layer, got {_short(v)}")
        costs = tuple(_float("model", "layer_costs", x) for x in v)
    if "layer_memory" in t:
        v = t["layer_memory"]
        if not isinstance(v, list) or not v:
            raise ConfigError(f"[model] layer_memory must be a non-empty array of bytes per layer, got {_short(v)}")
        mem = tuple(_int("model", "layer_memory", x, lo=0, hi=2**62) for x in v)
    num_layers = _int("model", "num_layers", t["num_layers"], hi=LIMITS["layers"]) if "num_layers" in t else None
    lengths = {k: n for k, n in (("num_layers", num_layers), ("layer_costs", costs and len(costs)),
                                 ("layer_memory", mem and len(mem))) if n}
    if len(set(lengths.values())) > 1:
        raise ConfigError("[model] layer counts disagree: " +
                          ", ".join(f"{k} gives {n}" for k, n in lengths.items()) +
                          "; give one value per layer")
    return ModelSection(
        entry=_entry("model", "entry", t["entry"], base_dir),
        kwargs=_table("model", "kwargs", t.get("kwargs", {})),
        loss=_entry("model", "loss", t["loss"], base_dir) if "loss" in t else None,
        num_layers=num_layers, layer_costs=costs, layer_memory=mem,
    )


PRECISIONS = ("fp32", "bf16", "fp16")
LR_DECAYS = ("constant", "cosine")
#: DeepSpeed settings pswift sets itself from train.toml: (where to say it instead)
DS_CONFIG_OWNED = {
    "bf16": '[training] precision = "bf16"', "fp16": '[training] precision = "fp16"',
    "zero_optimization": "[training] zero_stage", "optimizer": "[training] optimizer",
    "scheduler": "[training] lr_warmup_steps / lr_decay / lr_min_ratio",
    "gradient_clipping": "[training] gradient_clipping",
    "train_batch_size": "[training] global_batch_size",
    "train_micro_batch_size_per_gpu": "[training] micro_batch_size",
    "gradient_accumulation_steps": "[pipeline] micro_batches (or let the planner choose it)",
}
#: DeepSpeed settings passed through: none changes what a checkpoint holds or how it reshapes
DS_CONFIG_PASSED = ("steps_per_print", "wall_clock_breakdown", "communication_data_type",
                    "prescale_gradients", "gradient_predivide_factor", "activation_checkpointing",
                    "comms_logger", "flops_profiler", "timers", "memory_breakdown", "dump_state")


def _ds_config(v: Any) -> dict[str, Any]:
    """[training] ds_config: only settings the checkpoint can save and reshape, refused here
    (plan time) rather than discovered at the job's first checkpoint."""
    table = _table("training", "ds_config", v)
    for key in table:
        if key in DS_CONFIG_OWNED:
            raise ConfigError(f"[training] ds_config.{key} is set by pswift (it must stay "
                              f"checkpointable across stage counts): use {DS_CONFIG_OWNED[key]} instead")
        if key not in DS_CONFIG_PASSED:
            raise ConfigError(f"[training] ds_config.{key}: pswift cannot checkpoint and reshape a "
                              f"job with this DeepSpeed setting; it passes on only "
                              f"{', '.join(DS_CONFIG_PASSED)}")
    return table


TOKEN_DTYPES = {"uint16": 2, "uint32": 4}


def _token_file(t: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    _check_keys("training.data", t, ("tokens", "dtype", "seq_len"), ("tokens", "seq_len"))
    path = (base_dir / _str("training.data", "tokens", t["tokens"])).resolve()
    dtype = _choice("training.data", "dtype", t.get("dtype", "uint16"), tuple(TOKEN_DTYPES))
    seq_len = _int("training.data", "seq_len", t["seq_len"])
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError:
        size = None
    if size is None:
        raise ConfigError(f"[training] data.tokens = {str(t['tokens'])!r}: no such file ({path}); "
                          f"write your token ids there as a flat {dtype} array")
    if size % TOKEN_DTYPES[dtype]:
        raise ConfigError(f"[training] data.tokens: {path} has {size} bytes, not a whole number of "
                          f"{dtype} tokens; is dtype right?")
    if size // TOKEN_DTYPES[dtype] < seq_len + 2:
        raise ConfigError(f"[training] data.tokens: {path} holds {size // TOKEN_DTYPES[dtype]} tokens, "
                          f"fewer than seq_len + 2 = {seq_len + 2}; use a shorter seq_len")
    return {"tokens": str(path), "dtype": dtype, "seq_len": seq_len}


def _data(v: Any, base_dir: Path) -> str | dict[str, Any]:
    """[training] data: a batch function, a token file or a map-style Dataset."""
    if isinstance(v, str):
        return _entry("training", "data", v, base_dir)
    if not isinstance(v, dict):
        raise ConfigError(f"[training] data must be 'module:function' or a table ({{ tokens = ..., "
                          f"seq_len = ... }} or {{ dataset = 'module:function' }}), got {_type_name(v)}")
    if "tokens" in v:
        return _token_file(v, base_dir)
    if "dataset" in v:
        _check_keys("training.data", v, ("dataset", "kwargs"))
        return {"dataset": _entry("training.data", "dataset", v["dataset"], base_dir),
                "kwargs": _table("training.data", "kwargs", v.get("kwargs", {}))}
    raise ConfigError("[training] data table needs tokens = 'path' (a token file) or dataset = "
                      "'module:function' (a map-style Dataset)")


def _choice(section: str, key: str, v: Any, choices: tuple[Any, ...]) -> Any:
    if not any(type(v) is type(c) and v == c for c in choices):
        raise ConfigError(f"{_where(section, key)} = {_short(v)} must be one of "
                          f"{', '.join(repr(c) if isinstance(c, str) else str(c) for c in choices)}")
    return v


def _micro_batch_sizes(v: Any, gbs: int) -> tuple[int, ...]:
    """The sizes a list or "auto" gives the planner (() for an integer: that size only)."""
    if v == "auto":   # every power of two dividing the batch, at most LIMITS micro-batches a step
        return tuple(1 << k for k in range(gbs.bit_length())
                     if gbs % (1 << k) == 0 and gbs >> k <= LIMITS["micro_batches"])
    if not isinstance(v, list):
        return ()
    if not v or len(v) > 32:
        raise ConfigError(f"[training] micro_batch_size list has {len(v)} sizes: give 1 to 32, or \"auto\"")
    sizes = [_int("training", "micro_batch_size", x) for x in v]
    bad = [x for x in sizes if gbs % x]
    if bad:
        raise ConfigError(f"[training] micro_batch_size {bad} do not divide global_batch_size = {gbs}: "
                          f"use divisors of {gbs}")
    return tuple(dict.fromkeys(sizes))


def _training(t: dict[str, Any], base_dir: Path) -> TrainingSection:
    valid = ("steps", "global_batch_size", "micro_batch_size", "data", "seed", "optimizer",
             "ds_config", "gradient_clipping", "precision", "zero_stage",
             "activation_checkpoint_interval", "lr_warmup_steps", "lr_decay", "lr_min_ratio",
             "checkpoint_dir", "checkpoint_interval", "keep_checkpoints", "hang_timeout_factor",
             "hang_timeout_min_s")
    _check_keys("training", t, valid, ("steps", "global_batch_size", "micro_batch_size", "data"))
    opt = _table("training", "optimizer", t.get("optimizer", {}))
    if opt:
        _check_keys("training.optimizer", opt, ("type", "params"))
        _str("training.optimizer", "type", opt.get("type", "AdamW"))
        _table("training.optimizer", "params", opt.get("params", {}))
    _json_value("[training] optimizer", opt)
    ckpt_dir = None
    if "checkpoint_dir" in t:
        ckpt_dir = (base_dir / _str("training", "checkpoint_dir", t["checkpoint_dir"])).resolve()
    gbs = _int("training", "global_batch_size", t["global_batch_size"])
    options = _micro_batch_sizes(t["micro_batch_size"], gbs)
    mbs = options[0] if options else _int("training", "micro_batch_size", t["micro_batch_size"])
    if gbs % mbs:
        raise ConfigError(f"[training] global_batch_size = {gbs} is not a multiple of "
                          f"micro_batch_size = {mbs}: pick a global batch in "
                          f"{{{gbs // mbs * mbs or mbs}, {(gbs // mbs + 1) * mbs}}}")
    if _float("training", "lr_min_ratio", t.get("lr_min_ratio", 0.0)) > 1:
        raise ConfigError(f"[training] lr_min_ratio = {t['lr_min_ratio']} must be <= 1 (the final "
                          f"learning rate as a fraction of the peak)")
    return TrainingSection(
        steps=_int("training", "steps", t["steps"]),
        global_batch_size=gbs, micro_batch_size=mbs,
        data=_data(t["data"], base_dir),
        seed=_int("training", "seed", t.get("seed", 1), lo=0),
        optimizer=opt,
        ds_config=_ds_config(t.get("ds_config", {})),
        gradient_clipping=_float("training", "gradient_clipping", t.get("gradient_clipping", 0.0)),
        precision=_choice("training", "precision", t.get("precision", "fp32"), PRECISIONS),
        zero_stage=_choice("training", "zero_stage", t.get("zero_stage", 0), (0, 1)),
        activation_checkpoint_interval=_int("training", "activation_checkpoint_interval",
                                            t.get("activation_checkpoint_interval", 0), lo=0),
        lr_warmup_steps=_int("training", "lr_warmup_steps", t.get("lr_warmup_steps", 0), lo=0),
        lr_decay=_choice("training", "lr_decay", t.get("lr_decay", "constant"), LR_DECAYS),
        lr_min_ratio=_float("training", "lr_min_ratio", t.get("lr_min_ratio", 0.0)),
        checkpoint_dir=ckpt_dir,
        checkpoint_interval=_int_or_auto("training", "checkpoint_interval", t.get("checkpoint_interval", "auto"), lo=0),
        keep_checkpoints=_int("training", "keep_checkpoints", t.get("keep_checkpoints", 2), lo=2),
        hang_timeout_factor=_float("training", "hang_timeout_factor", t.get("hang_timeout_factor", 10.0), lo=2.0),
        hang_timeout_min_s=_float("training", "hang_timeout_min_s", t.get("hang_timeout_min_s", 300.0), lo=1.0),
        micro_batch_sizes=options,
    )


def _int_or_auto(section: str, key: str, v: Any, lo: int = 1) -> int | str:
    if v == "auto":
        return "auto"
    if isinstance(v, str):
        what = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        raise ConfigError(f"{_where(section, key)} = {_short(v)} must be {what} or \"auto\"")
    return _int(section, key, v, lo=lo)


def _pipeline(t: dict[str, Any]) -> PipelineSection:
    valid = ("stages", "micro_batches", "partition", "data_parallel", "rebalance")
    _check_keys("pipeline", t, valid)
    rebalance = t.get("rebalance", True)
    if not isinstance(rebalance, bool):
        raise ConfigError(f"[pipeline] rebalance = {_short(rebalance)} must be true or false")
    part = t.get("partition", "auto")
    if isinstance(part, list):
        b = [_int("pipeline", "partition", x, lo=0) for x in part]
        if len(b) < 2 or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:])):
            raise ConfigError(f"[pipeline] partition = {part!r}: explicit boundaries must start at 0 "
                              f"and strictly increase to the layer count, e.g. [0, 3, 6] for 2 stages "
                              f"of 6 layers")
        part = tuple(b)
    else:
        part = _str("pipeline", "partition", part)
        if part not in ("auto", "uniform", "parameters"):
            raise ConfigError(f"[pipeline] partition = {part!r} must be \"auto\", \"uniform\", "
                              f"\"parameters\" or an array of boundaries like [0, 3, 6]")
    stages = _int_or_auto("pipeline", "stages", t.get("stages", "auto"))
    if isinstance(part, tuple) and stages != "auto" and stages != len(part) - 1:
        raise ConfigError(f"[pipeline] partition {list(part)} gives {len(part) - 1} stages but "
                          f"stages = {stages}: make them agree")
    if isinstance(part, tuple) and stages == "auto":
        stages = len(part) - 1
    dp = t.get("data_parallel")
    return PipelineSection(
        stages=stages,
        micro_batches=_int_or_auto("pipeline", "micro_batches", t.get("micro_batches", "auto")),
        partition=part,
        data_parallel=None if dp is None else _int("pipeline", "data_parallel", dp),
        rebalance=rebalance,
    )


# ----------------------------------------------------------------------------- entry points
def parse_config(data: dict[str, Any], path: Path) -> TrainConfig:
    """Validate a parsed TOML document (``path`` anchors relative paths)."""
    path = Path(path).resolve()
    for key, value in data.items():
        if key not in SECTIONS:
            raise ConfigError(f"unknown section [{key}]; valid sections: {', '.join(SECTIONS)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{key!r} must be a [{key}] section (a table), got {_type_name(value)}")
    for sec in ("job", "model", "training"):
        if sec not in data:
            raise ConfigError(f"missing section [{sec}]")
    cfg = TrainConfig(
        path=path,
        job=_job(data["job"]),
        resources=_resources(data.get("resources", {})),
        model=_model(data["model"], path.parent),
        training=_training(data["training"], path.parent),
        pipeline=_pipeline(data.get("pipeline", {})),
        raw=data,
    )
    if cfg.training.precision == "fp16" and cfg.training.zero_stage == 0:
        raise ConfigError('[training] precision = "fp16" needs zero_stage = 1 (pswift checkpoints '
                          'fp16 master weights and the loss scale through ZeRO-1\'s partitions): set '
                          'zero_stage = 1, or use precision = "bf16"')
    if cfg.training.precision == "fp16" and cfg.resources.device != "cuda":
        raise ConfigError(f'[training] precision = "fp16" needs a GPU (DeepSpeed refuses fp16 on '
                          f'{cfg.resources.device}): use precision = "bf16", or [resources] device = "cuda"')
    n = cfg.layer_count
    stages = cfg.pipeline.stages
    if n is not None and isinstance(stages, int) and stages > n:
        raise ConfigError(f"[pipeline] stages = {stages} > {n} layers: every stage needs at least "
                          f"one layer; use stages <= {n}")
    if n is not None and isinstance(cfg.pipeline.partition, tuple) and cfg.pipeline.partition[-1] != n:
        raise ConfigError(f"[pipeline] partition ends at {cfg.pipeline.partition[-1]} but the model "
                          f"has {n} layers: the last boundary must be {n}")
    return cfg


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate ``train.toml``; raises :class:`ConfigError` with one clear line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such file; pass the path of your train.toml")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text ({e.reason}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {' '.join(str(e).split())}") from None
    except (ValueError, RecursionError) as e:   # a 5000-digit integer, arrays nested 1000 deep
        raise ConfigError(f"{p}: TOML that cannot be read ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:120]}); simplify the value") from None
    try:
        return parse_config(data, p)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None

