"""`pswift init`: a project to start from, copied from an example shipped in the wheel (the
``pipeswift_examples`` package: the checkout's ``examples/``). Nothing is written unless every
file can be: an existing file is never replaced."""

from __future__ import annotations

# Imports inside functions: importlib.resources, only for `pswift init`

import os
import re
from pathlib import Path
from typing import NamedTuple

from pipeswift_slurm import runfiles
from pipeswift_slurm.errors import UsageError
from pipeswift_slurm.userfiles import own_folder

#: the examples ``pswift init --example`` knows, each with what to run first
EXAMPLES = {"tiny-gpt": (), "gpt2": ("python {dir}/make_tokens.py",)}
#: the files of an example that a project needs (data written by a script is not shipped)
_SHIPPED = re.compile(r"\A[\w.-]+\.(toml|py)\Z")
_PARTITION_LINE = re.compile(r'(?m)^partition = "[^"\n]*"(?P<pad> *)#.*$')


class Started(NamedTuple):
    """What :func:`init` wrote, and what the user runs next."""

    files: list[Path]
    next_steps: list[str]


def example_files(example: str) -> dict[str, bytes]:
    """The example's shipped files, by name (its train.toml, model and helper scripts)."""
    from importlib import resources
    if example not in EXAMPLES:
        raise UsageError(f"no example {example!r}: choose one of {', '.join(EXAMPLES)}")
    folder = resources.files("pipeswift_examples").joinpath(example)
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file() and _SHIPPED.match(f.name)}


def with_partition(toml: str, partition: str) -> str:
    """The example's ``[job] partition`` line set to ``partition`` (the site's default)."""
    if not re.fullmatch(r"[\w.-]+", partition):
        raise UsageError(f"partition {partition!r}: give a Slurm partition name (letters, digits, _ . -)")
    line = f'partition = "{partition}"'
    start = toml.index("[job]")
    end = toml.find("\n[", start) % (len(toml) + 1)   # -1 (no later section): the end
    job = _PARTITION_LINE.sub(f"{line:<27}# written by pswift init (the site's default unless -p)",
                              toml[start:end], count=1)
    return toml[:start] + job + toml[end:]


def _present(name: str, folder: int) -> bool:
    try:
        os.lstat(name, dir_fd=folder)
    except FileNotFoundError:
        return False
    return True


def init(dest: Path, example: str = "tiny-gpt", partition: str | None = None) -> Started:
    """Write ``example``'s train.toml and model files into ``dest`` (created if missing), with
    ``[job] partition`` set to ``partition`` when given. Refuses, writing nothing, when one of
    the files is already there, or ``dest`` is not a folder of the caller's own that only the
    caller can write to (the folder is opened once and the files made in it, not by path)."""
    files = example_files(example)
    if partition is not None:
        files[runfiles.TOML] = with_partition(files[runfiles.TOML].decode(), partition).encode()
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UsageError(f"{dest} is not a folder: give a new or existing folder for the project")
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)    # only its owner writes to a new one
    folder = own_folder(dest)        # opened once: the checks and the writes are on one folder
    try:
        there = sorted(name for name in files if _present(name, folder))
        if there:
            raise UsageError(f"{dest} already has {', '.join(there)}: give another folder, or move them away "
                             f"(pswift init never replaces a file)")
        written = []
        for name in sorted(files):
            # O_EXCL: never onto a file (or a link) that appeared meanwhile
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=folder)
            with os.fdopen(fd, "wb") as f:
                f.write(files[name])
            written.append(dest / name)
    finally:
        os.close(folder)
    steps = [s.format(dir=dest) for s in EXAMPLES[example]]
    return Started(written, [*steps, f"pswift plan {dest / 'train.toml'}",
                             f"pswift sbatch --wait {dest / 'train.toml'}"])
