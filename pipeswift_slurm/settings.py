"""Every train.toml setting, declared once: section, key, kind, default, bounds, whether the job
reads it from plan.json, and one line of documentation.

:mod:`pipeswift_slurm.config` parses train.toml from this table (valid keys, required keys,
defaults, bounds); :mod:`pipeswift_slurm.plan` checks plan.json's copy of the travelling settings
against it when the job reads the plan; the README's settings table is generated from it
(``python -m pipeswift_slurm.settings --readme`` rewrites it, and a test keeps it true).

Kinds: ``int``, ``float``, ``str``, ``bool`` and ``choice`` are checked here generically;
``int|auto`` is an integer or the string "auto"; ``special`` values (paths, tables, lists, Slurm
times) have their own checker in config.py, which takes only the default from here.
"""

from __future__ import annotations

# Imports inside functions: textwrap, only for writing sections.py

import sys
from pathlib import Path
from typing import Any, NamedTuple


#: the largest sizes pswift plans for (each a clear error above it): enough for any cluster job,
#: small enough that enumerating and simulating every candidate stays well under a second
LIMITS = {"nodes": 4096, "node_range": 16, "tasks_per_node": 16, "micro_batches": 4096,
          "layers": 512, "int": 2**31 - 1, "depth": 16}


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: the default of a setting train.toml must give
REQUIRED: Any = _Required()


class Setting(NamedTuple):
    section: str
    key: str
    kind: str
    default: Any
    doc: str
    #: the least value (None: 1 for an integer, 0 for a float)
    lo: float | None = None
    hi: float | None = None
    choices: tuple[Any, ...] = ()
    #: where plan.json carries it for the job: "training" (the training section), "top" (a
    #: top-level key of the same name) or None (the login side only)
    plan: str | None = None
    #: how the README shows a default that is computed (None: the default itself)
    shown_default: str | None = None
    #: a travelling special setting's JSON types in plan.json (the others follow from the kind)
    json: tuple[type, ...] = ()
    #: its field's Python type in config's section (a special's; the others follow from the kind)
    py: str | None = None
    #: the section fields it becomes, (name, type, doc) each, where not one field of its own name
    fields: tuple[tuple[str, str, str], ...] = ()

    @property
    def name(self) -> str:
        return f"[{self.section}] {self.key}"

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def field_type(self) -> str:
        """Its field's type in config's section, as Python source."""
        if self.py is not None:
            return self.py
        optional = " | None" if self.default is None else ""
        if self.kind in ("int", "float", "bool"):
            return self.kind + optional
        if self.kind == "str":
            return "str" + optional
        if self.kind == "choice":
            return " | ".join(sorted({type(c).__name__ for c in self.choices})) + optional
        return {"int|auto": "int | str", "choices": "list[str]"}[self.kind]

    def plan_types(self) -> tuple[type, ...]:
        """The JSON types plan.json may hold for it (an "int|auto" travels as its integer)."""
        if self.json:
            return self.json
        return {"int": (int,), "int|auto": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
                "choice": tuple({type(c) for c in self.choices}), "choices": (list,)}[self.kind]


