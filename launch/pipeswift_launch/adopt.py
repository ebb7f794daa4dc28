"""``python -m pipeswift_launch.adopt RUN_DIR JOB_ID``: a --dry-run script's job records itself
as `pswift sbatch` records a job it submits: ``RUN_DIR/JOB_ID`` (the first attempt's; a requeue
keeps it) and the user's registry (``$PSWIFT_HOME/jobs``), so `pswift status JOB`, `logs`, `jobs`
and the history know the job. No torch; a registry that cannot be written is said, not fatal."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeswift_slurm import runfiles
from pipeswift_slurm.errors import PswiftError
from pipeswift_slurm.history import rundir


def adopt(run_dir: Path, job_id: str) -> str | None:
    """Record ``job_id`` for ``run_dir``; a problem that does not stop the job, or None."""
    if not job_id.isdigit():
        return f"no Slurm job id ({job_id!r}): nothing recorded"
    marker = run_dir / runfiles.JOB_ID
    if not marker.exists():
        tmp = run_dir / f".JOB_ID.{job_id}"
        tmp.write_text(job_id + "\n")
        tmp.replace(marker)
    try:
        rundir.register_job(job_id, run_dir)
    except PswiftError as e:
        return str(e)
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m pipeswift_launch.adopt RUN_DIR JOB_ID", file=sys.stderr)
        return 2
    problem = adopt(Path(argv[0]), argv[1])
    if problem:
        print(f"pswift: {problem}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
