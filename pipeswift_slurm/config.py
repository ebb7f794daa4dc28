"""train.toml: strict parsing into typed, immutable sections (named tuples: a tenth of a frozen
dataclass's start-up cost, which `pswift sbatch` pays on every submission), whose fields are
generated from the settings table (pipeswift_slurm/sections.py).

Unknown keys are rejected with the list of valid ones; wrong types and out-of-range values name
the key, the value and the fix. Cross-section invariants that depend on the node count
(pp x dp = world size, micro-batch x m x dp = global batch) are checked in :mod:`plan`.
Paths resolve relative to the TOML file.
"""

from __future__ import annotations

# Imports inside functions: copy, difflib and json serve a dict config, an unknown key's
# suggestion and overrides only (every submission parses a config)

import sys
from pathlib import Path
from typing import Any, NamedTuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pipeswift_slurm import configvalues as values, runfiles
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.sections import JobFields, ModelFields, PipelineFields, ResourcesFields, TrainingFields
from pipeswift_slurm.settings import LIMITS, SECTIONS, Setting, default, keys, required, setting
from pipeswift_slurm.slurm.timespec import slurm_time_seconds


#: [job] max_restarts / max_requeues: their defaults and bounds (pipeswift_slurm.planning.decide uses them)
MAX_RESTARTS_DEFAULT: int = setting("job", "max_restarts").default
MAX_RESTARTS_LIMIT = int(setting("job", "max_restarts").hi or 0)
MAX_REQUEUES_DEFAULT: int = setting("job", "max_requeues").default


# The sections: their fields are generated from pipeswift_slurm.settings (sections.py: one field
# per setting, or the fields a setting declares it becomes); here only what is computed from them.
# No defaults: the parser fills every field from the table.
class JobSection(JobFields):
    __slots__ = ()

    @property
    def time_seconds(self) -> int | None:
        return None if self.time is None else slurm_time_seconds(self.time)


class ResourcesSection(ResourcesFields):
    __slots__ = ()

    @property
    def node_counts(self) -> range:
        return range(self.nodes_min, self.nodes_max + 1)

    @property
    def nodes_spec(self) -> str:
        """Slurm's --nodes value: ``2`` or ``2-4``."""
        if self.nodes_min == self.nodes_max:
            return str(self.nodes_min)
        return f"{self.nodes_min}-{self.nodes_max}"


class ModelSection(ModelFields):
    __slots__ = ()


class TrainingSection(TrainingFields):
    __slots__ = ()

    @property
    def micro_batch_options(self) -> tuple[int, ...]:
        return self.micro_batch_sizes or (self.micro_batch_size,)


class PipelineSection(PipelineFields):
    __slots__ = ()


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


# ----------------------------------------------------------------------------- sections
def _check_keys(section: str, table: dict[str, Any], valid: tuple[str, ...],
                required: tuple[str, ...] = ()) -> None:
    for key in table:
        if key not in valid:
            import difflib
            near = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"unknown key {values.where(section, key)}{hint}; valid keys: {', '.join(valid)}")
    for key in required:
        if key not in table:
            raise ConfigError(f"missing required key {values.where(section, key)}")