S = Setting
SETTINGS: tuple[Setting, ...] = (
    # [job]
    S("job", "name", "str", REQUIRED, "the Slurm job name"),
    S("job", "partition", "special", None, "the partition, or a list of them (`[\"a\", \"b\"]`): each is "
      "estimated and the job is submitted to all, the soonest-finishing first (default: Slurm's default)",
      fields=(("partition", "str | None", "the partition planned for: the TOML's one, the first of its list "
               "(until the planner orders them), or None (Slurm's default)"),
              ("partitions", "tuple[str, ...]", "every partition the TOML lists, in its order (empty: Slurm's default)"))),
    S("job", "time", "special", None, "time limit: `M`, `H:MM:SS` or `D-HH:MM:SS`; USR2 comes "
      "early enough to checkpoint before it", py="str | None"),
    S("job", "time_policy", "choice", "predicted", "the limit asked of Slurm: the planner's predicted "
      "time (p90 x 1.25 + the USR2 lead, capped by `time`) with a `--time-min` backfill may shorten "
      "it to, each requeue asking for what remains; or `time` as written (\"Time limits\" in "
      "docs/design.md)", choices=("predicted", "as_written"), plan="top"),
    S("job", "account", "str", None, "the Slurm account"),
    S("job", "qos", "str", None, "the QOS (`standby` for a preemptible one)"),
    S("job", "sbatch_options", "special", (), "more sbatch options, e.g. `[\"--mail-type=END\"]`, "
      "rendered as quoted `#SBATCH` lines", py="tuple[str, ...]"),
    S("job", "max_requeues", "int", 3, "attempts after the first (preemption, time limit, lost "
      "node, crash with no restart left); past it the job stops with the reason", lo=0, plan="top"),
    S("job", "max_restarts", "int", 3, "restarts of the ranks inside one allocation after a "
      "crash, per attempt", lo=0, hi=100, plan="top"),
    S("job", "python", "str", None, "the interpreter the job runs; it must import torch and "
      "deepspeed", shown_default="the one running `pswift`"),
    S("job", "objective", "choice", "mean", "what the planner minimises: the expected JCT, or its "
      "median or 90th percentile (\"Risk\" in docs/design.md)", choices=("mean", "p50", "p90")),
    S("job", "jct_slack", "float", 0.05, "how much longer than the best layout's JCT (a fraction) "
      "the planner accepts to hold fewer node-hours; 0 takes the fastest whatever it costs",
      lo=0.0, hi=1.0, plan="top"),
    S("job", "grow_check_s", "special", 60, "how often a job below the top of its node range "
      "checks whether growing pays (≥ 5 s; a run of members every 5 s at most); 0 never grows",
      lo=0, hi=86400, plan="top", json=(int,), py="int"),
    # [resources]
    S("resources", "nodes", "special", 1, "an integer or `[min, max]`: the job takes what is free "
      "and adapts its layout", fields=(("nodes_min", "int", "the least node count the job runs on"),
                                       ("nodes_max", "int", "the most (nodes_min when nodes is one integer)"))),
    S("resources", "tasks_per_node", "int", None, "task slots per node (one rank each)",
      hi=LIMITS["tasks_per_node"], shown_default="`gpus_per_node`, or 1", py="int"),
    S("resources", "gpus_per_node", "int", 0, "GPUs per node (one per task with `cuda`)", lo=0),
    S("resources", "cpus_per_task", "int", 1, "CPUs per task", plan="top"),
    S("resources", "device", "choice", "cpu", "the device each rank drives (gloo on CPU, nccl on CUDA)", choices=("cpu", "cuda"),
      plan="top"),
    S("resources", "members", "int|auto", 0, "0: one Slurm job; N >= 2: a job array of N members of `member_nodes` "
      "nodes each, training as one run (`nodes`' top = N x `member_nodes`): a preempted member leaves, the "
      "others train on; `auto`: members where the partition's preemptions make them pay (\"Members\" in "
      "docs/design.md)", lo=0, hi=LIMITS["nodes"], plan="top"),
    S("resources", "member_nodes", "int", 1, "nodes of each member (with `members`)", hi=LIMITS["nodes"], plan="top"),
    S("resources", "member_wait_s", "int", 60, "seconds the first members wait at the start for the others "
      "before training on the members present (later, at most 20 s for one that left without a word)",
      lo=0, hi=86400, plan="top"),
    # [model]
    S("model", "entry", "special", REQUIRED, "`module:function` returning the list of layers "
      "(`LayerSpec`s: each stage builds only its own)", py="str"),
    S("model", "kwargs", "special", {}, "keyword arguments for `entry` and the data function",
      py="dict[str, Any]"),   # never mutated: the parser gives each config its own
    S("model", "loss", "special", None, "`module:function` of the loss", shown_default="cross-entropy",
      py="str | None"),
    S("model", "num_layers", "int", None, "the layer count, when the planner should know it "
      "before the job starts", hi=LIMITS["layers"]),
    S("model", "layer_costs", "special", None, "seconds per layer per micro-batch (a hint; the "
      "job measures them)", py="tuple[float, ...] | None"),
    S("model", "layer_memory", "special", None, "bytes per layer (a hint for the memory model)",
      py="tuple[int, ...] | None"),
    # [training]
    S("training", "steps", "int", REQUIRED, "optimizer steps", plan="training"),
    S("training", "global_batch_size", "int", REQUIRED, "samples per step", plan="training"),
    S("training", "micro_batch_size", "special", REQUIRED, "an integer, a list the planner picks "
      "from, or `\"auto\"` (every power of two dividing the batch)", plan="training", json=(int,),
      fields=(("micro_batch_size", "int", "the micro-batch size [model] layer_costs are for: the TOML's "
               "integer, the first size of a list, 1 (one sample) with \"auto\""),
              ("micro_batch_sizes", "tuple[int, ...]", "the sizes the planner may choose from (a list, or "
               "every power of two dividing the global batch with \"auto\"); () = micro_batch_size only"))),
    S("training", "data", "special", REQUIRED, "`\"module:function\"`, `{ tokens = \"train.bin\", "
      "seq_len = N }` or `{ dataset = \"module:function\" }` (\"train.toml in depth\" in docs/design.md)",
      plan="training", json=(str, dict), py="str | dict[str, Any]"),
    S("training", "seed", "int", 1, "the seed of the weights, the data order and dropout", lo=0,
      plan="training"),
    S("training", "optimizer", "special", {}, "`{ type, params }` of a torch optimizer",
      plan="training", shown_default="AdamW, lr 1e-3", json=(dict,), py="dict[str, Any]"),
    S("training", "ds_config", "special", {}, "DeepSpeed settings a checkpoint can reshape "
      "across (`steps_per_print`, `activation_checkpointing`...); others are refused", plan="training",
      json=(dict,), py="dict[str, Any]"),
    S("training", "gradient_clipping", "float", 0.0, "the gradient norm clip (0: none)", lo=0.0,
      plan="training"),
    S("training", "precision", "choice", "fp32", "`bf16` trains on CPU too; `fp16` needs a GPU "
      "and zero_stage = 1", choices=("fp32", "bf16", "fp16"), plan="training"),
    S("training", "zero_stage", "choice", 0, "1: optimizer state and fp32 master weights "
      "sharded over the data-parallel ranks", choices=(0, 1), plan="training"),
    S("training", "activation_checkpoint_interval", "int", 0, "recompute activations every N "
      "layers in the backward pass (0: keep them)", lo=0, plan="training"),
    S("training", "lr_warmup_steps", "int", 0, "linear warm-up steps", lo=0, plan="training"),
    S("training", "lr_decay", "choice", "constant", "after the warm-up: constant, or cosine decay "
      "to lr × lr_min_ratio at the last step", choices=("constant", "cosine"), plan="training"),
    S("training", "lr_min_ratio", "float", 0.0, "the final learning rate as a fraction of the "
      "peak", lo=0.0, hi=1.0, plan="training"),
    S("training", "checkpoint_dir", "special", None, "where checkpoints go", plan="training",
      shown_default="the run dir's `checkpoints/`", json=(str,), py="Path | None"),
    S("training", "checkpoint_interval", "int|auto", "auto", "steps between periodic "
      "checkpoints; `\"auto\"`: the Young/Daly interval; 0: only on a signal and at the end",
      lo=0, plan="training"),
    S("training", "checkpoint_io_share", "float", 0.1, "the most of its time a job spends writing "
      "checkpoints: `\"auto\"`'s interval is at least the last write's seconds ÷ this (never shorter "
      "than the write itself), however little a background write stalls training", lo=0.01, hi=1.0,
      plan="training"),
    S("training", "eval_every", "int", 0, "steps between validation losses (the mean loss of "
      "`eval_batches` micro-batches of `eval_data`, no gradients: `eval/loss` in the metrics, TensorBoard "
      "and `pswift plot`); 0: none", lo=0, plan="training"),
    S("training", "eval_batches", "int", 4, "micro-batches each data-parallel rank evaluates, each "
      "validation", lo=1, hi=4096, plan="training"),
    S("training", "eval_data", "special", None, "the validation samples, as `data` (default: the training "
      "data's batches of the step after the last, which the run never trains on)", plan="training",
      json=(str, dict, type(None)), py="str | dict[str, Any] | None"),
    S("training", "metrics", "choices", ["csv"], "where rank 0 also writes loss, lr, step time, "
      "samples/s and checkpoint stalls, and every start, end, requeue, restart, re-layout and growth, "
      "under the run dir, on one step axis over all attempts: `metrics.csv`, `tensorboard/` (needs "
      "the `tensorboard` package where the job runs; `pip install 'pipeswift-slurm[metrics]'`), `wandb/` "
      "(an offline W&B run per launch, one run id per run dir: `wandb sync RUN_DIR/wandb/offline-run-*` "
      "afterwards; needs `pipeswift-slurm[wandb]`; `WANDB_MODE`, `WANDB_PROJECT` apply); `[]`: none",
      choices=("csv", "tensorboard", "wandb"), plan="training", shown_default='`["csv"]`'),
    S("training", "keep_checkpoints", "int", 2, "complete checkpoints kept", lo=2, plan="training"),
    S("training", "hang_timeout_factor", "float", 10.0, "a rank that finishes no step for "
      "max(hang_timeout_min_s, factor × p95 step time) ends the attempt", lo=2.0, plan="training"),
    S("training", "hang_timeout_min_s", "float", 300.0, "the least time without a step that "
      "counts as a hang", lo=1.0, plan="training"),
    # [pipeline]
    S("pipeline", "stages", "int|auto", "auto", "an integer, or `\"auto\"`: the planner chooses "
      "per node count"),
    S("pipeline", "micro_batches", "int|auto", "auto", "m per step, or `\"auto\"` (global batch ÷ "
      "(micro-batch × dp))"),
    S("pipeline", "partition", "special", "auto", "`\"auto\"` (by layer_costs, else parameters), "
      "`\"uniform\"`, `\"parameters\"` or boundaries like `[0, 3, 6]`", py="str | tuple[int, ...]"),
    S("pipeline", "data_parallel", "int", None, "the data-parallel degree",
      shown_default="world size ÷ stages"),
    S("pipeline", "rebalance", "bool", True, "re-cut the stages in place from measured layer "
      "times when that pays (explicit boundaries never are)", plan="top"),
    S("pipeline", "schedule", "choice", "1f1b", "the pipeline schedule the engine runs: DeepSpeed's "
      "1F1B, or ZB-H1 (zero bubble: each backward computes input gradients first and the `nn.Linear` "
      "weight gradients later, where the stage would wait; every stage may hold the micro-batches "
      "the first holds in 1F1B, plus one), or "
      "`\"auto\"`: per layout, ZB-H1 where the history measured it faster than 1F1B, or where the "
      "step model says it saves at least 1 % (with the weight-pass shares a ZB-H1 run measured, "
      "else assumed: the plan says so), else 1F1B",
      choices=("1f1b", "zb-h1", "auto"), plan="top"),
)
del S

