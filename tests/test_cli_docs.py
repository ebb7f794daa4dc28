"""Every command is documented and its help ends with an example (sqlite-utils style)."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli.main import cli

COMMANDS = cli.list_commands(None)  # the admin commands load lazily


def test_there_are_commands():
    assert {"sbatch", "run", "status"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_command_help_ends_with_an_example(name):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    doc = cli.get_command(None, name).help or ""
    assert doc.strip(), f"{name} has no help"
    tail = doc.strip().split("\n\n")
    assert any(p.strip().startswith("Example") for p in tail), f"{name}: no Example section"
    assert tail[-1].strip().startswith("pswift "), f"{name}: help must end with an example command"


@pytest.mark.parametrize("name", COMMANDS)
def test_readme_mentions_every_command(name):
    from helpers import ROOT
    assert f"pswift {name}" in (ROOT / "README.md").read_text()


def _history_commands() -> list[str]:
    return sorted(cli.get_command(None, "history").list_commands(None))


@pytest.mark.parametrize("name", _history_commands())
def test_history_command_help_ends_with_an_example_and_the_readme_has_it(name):
    from helpers import ROOT
    result = CliRunner().invoke(cli, ["history", name, "--help"])
    assert result.exit_code == 0, result.output
    doc = cli.get_command(None, "history").get_command(None, name).help or ""
    tail = doc.strip().split("\n\n")
    assert any(p.strip().startswith("Example") for p in tail), f"history {name}: no Example section"
    assert tail[-1].strip().startswith(f"pswift history {name}"), f"history {name}: end with an example"
    assert f"pswift history {name}" in (ROOT / "README.md").read_text()


def test_the_cli_reference_is_generated_from_the_commands():
    """docs/cli.md is every command's help as click renders it (as the README's settings table
    is the settings'): a new option or a changed help without a regenerated file fails here."""
    from pipeswift_slurm.cli import reference
    assert reference.DOC.read_text(encoding="utf-8") == reference.render(), \
        "docs/cli.md is stale: run `python -m pipeswift_slurm.cli.reference --write`"
    lines = [line for line, _ in reference.commands()]
    assert {f"pswift {name}" for name in COMMANDS} <= set(lines) and "pswift history export" in lines
    for line in lines:
        assert f"## {line}\n" in reference.DOC.read_text(encoding="utf-8")


def test_the_environment_variables_are_in_the_top_level_help_and_readme():
    """Issue 59: PSWIFT_DB and PSWIFT_HOME were only in docs/design.md."""
    from click.testing import CliRunner
    from pipeswift_slurm.cli.main import cli
    out = CliRunner().invoke(cli, ["--help"]).output
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name in ("PSWIFT_DB", "PSWIFT_HOME", "PSWIFT_SLURM_OUTAGE_S", "PSWIFT_SLURM_BACKEND"):
        assert name in out and name in readme, name


#: the one short option with two meanings, each the Slurm tool's own that the command mirrors and
#: that its users type: squeue's and sacct's `-o` picks columns (`jobs`, `history ...`), sbatch's
#: `-o` names a file (`plot`, `export`: a file written)
TWO_MEANINGS = {"-o": {("--format",), ("--output",)}}


def test_one_meaning_per_short_option_across_commands():
    """Issue 59: a short option means one thing in every command (`-n` was history's --noheader
    and logs' --lines; `-s` history's --state and cancel's --signal)."""
    import click
    ctx = click.Context(cli)
    meanings: dict[str, set[tuple[str, ...]]] = {}

    def walk(cmd: click.Command) -> None:
        for p in cmd.params:
            names = [*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())]
            longs = tuple(sorted(n for n in names if n.startswith("--"))) or (p.name,)
            for short in (n for n in names if n.startswith("-") and not n.startswith("--")):
                meanings.setdefault(short, set()).add(longs)
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name))
    walk(cli)
    assert len(meanings) > 10
    clashes = {s: m for s, m in meanings.items() if len(m) > 1 and m != TWO_MEANINGS.get(s)}
    assert not clashes, clashes