def _checked(s: Setting, v: Any) -> Any:
    """A value of a setting of a generic kind, checked against the table's kind and bounds."""
    if s.kind == "int":
        return values.int_value(s.section, s.key, v, lo=1 if s.lo is None else int(s.lo),
                    hi=LIMITS["int"] if s.hi is None else int(s.hi))
    if s.kind == "int|auto":
        return values.int_or_auto(s.section, s.key, v, lo=1 if s.lo is None else int(s.lo))
    if s.kind == "float":
        f = values.float_value(s.section, s.key, v, lo=s.lo or 0.0)
        if s.hi is not None and f > s.hi:
            raise ConfigError(f"{values.where(s.section, s.key)} = {v} must be <= {s.hi:g} ({s.doc})")
        return f
    if s.kind == "str":
        return values.str_value(s.section, s.key, v)
    if s.kind == "bool":
        if not isinstance(v, bool):
            raise ConfigError(f"{values.where(s.section, s.key)} = {values.short(v)} must be true or false")
        return v
    if s.kind == "choice":
        return values.choice(s.section, s.key, v, s.choices)
    if s.kind == "choices":      # a list, each item one of the choices, each once
        if not isinstance(v, list) or any(not isinstance(x, str) or x not in s.choices for x in v):
            raise ConfigError(f"{values.where(s.section, s.key)} = {values.short(v)}: give a list of "
                              f"{', '.join(repr(c) for c in s.choices)} (or [] for none)")
        return list(dict.fromkeys(v))
    raise AssertionError(f"{s.name} has its own checker")


def _generic(section: str, t: dict[str, Any]) -> dict[str, Any]:
    """``[section]``'s settings of a generic kind: each value checked, or its default."""
    out = {}
    for key in keys(section):
        s = setting(section, key)
        if s.kind != "special":
            out[key] = _checked(s, t[key]) if key in t else s.default.copy() if isinstance(s.default, list) else s.default
    return out


#: [job] objective: expected JCT, or a quantile of its distribution (pipeswift_slurm.planning.risk)
OBJECTIVES: tuple[str, ...] = setting("job", "objective").choices


def _grow_check(v: Any) -> int:
    limits = setting("job", "grow_check_s")
    s = values.int_value("job", "grow_check_s", v, lo=int(limits.lo or 0), hi=int(limits.hi or 0))
    if 0 < s < 5:
        raise ConfigError(f"[job] grow_check_s = {s}: check at most every 5 s (each check asks "
                          f"Slurm), or 0 never to grow")
    return s


def _job(t: dict[str, Any]) -> JobSection:
    _check_keys("job", t, keys("job"), required("job"))
    time = t.get("time")
    if time is not None:
        if isinstance(time, int) and not isinstance(time, bool):
            time = str(values.int_value("job", "time", time))
        time = values.str_value("job", "time", time)
        try:
            if slurm_time_seconds(time) <= 0:
                raise ValueError(time)
        except ValueError:
            raise ConfigError(f"[job] time = {time!r} is not a Slurm time limit: use minutes, "
                              f"'H:MM:SS' or 'D-HH:MM:SS' (e.g. '0:30:00')") from None
    opts = t.get("sbatch_options", list(default("job", "sbatch_options")))
    if not isinstance(opts, list):
        raise ConfigError(f"[job] sbatch_options must be an array of strings like '--qos=high', "
                          f"got {values.type_name(opts)} {opts!r}")
    for o in opts:
        o = values.str_value("job", "sbatch_options", o)
        if not o.startswith("-"):
            raise ConfigError(f"[job] sbatch_options entry {o!r} must be an sbatch option "
                              f"starting with '-' (e.g. '--qos=high')")
    parts = _partitions(t.get("partition"))
    return JobSection(**_generic("job", t), partition=parts[0] if parts else None, partitions=parts,
                      time=time, sbatch_options=tuple(opts),
                      grow_check_s=_grow_check(t.get("grow_check_s", default("job", "grow_check_s"))))


#: partitions one job may list (each is planned, and Slurm weighs each)
MAX_PARTITIONS = 8


def _partitions(v: Any) -> tuple[str, ...]:
    """[job] partition: a name or a list of distinct names (Slurm's own rule: no comma in one)."""
    if v is None:
        return ()
    names = v if isinstance(v, list) else [v]
    if not names or len(names) > MAX_PARTITIONS:
        raise ConfigError(f"[job] partition lists {len(names)} partitions: give 1 to {MAX_PARTITIONS}")
    out = []
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"[job] partition must be a string or an array of strings, got "
                              f"{values.type_name(name)} {values.short(name)}")
        name = values.str_value("job", "partition", name)
        if "," in name or name != name.strip():
            raise ConfigError(f"[job] partition {name!r}: one name per entry, without commas or spaces "
                              f"around it (a list is written [\"a\", \"b\"])")
        if name in out:
            raise ConfigError(f"[job] partition lists {name!r} twice: list each partition once")
        out.append(name)
    return tuple(out)


