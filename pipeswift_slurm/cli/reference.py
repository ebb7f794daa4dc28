"""The CLI reference (docs/cli.md), generated from click: every command's and subcommand's
``--help`` as the terminal shows it at a fixed width. ``python -m pipeswift_slurm.cli.reference
--write`` rewrites the file; a test holds it to the code, as the README's settings table is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import click

from pipeswift_slurm.cli.main import cli

#: the width the help is laid out at (a terminal's would make the file depend on who ran it)
WIDTH = 100
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
HEADER = """# pswift command reference

Generated from the commands' own help by `python -m pipeswift_slurm.cli.reference --write`
(tests/test_cli_docs.py fails when it is stale). `pswift COMMAND --help` prints the same.
"""


def commands(group: click.Group = cli, path: tuple[str, ...] = ("pswift",),
             parent: click.Context | None = None) -> Iterator[tuple[str, click.Context]]:
    """(the command line, its click context) of ``group`` and everything under it, in order."""
    settings = {**group.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    ctx = click.Context(group, info_name=path[-1], parent=parent, **settings)
    yield " ".join(path), ctx
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if isinstance(sub, click.Group):
            yield from commands(sub, (*path, name), ctx)
        elif sub is not None:
            yield " ".join((*path, name)), click.Context(sub, info_name=name, parent=ctx, **settings)


def render() -> str:
    """The whole reference: a contents line, then each command's help in a text block."""
    found = list(commands())
    toc = " · ".join(f"[`{line}`](#{line.replace(' ', '-')})" for line, _ in found[1:])
    parts = [HEADER, toc, ""]
    for line, ctx in found:
        parts += [f"## {line}", "", "```text", ctx.get_help().rstrip(), "```", ""]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        DOC.write_text(render(), encoding="utf-8")
        print(f"wrote {DOC}")
        return 0
    if argv:
        print("usage: python -m pipeswift_slurm.cli.reference [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
