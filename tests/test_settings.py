"""The settings table (pipeswift_slurm/settings.py) is the one declaration of every train.toml
key: the parser's keys, defaults and bounds, plan.json's travelling sections and the README's
table all follow it."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from pipeswift_slurm import config, settings
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.planning.build import build_plan

ROOT = Path(__file__).resolve().parent.parent

CLASSES = {"job": config.JobSection, "resources": config.ResourcesSection, "model": config.ModelSection,
           "training": config.TrainingSection, "pipeline": config.PipelineSection}


def minimal_doc(tmp_path: Path) -> tuple[dict, Path]:
    (tmp_path / "m.py").write_text("def layers(): return []\ndef batch(*a, **k): return None\n")
    doc = {"job": {"name": "x"}, "model": {"entry": "m:layers"},
           "training": {"steps": 4, "global_batch_size": 4, "micro_batch_size": 1, "data": "m:batch"}}
    return doc, tmp_path / "train.toml"


def test_the_sections_module_is_the_one_generated_from_the_table():
    """Each setting is declared once, in the table; config's sections and plan.json's [training]
    are written from it (adding a setting: its line in settings.py, then
    `python -m pipeswift_slurm.settings --sections`)."""
    assert settings.SECTIONS_FILE.read_text(encoding="utf-8") == settings.sections_module(), \
        "pipeswift_slurm/sections.py is stale: run python -m pipeswift_slurm.settings --sections"


@pytest.mark.parametrize("section", settings.SECTIONS)
def test_each_section_holds_exactly_the_tables_settings(section):
    """config's section: the generated fields, none of its own and no defaults (they live in the
    table); a setting that becomes other fields (nodes: nodes_min and nodes_max) says so there."""
    cls = CLASSES[section]
    assert list(cls._fields) == [name for name, _, _ in settings.section_fields(section)]
    assert not cls._field_defaults and cls.__slots__ == ()
    own = {k for k in settings.keys(section) if not settings.setting(section, k).fields}
    assert own <= set(cls._fields)


def test_plan_jsons_training_is_typed_from_the_travelling_settings():
    from pipeswift_slurm.plan import TrainingSpec
    assert list(TrainingSpec.__annotations__) == [s.key for s in settings.travelling("training")]
    assert typing.get_type_hints(TrainingSpec)["steps"] is int


def test_a_minimal_toml_gets_every_default_of_the_table(tmp_path):
    doc, path = minimal_doc(tmp_path)
    cfg = config.parse_config(doc, path)
    given = {(sec, key) for sec, table in doc.items() for key in table}
    checked = 0
    for s in settings.SETTINGS:
        if (s.section, s.key) in given or s.shown_default is not None or s.key == "nodes":
            continue
        got = getattr(getattr(cfg, s.section), s.key)
        assert got == s.default or (got == () and s.default == ()), s.name
        checked += 1
    assert checked >= 30
    assert (cfg.resources.nodes_min, cfg.resources.tasks_per_node) == (1, 1)   # the computed ones


@pytest.mark.parametrize("s", [s for s in settings.SETTINGS if s.kind in ("int", "float") and
                               (s.lo or s.hi is not None)], ids=lambda s: s.name)
def test_the_tables_bounds_are_the_parsers(tmp_path, s):
    doc, path = minimal_doc(tmp_path)
    for bad in ([s.lo - 1] if s.lo else []) + ([s.hi + 1] if s.hi is not None else []):
        doc.setdefault(s.section, {})[s.key] = int(bad) if s.kind == "int" else float(bad)
        with pytest.raises(ConfigError, match=rf"\[{s.section}\] {s.key} = "):
            config.parse_config(doc, path)
    for good in [x for x in (s.lo, s.hi) if x]:
        doc.setdefault(s.section, {})[s.key] = int(good) if s.kind == "int" else float(good)
        if s.key == "grow_check_s" and good < 5:
            continue
        if s.key == "members" and good >= 2:   # its nodes' top is members x member_nodes (config's rule)
            doc["resources"]["nodes"] = [int(good), int(good)]
        config.parse_config(doc, path)


def test_unknown_and_missing_keys_come_from_the_table(tmp_path):
    doc, path = minimal_doc(tmp_path)
    doc["pipeline"] = {"stagez": 2}
    with pytest.raises(ConfigError, match="valid keys: " + ", ".join(settings.keys("pipeline"))):
        config.parse_config(doc, path)
    doc, path = minimal_doc(tmp_path)
    del doc["training"]["data"]
    with pytest.raises(ConfigError, match=r"missing required key \[training\] data"):
        config.parse_config(doc, path)
    assert settings.required("training") == ("steps", "global_batch_size", "micro_batch_size", "data")


def test_plan_json_carries_exactly_the_travelling_settings(tmp_path):
    doc, path = minimal_doc(tmp_path)
    plan = build_plan(config.parse_config(doc, path), tmp_path / "run")
    assert set(plan["training"]) == {s.key for s in settings.travelling("training")}
    for s in settings.travelling("top"):
        assert s.key in plan, s.name


def test_the_readme_table_is_generated_from_the_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert settings.readme_with_table(readme) == readme, \
        "README's settings table is stale: run `python -m pipeswift_slurm.settings --readme`"
    for s in settings.SETTINGS:
        assert f"`{s.name}`" in readme


def test_the_job_refuses_a_plan_missing_any_setting_it_reads(tmp_path):
    """plan.runnable is the launcher's one check: afterwards it reads plan data without
    defaults, so every travelling setting must be there with its type."""
    import copy

    from pipeswift_slurm.plan import runnable
    doc, path = minimal_doc(tmp_path)
    plan = build_plan(config.parse_config(doc, path), tmp_path / "run")
    assert runnable(plan) is plan
    for s in settings.travelling("training") + settings.travelling("top"):
        broken = copy.deepcopy(plan)
        home = broken["training"] if s.plan == "training" else broken
        name = f"training.{s.key}" if s.plan == "training" else s.key
        del home[s.key]
        with pytest.raises(ConfigError, match=rf"plan.json: {name} is missing or not"):
            runnable(broken)
        home[s.key] = {"not": "a list"} if list in s.plan_types() else [1]   # the wrong JSON type
        with pytest.raises(ConfigError, match=rf"plan.json: {name} is missing or not"):
            runnable(broken)