def _resources(t: dict[str, Any]) -> ResourcesSection:
    _check_keys("resources", t, keys("resources"), required("resources"))
    fields = _generic("resources", t)
    nodes = t.get("nodes", default("resources", "nodes"))
    if isinstance(nodes, list):
        if len(nodes) != 2:
            raise ConfigError(f"[resources] nodes = {nodes!r} must be an integer or a [min, max] pair")
        lo = values.int_value("resources", "nodes", nodes[0], hi=LIMITS["nodes"])
        hi = values.int_value("resources", "nodes", nodes[1], hi=LIMITS["nodes"])
        if lo > hi:
            raise ConfigError(f"[resources] nodes = [{lo}, {hi}]: min > max; write [{hi}, {lo}]")
        if hi - lo >= LIMITS["node_range"]:
            raise ConfigError(f"[resources] nodes = [{lo}, {hi}] spans {hi - lo + 1} node counts; "
                              f"pswift plans at most {LIMITS['node_range']}: narrow the range")
    else:
        lo = hi = values.int_value("resources", "nodes", nodes, hi=LIMITS["nodes"])
    device, gpus = fields["device"], fields["gpus_per_node"]
    tasks = fields["tasks_per_node"] = fields["tasks_per_node"] or gpus or 1
    if device == "cuda" and gpus == 0:
        raise ConfigError("[resources] device = 'cuda' needs gpus_per_node >= 1 "
                          "(set gpus_per_node = tasks_per_node, one GPU per task)")
    if device == "cuda" and tasks > gpus:
        raise ConfigError(f"[resources] tasks_per_node = {tasks} > gpus_per_node = {gpus}: one task "
                          f"drives one GPU; set tasks_per_node = {gpus}")
    _check_members(fields["members"], fields["member_nodes"], lo, hi)
    return ResourcesSection(nodes_min=lo, nodes_max=hi, **fields)


def _check_members(members: int | str, member_nodes: int, lo: int, hi: int) -> None:
    """A run of members: at least two, whose nodes together are the node range's top."""
    if members == 0 or members == "auto":   # auto: the planner's choice (pipeswift_slurm.planning.members)
        return
    if members == 1:
        raise ConfigError("[resources] members = 1 is one job: write members = 0 (the default), or 2 or more")
    if members * member_nodes != hi:
        raise ConfigError(f"[resources] members = {members} of member_nodes = {member_nodes} make "
                          f"{members * member_nodes} nodes, but nodes' top is {hi}: write nodes = "
                          f"[{min(lo, members * member_nodes)}, {members * member_nodes}]")
    if lo % member_nodes:
        raise ConfigError(f"[resources] nodes' bottom {lo} is not a whole number of members of {member_nodes} "
                          f"node(s): write nodes = [{max(member_nodes, lo - lo % member_nodes)}, {hi}]")


