"""Property: any invalidating mutation of a valid train.toml is exit 2 and one line, never a traceback."""

from __future__ import annotations

import copy
import sys

import tomli_w
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import EXAMPLE, copy_example
from pipeswift_slurm.cli.main import cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BASE = tomllib.loads((EXAMPLE / "train.toml").read_text())
VALID_KEYS = {
    "job": {"name", "partition", "time", "account", "qos", "sbatch_options", "max_requeues", "python"},
    "resources": {"nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "device"},
    "model": {"entry", "kwargs", "loss", "num_layers", "layer_costs", "layer_memory"},
    "training": {"steps", "global_batch_size", "micro_batch_size", "data", "seed", "optimizer",
                 "ds_config", "gradient_clipping", "checkpoint_dir", "checkpoint_interval",
                 "keep_checkpoints", "hang_timeout_factor", "hang_timeout_min_s", "precision",
                 "zero_stage", "activation_checkpoint_interval", "lr_warmup_steps", "lr_decay",
                 "lr_min_ratio"},
    "pipeline": {"stages", "micro_batches", "partition", "data_parallel"},
}
POSITIVE_INTS = [("training", "steps"), ("training", "global_batch_size"),
                 ("training", "micro_batch_size"), ("resources", "tasks_per_node"),
                 ("resources", "cpus_per_task"), ("model", "num_layers")]
STRICT_INTS = POSITIVE_INTS + [("training", "seed"), ("job", "max_requeues"),
                               ("training", "checkpoint_interval")]
REQUIRED = [("job", "name"), ("model", "entry"), ("training", "steps"), ("training", "data"),
            ("training", "global_batch_size"), ("training", "micro_batch_size")]
identifiers = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)
not_int = st.one_of(st.text(max_size=5).filter(lambda s: s != "auto"), st.booleans(),
                    st.floats(allow_nan=False, allow_infinity=False), st.lists(st.integers(), max_size=2))


@st.composite
def invalid_docs(draw):
    doc = copy.deepcopy(BASE)
    kind = draw(st.sampled_from(["unknown_key", "unknown_section", "wrong_type", "non_positive",
                                 "missing", "stages_not_dividing", "stages_over_layers",
                                 "batch_mismatch", "syntax"]))
    if kind == "unknown_key":
        sec = draw(st.sampled_from(sorted(VALID_KEYS)))
        key = draw(identifiers.filter(lambda k: k not in VALID_KEYS[sec]))
        doc.setdefault(sec, {})[key] = draw(st.integers())
    elif kind == "unknown_section":
        doc[draw(identifiers.filter(lambda k: k not in VALID_KEYS))] = {"x": 1}
    elif kind == "wrong_type":
        sec, key = draw(st.sampled_from(STRICT_INTS))
        doc[sec][key] = draw(not_int)
    elif kind == "non_positive":
        sec, key = draw(st.sampled_from(POSITIVE_INTS))
        doc[sec][key] = draw(st.integers(max_value=0))
    elif kind == "missing":
        sec, key = draw(st.sampled_from(REQUIRED))
        del doc[sec][key]
    elif kind == "stages_not_dividing":  # world = 2 x tasks
        tasks = draw(st.integers(1, 3))
        doc["resources"]["tasks_per_node"] = tasks
        world = 2 * tasks
        doc["pipeline"]["stages"] = draw(st.integers(1, 6).filter(lambda s: world % s))
    elif kind == "stages_over_layers":
        doc["pipeline"]["stages"] = draw(st.integers(7, 64))
    elif kind == "batch_mismatch":
        doc["pipeline"]["micro_batches"] = draw(st.integers(1, 64).filter(lambda m: 8 * m != 32))
    text = tomli_w.dumps(doc)
    if kind == "syntax":  # garbage on a line of its own (inside a string it could be valid TOML)
        lines = text.split("\n")
        pos = draw(st.integers(0, len(lines)))
        junk = draw(st.sampled_from(["[[", "= =", "\"unterminated", "[job]\nname = 1"]))
        text = "\n".join(lines[:pos] + [junk] + lines[pos:])
    return kind, text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=invalid_docs())
def test_mutated_toml_always_exit_2_one_line(tmp_path_factory, case):
    kind, text = case
    d = tmp_path_factory.mktemp("prop")
    toml = copy_example(d / "ex")
    toml.write_text(text)
    r = CliRunner().invoke(cli, ["sbatch", "--dry-run", str(toml)])
    assert isinstance(r.exception, SystemExit), (kind, repr(r.exception), text)
    assert r.exit_code == 2, (kind, r.output, text)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), (kind, r.stderr)
    assert "Traceback" not in r.output


# ----------------------------------------------------------------------------- hostile values
KEY_PATHS = [(sec, key) for sec, keys in VALID_KEYS.items() for key in sorted(keys)] + [
    ("model", "kwargs"), ("training", "ds_config"), ("resources", "nodes")]
leaf = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70), st.sampled_from([2**62, 10**30, 100_000_000, 0, -1]),
    st.floats(), st.booleans(), st.text(max_size=30), st.datetimes(), st.dates(), st.times(),
    st.sampled_from(["auto", "uniform", "\u202e", "\x00", "é" * 50, "$(touch PWNED)", "[/oops]"]))
hostile = st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                     st.dictionaries(identifiers, kids, max_size=3)),
                       max_leaves=12)


def nested(depth: int) -> object:
    v: object = 1
    for i in range(depth):
        v = [v] if i % 2 else {"a": v}
    return v


@st.composite
def hostile_docs(draw):
    """Valid or not: any value at any key (types, huge ints, NaN/inf, datetimes, unicode, deep
    nesting), node ranges and batches far past any cluster, raw bytes."""
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        sec, key = draw(st.sampled_from(KEY_PATHS))
        doc.setdefault(sec, {})[key] = draw(st.one_of(
            hostile, st.builds(nested, st.integers(10, 60)),
            st.sampled_from([[1, 100_000_000], [1, 4096], [4096, 4096]]) if key == "nodes" else hostile))
    try:
        text = tomli_w.dumps(doc).encode()
    except (TypeError, ValueError):
        text = b"[job]\nname = 1\n"
    kind = draw(st.sampled_from(["plain", "plain", "plain", "bytes", "huge_int"]))
    if kind == "bytes":
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.binary(min_size=1, max_size=8)) + text[pos:]
    elif kind == "huge_int":
        text += b"\n[model.kwargs]\nbig = " + b"9" * 5000 + b"\n"
    return text


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(text=hostile_docs())
def test_any_hostile_toml_is_exit_0_or_2_one_line_nothing_left_fast(tmp_path_factory, text):
    import time
    d = tmp_path_factory.mktemp("hostile")
    toml = copy_example(d / "ex")
    toml.write_bytes(text)
    before = sorted(p.name for p in d.rglob("*"))
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, ["plan", "--no-live", "--json", str(toml)])
    took = time.monotonic() - t0
    assert r.exit_code in (0, 2) and isinstance(r.exception, (SystemExit, type(None))), (repr(r.exception), text[:300])
    if r.exit_code:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (r.stderr, text[:300])
    assert "Traceback" not in r.output
    assert took < 5, (took, text[:300])
    assert sorted(p.name for p in d.rglob("*")) == before