SECTIONS = ("job", "resources", "model", "training", "pipeline")
_BY_NAME = {(s.section, s.key): s for s in SETTINGS}


def setting(section: str, key: str) -> Setting:
    return _BY_NAME[(section, key)]


def keys(section: str) -> tuple[str, ...]:
    """The valid keys of ``[section]``, in the table's order."""
    return tuple(s.key for s in SETTINGS if s.section == section)


def required(section: str) -> tuple[str, ...]:
    return tuple(s.key for s in SETTINGS if s.section == section and s.required)


def default(section: str, key: str) -> Any:
    return _BY_NAME[(section, key)].default


def travelling(where: str) -> tuple[Setting, ...]:
    """The settings plan.json carries in ``where`` ("training" or "top")."""
    return tuple(s for s in SETTINGS if s.plan == where)


# ----------------------------------------------------------------------------- the README table
README_START = "<!-- settings table: generated by `python -m pipeswift_slurm.settings --readme` -->"
README_END = "<!-- end of the settings table -->"


def _shown(s: Setting) -> str:
    if s.shown_default is not None:
        return s.shown_default
    if s.required:
        return "required"
    if s.default is None or s.default in ((), {}):
        return "none"
    if isinstance(s.default, bool):
        return str(s.default).lower()
    return f"`{s.default!r}`".replace("'", '"') if isinstance(s.default, str) else f"`{s.default}`"