def _model(t: dict[str, Any], base_dir: Path) -> ModelSection:
    _check_keys("model", t, keys("model"), required("model"))
    fields = _generic("model", t)
    costs = mem = None
    for key in ("layer_costs", "layer_memory"):
        if isinstance(t.get(key), list) and len(t[key]) > LIMITS["layers"]:
            raise ConfigError(f"[model] {key} has {len(t[key])} layers; pswift plans at most "
                              f"{LIMITS['layers']}: group layers into larger blocks")
    if "layer_costs" in t:
        v = t["layer_costs"]
        if not isinstance(v, list) or not v:
            raise ConfigError(f"[model] layer_costs must be a non-empty array of seconds per layer, got {values.short(v)}")
        costs = tuple(values.float_value("model", "layer_costs", x) for x in v)
    if "layer_memory" in t:
        v = t["layer_memory"]
        if not isinstance(v, list) or not v:
            raise ConfigError(f"[model] layer_memory must be a non-empty array of bytes per layer, got {values.short(v)}")
        mem = tuple(values.int_value("model", "layer_memory", x, lo=0, hi=2**62) for x in v)
    num_layers = fields["num_layers"]
    lengths = {k: n for k, n in (("num_layers", num_layers), ("layer_costs", costs and len(costs)),
                                 ("layer_memory", mem and len(mem))) if n}
    if len(set(lengths.values())) > 1:
        raise ConfigError("[model] layer counts disagree: " +
                          ", ".join(f"{k} gives {n}" for k, n in lengths.items()) +
                          "; give one value per layer")
    return ModelSection(
        entry=values.entry("model", "entry", t["entry"], base_dir),
        kwargs=values.table("model", "kwargs", t.get("kwargs", dict(default("model", "kwargs")))),
        loss=values.entry("model", "loss", t["loss"], base_dir) if "loss" in t else None,
        num_layers=num_layers, layer_costs=costs, layer_memory=mem,
    )


PRECISIONS: tuple[str, ...] = setting("training", "precision").choices
LR_DECAYS: tuple[str, ...] = setting("training", "lr_decay").choices
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
    table = values.table("training", "ds_config", v)
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


def _token_file(t: dict[str, Any], base_dir: Path, key: str = "data") -> dict[str, Any]:
    _check_keys(f"training.{key}", t, ("tokens", "dtype", "seq_len"), ("tokens", "seq_len"))
    path = (base_dir / values.str_value(f"training.{key}", "tokens", t["tokens"])).resolve()
    dtype = values.choice(f"training.{key}", "dtype", t.get("dtype", "uint16"), tuple(TOKEN_DTYPES))
    seq_len = values.int_value(f"training.{key}", "seq_len", t["seq_len"])
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError:
        size = None
    if size is None:
        raise ConfigError(f"[training] {key}.tokens = {str(t['tokens'])!r}: no such file ({path}); "
                          f"write your token ids there as a flat {dtype} array")
    if size % TOKEN_DTYPES[dtype]:
        raise ConfigError(f"[training] {key}.tokens: {path} has {size} bytes, not a whole number of "
                          f"{dtype} tokens; is dtype right?")
    if size // TOKEN_DTYPES[dtype] < seq_len + 2:
        raise ConfigError(f"[training] {key}.tokens: {path} holds {size // TOKEN_DTYPES[dtype]} tokens, "
                          f"fewer than seq_len + 2 = {seq_len + 2}; use a shorter seq_len")
    return {"tokens": str(path), "dtype": dtype, "seq_len": seq_len}


def _data(v: Any, base_dir: Path, key: str = "data") -> str | dict[str, Any]:
    """[training] data (or eval_data, ``key``): a batch function, a token file or a map-style
    Dataset."""
    if isinstance(v, str):
        return values.entry("training", key, v, base_dir)
    if not isinstance(v, dict):
        raise ConfigError(f"[training] {key} must be 'module:function' or a table ({{ tokens = ..., "
                          f"seq_len = ... }} or {{ dataset = 'module:function' }}), got {values.type_name(v)}")
    if "tokens" in v:
        return _token_file(v, base_dir, key)
    if "dataset" in v:
        _check_keys(f"training.{key}", v, ("dataset", "kwargs"))
        return {"dataset": values.entry(f"training.{key}", "dataset", v["dataset"], base_dir),
                "kwargs": values.table(f"training.{key}", "kwargs", v.get("kwargs", {}))}
    raise ConfigError(f"[training] {key} table needs tokens = 'path' (a token file) or dataset = "
                      f"'module:function' (a map-style Dataset)")


