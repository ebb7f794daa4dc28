"""The progress bar of long admin commands (rich's, on a terminal only)."""

from __future__ import annotations

# Imports inside functions: rich, only when a bar is drawn on a terminal

import contextlib
import sys
from typing import Callable, Iterator

from pipeswift_slurm.terminal import raw_stderr


#: what a long loop reports to: advance(n) after n more items
Advance = Callable[[int], None]


def interactive() -> bool:
    """Whether someone watches stderr (a terminal): the rule for drawing progress at all."""
    return sys.stderr.isatty()


def _nothing(n: int = 1) -> None:
    return None


@contextlib.contextmanager
def no_progress(what: str, total: int | None = None) -> Iterator[Advance]:
    yield _nothing


@contextlib.contextmanager
def progress(what: str, total: int | None = None) -> Iterator[Advance]:
    """A progress bar on stderr (rich's) while a long admin command works, only when stderr is
    a terminal: piped, redirected or under cron, nothing is written. Yields ``advance(n)``."""
    if not interactive():
        yield _nothing
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=raw_stderr()), transient=True,
                  redirect_stdout=False, redirect_stderr=False) as bar:   # the data stays on stdout
        task = bar.add_task(what, total=total)

        def advance(n: int = 1) -> None:
            bar.advance(task, n)
        yield advance
