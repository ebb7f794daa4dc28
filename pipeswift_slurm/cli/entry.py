"""The `pswift` command's entry point. For the commands that plan with the live cluster state
(`pswift sbatch`, `pswift plan`), it starts asking Slurm before the CLI and the planner are even
imported, so the queries overlap with start-up; then it hands over to the click CLI (cli/main.py),
which parses everything.

A planning command that does not ``--wait`` is short-lived, and two costs of the interpreter
itself are spared there (about 0.9× the time of a submission; bench/submit_latency.py):

- the cyclic garbage collector stays off: start-up makes modules, classes and functions, which
  live to the end, and one plan makes little garbage, so a collection frees nothing worth its
  time (``--wait`` may follow a job for hours: it keeps the collector);
- the command leaves through ``os._exit`` once its output is flushed, without the interpreter's
  teardown of every module. Nothing is lost by it: every file the command writes is closed
  where it is written (``write_text``, ``with open``), the events writer flushes each line,
  the history commits each transaction, and pswift registers no ``atexit`` handler.
"""

from __future__ import annotations

# Imports inside functions: the CLI loads while Slurm is asked in the background (the point of
# this module), gc is switched off only for one-shot commands

import os
import sys
from typing import Callable, NoReturn

_PLANNING = ("sbatch", "plan")
_NOT_LIVE = ("--no-live", "-h", "--help")


def main() -> None:
    argv = sys.argv[1:]
    fast = short_lived(argv)
    if fast:
        import gc
        gc.disable()
    if argv[:1] and argv[0] in _PLANNING and not any(a in _NOT_LIVE for a in argv):
        from pipeswift_slurm.slurm import client as slurm
        slurm.prefetch()
    from pipeswift_slurm.cli.main import main as cli_main
    if fast:
        run_then_exit(cli_main)
    cli_main()


def short_lived(argv: list[str]) -> bool:
    """A planning command that does not wait (``--wait`` anywhere, sbatch's own included)."""
    return bool(argv[:1]) and argv[0] in _PLANNING and "--wait" not in argv


def exit_code(code: object) -> int:
    """The process's exit status for ``SystemExit(code)``, as the interpreter gives it (a
    message is printed on stderr and gives 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_then_exit(command: Callable[[], object]) -> NoReturn:
    """Run ``command`` (a click main, which ends in ``SystemExit``), flush stdout and stderr, and
    leave at once with its status. Any other exception propagates as usual; a flush that fails
    (a closed pipe) leaves through the interpreter's own exit, which reports it."""
    try:
        command()
        code: object = 0
    except SystemExit as e:
        code = e.code
    status = exit_code(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(status) from None
    os._exit(status)


if __name__ == "__main__":
    main()
