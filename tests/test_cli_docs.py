"""Every command is documented and its help ends with an example (sqlite-utils style)."""

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli import cli

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
    from conftest import ROOT
    assert f"pswift {name}" in (ROOT / "README.md").read_text()
