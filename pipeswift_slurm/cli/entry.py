"""The `pswift` command's entry point. For the commands that plan with the live cluster state
(`pswift sbatch`, `pswift plan`), it starts asking Slurm before the CLI and the planner are even
imported, so the queries overlap with start-up; then it hands over to the click CLI (cli/main.py),
which parses everything. Measured by bench/submit_latency.py."""

from __future__ import annotations

import sys

_PLANNING = ("sbatch", "plan")
_NOT_LIVE = ("--no-live", "-h", "--help")


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] and argv[0] in _PLANNING and not any(a in _NOT_LIVE for a in argv):
        from pipeswift_slurm.slurm import client as slurm
        slurm.prefetch()
    from pipeswift_slurm.cli.main import main as cli_main
    cli_main()


if __name__ == "__main__":
    main()