def _bounds(s: Setting) -> str:
    """The bounds worth saying: not the ``≥ 1`` of an integer nor the ``≥ 0`` of a float."""
    parts = [f"≥ {_num(s.lo)}"] if s.lo else []
    if s.hi is not None:
        parts.append(f"≤ {_num(s.hi)}")
    if s.choices:
        parts.append(" \\| ".join(f"`{c}`" for c in s.choices))
    return f" ({', '.join(parts)})" if parts else ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def markdown_table() -> str:
    """The README's settings table, one row per setting."""
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{s.name}` | {_shown(s)} | {s.doc}{_bounds(s)} |" for s in SETTINGS]
    rows += ["", f"Sizes are capped, each with a clear error: at most {LIMITS['nodes']} nodes and "
             f"{LIMITS['node_range']} node counts in a range, {LIMITS['tasks_per_node']} tasks per node, "
             f"{LIMITS['layers']} layers, {LIMITS['micro_batches']} micro-batches per step, integers "
             f"below 2³¹, tables nested at most {LIMITS['depth']} levels."]
    return "\n".join(rows)


def readme_with_table(text: str) -> str:
    """``text`` (the README) with the block between the markers replaced by the table."""
    head, sep, rest = text.partition(README_START)
    _, sep2, tail = rest.partition(README_END)
    if not (sep and sep2):
        raise ValueError(f"README has no settings-table markers ({README_START!r} ... {README_END!r})")
    return f"{head}{README_START}\n{markdown_table()}\n{README_END}{tail}"


# ----------------------------------------------------------------------- the typed sections
SECTIONS_FILE = Path(__file__).resolve().parent / "sections.py"
_JSON_TYPE = {int: "int", float: "float", str: "str", bool: "bool", dict: "dict[str, Any]",
              list: "list[str]", type(None): "None"}


def section_fields(section: str) -> list[tuple[str, str, str]]:
    """``[section]``'s fields in config's section, (name, Python type, doc) each, in the table's
    order: one per setting, or the fields a setting declares it becomes."""
    out: list[tuple[str, str, str]] = []
    for s in SETTINGS:
        if s.section == section:
            out += list(s.fields) or [(s.key, s.field_type(), s.doc)]
    return out


def _plan_type(s: Setting) -> str:
    types = s.plan_types()
    if set(types) == {int, float}:
        return "float"
    return " | ".join(_JSON_TYPE[t] for t in types)


def _comment(doc: str, indent: str = "    ") -> list[str]:
    import textwrap
    return textwrap.wrap(doc, 96, initial_indent=f"{indent}#: ", subsequent_indent=f"{indent}#: ",
                         break_on_hyphens=False)


def sections_module() -> str:
    """pipeswift_slurm/sections.py: each section's fields as a NamedTuple (config subclasses
    them) and plan.json's [training] as a TypedDict, written from the table."""
    lines = ['"""Generated by `python -m pipeswift_slurm.settings --sections` from the settings table',
             "(pipeswift_slurm/settings.py, where each setting is declared once): do not edit; a test checks it",
             'is current. config.py subclasses each *Fields class with what it computes."""', "",
             "from __future__ import annotations", "", "from pathlib import Path",
             "from typing import Any, NamedTuple, TypedDict", ""]
    for section in SECTIONS:
        lines += ["", f"class {section.capitalize()}Fields(NamedTuple):",
                  f'    """[{section}]: a field a setting, no defaults (the parser fills each from the table)."""']
        for name, typ, doc in section_fields(section):
            lines += [*_comment(doc), f"    {name}: {typ}"]
        lines.append("")
    lines += ["", "class TrainingSpec(TypedDict):",
              '    """plan.json\'s [training]: the travelling [training] settings, as the job reads them."""']
    for s in travelling("training"):
        lines += [*_comment(s.doc), f"    {s.key}: {_plan_type(s)}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["--sections"]:
        SECTIONS_FILE.write_text(sections_module(), encoding="utf-8")
        print(f"wrote {SECTIONS_FILE}")
        return 0
    if argv != ["--readme"]:
        print(markdown_table())
        return 0
    readme = Path(__file__).resolve().parent.parent / "README.md"
    readme.write_text(readme_with_table(readme.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the settings table into {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