def _micro_batch_sizes(v: Any, gbs: int) -> tuple[int, ...]:
    """The sizes a list or "auto" gives the planner (() for an integer: that size only)."""
    if v == "auto":   # every power of two dividing the batch, at most LIMITS micro-batches a step
        return tuple(1 << k for k in range(gbs.bit_length())
                     if gbs % (1 << k) == 0 and gbs >> k <= LIMITS["micro_batches"])
    if not isinstance(v, list):
        return ()
    if not v or len(v) > 32:
        raise ConfigError(f"[training] micro_batch_size list has {len(v)} sizes: give 1 to 32, or \"auto\"")
    sizes = [values.int_value("training", "micro_batch_size", x) for x in v]
    bad = [x for x in sizes if gbs % x]
    if bad:
        raise ConfigError(f"[training] micro_batch_size {bad} do not divide global_batch_size = {gbs}: "
                          f"use divisors of {gbs}")
    return tuple(dict.fromkeys(sizes))


def _training(t: dict[str, Any], base_dir: Path) -> TrainingSection:
    _check_keys("training", t, keys("training"), required("training"))
    fields = _generic("training", t)
    opt = values.table("training", "optimizer", t.get("optimizer", dict(default("training", "optimizer"))))
    if opt:
        _check_keys("training.optimizer", opt, ("type", "params"))
        values.str_value("training.optimizer", "type", opt.get("type", "AdamW"))
        values.table("training.optimizer", "params", opt.get("params", {}))
    values.json_value("[training] optimizer", opt)
    ckpt_dir = None
    if "checkpoint_dir" in t:
        ckpt_dir = (base_dir / values.str_value("training", "checkpoint_dir", t["checkpoint_dir"])).resolve()
    gbs = fields["global_batch_size"]
    options = _micro_batch_sizes(t["micro_batch_size"], gbs)
    mbs = options[0] if options else values.int_value("training", "micro_batch_size", t["micro_batch_size"])
    if gbs % mbs:
        raise ConfigError(f"[training] global_batch_size = {gbs} is not a multiple of "
                          f"micro_batch_size = {mbs}: pick a global batch in "
                          f"{{{gbs // mbs * mbs or mbs}, {(gbs // mbs + 1) * mbs}}}")
    return TrainingSection(
        **fields, micro_batch_size=mbs, data=_data(t["data"], base_dir), optimizer=opt,
        eval_data=None if t.get("eval_data") is None else _data(t["eval_data"], base_dir, "eval_data"),
        ds_config=_ds_config(t.get("ds_config", dict(default("training", "ds_config")))),
        checkpoint_dir=ckpt_dir, micro_batch_sizes=options)


def _pipeline(t: dict[str, Any]) -> PipelineSection:
    _check_keys("pipeline", t, keys("pipeline"), required("pipeline"))
    fields = _generic("pipeline", t)
    part = t.get("partition", default("pipeline", "partition"))
    if isinstance(part, list):
        b = [values.int_value("pipeline", "partition", x, lo=0) for x in part]
        if len(b) < 2 or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:])):
            raise ConfigError(f"[pipeline] partition = {part!r}: explicit boundaries must start at 0 "
                              f"and strictly increase to the layer count, e.g. [0, 3, 6] for 2 stages "
                              f"of 6 layers")
        part = tuple(b)
    else:
        part = values.str_value("pipeline", "partition", part)
        if part not in ("auto", "uniform", "parameters"):
            raise ConfigError(f"[pipeline] partition = {part!r} must be \"auto\", \"uniform\", "
                              f"\"parameters\" or an array of boundaries like [0, 3, 6]")
    stages = fields.pop("stages")
    if isinstance(part, tuple) and stages != "auto" and stages != len(part) - 1:
        raise ConfigError(f"[pipeline] partition {list(part)} gives {len(part) - 1} stages but "
                          f"stages = {stages}: make them agree")
    if isinstance(part, tuple) and stages == "auto":
        stages = len(part) - 1
    return PipelineSection(**fields, stages=stages, partition=part)


# ----------------------------------------------------------------------------- entry points
def parse_config(data: dict[str, Any], path: Path) -> TrainConfig:
    """Validate a parsed TOML document (``path`` anchors relative paths)."""
    path = Path(path).resolve()
    for key, value in data.items():
        if key not in SECTIONS:
            raise ConfigError(f"unknown section [{key}]; valid sections: {', '.join(SECTIONS)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{key!r} must be a [{key}] section (a table), got {values.type_name(value)}")
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


#: sbatch's options `pswift sbatch` takes before the TOML, each the train.toml key it overrides
COMMAND_LINE_KEYS = {"partition": ("job", "partition"), "time": ("job", "time"), "nodes": ("resources", "nodes"),
                     "account": ("job", "account"), "qos": ("job", "qos"), "job_name": ("job", "name"),
                     "time_policy": ("job", "time_policy")}


def command_line_overrides(**given: str | None) -> dict[str, dict[str, Any]]:
    """sbatch-style values (``-p a,b``, ``-t 5``, ``-N 1-2``, ``-A``, ``-q``, ``-J``) as the
    train.toml keys they override, in TOML's types; ConfigError for a node count that is none.
    An explicit ``-t`` is the limit asked, as sbatch takes it ([job] time_policy "as_written"),
    unless ``time_policy`` is given too ("predicted": the planner's limit within it)."""
    if given.get("time") is not None and given.get("time_policy") is None:
        given = {**given, "time_policy": "as_written"}
    out: dict[str, dict[str, Any]] = {}
    for name, value in given.items():
        if value is None:
            continue
        section, key = COMMAND_LINE_KEYS[name]
        v: Any = value
        if name == "partition" and "," in value:
            v = value.split(",")
        elif name == "nodes":
            lo, dash, hi = value.partition("-")
            if not lo.isdigit() or (dash and not hi.isdigit()):
                raise ConfigError(f"-N {value}: give a node count or MIN-MAX (e.g. -N 2 or -N 1-4)")
            v = [int(lo), int(hi)] if dash else int(lo)
        out.setdefault(section, {})[key] = v
    return out


def describe_overrides(overrides: dict[str, dict[str, Any]]) -> str:
    """``[job] partition = "high", [resources] nodes = [1, 2]``: what the command line set."""
    import json
    return ", ".join(f"[{s}] {k} = {json.dumps(v)}" for s, keys in overrides.items() for k, v in keys.items())


def load_config(path: str | Path, overrides: dict[str, dict[str, Any]] | None = None) -> TrainConfig:
    """Read and validate ``train.toml``, with ``overrides`` ({section: {key: value}}, from the
    command line) in place of its own values; raises :class:`ConfigError` with one clear line."""
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
    return _validated(data, p, overrides)


def config_from_dict(doc: dict[str, Any], base_dir: str | Path = ".",
                     overrides: dict[str, dict[str, Any]] | None = None) -> TrainConfig:
    """A train.toml given as a dict (the TOML's tables as dicts), checked as a file's; relative
    paths ([model] entry's module, data files) are read from ``base_dir``."""
    import copy
    return _validated(copy.deepcopy(doc), Path(base_dir) / runfiles.TOML, overrides)


def _validated(data: dict[str, Any], p: Path, overrides: dict[str, dict[str, Any]] | None) -> TrainConfig:
    for section, keys in (overrides or {}).items():
        table = data.setdefault(section, {})
        if isinstance(table, dict):
            table.update(keys)
    try:
        return parse_config(data, p)
    except ConfigError as e:
        given = f" (with {describe_overrides(overrides)} from the command line)" if overrides else ""
        raise ConfigError(f"{p}{given}: {e}") from None

