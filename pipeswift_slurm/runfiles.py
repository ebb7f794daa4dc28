"""The one place that names a run directory's files (submitit's ``JobPaths``): the login side,
the launcher and the plugins take every name from here. Light: the standard library only (the
launcher and slurmctld's plugins import it).

A run directory holds ``train.toml`` (a copy), ``plan.json`` (the one contract between the login
node and the job: read through :mod:`pipeswift_slurm.plan`), ``job.sbatch``, ``JOB_ID``, the job
log ``slurm-JOBID.out``, ``events.jsonl`` (read through :mod:`pipeswift_slurm.events`),
``cancel.json``, ``checkpoints/``, ``launches/`` and ``heartbeats/``, and the metrics sinks'
files."""

from __future__ import annotations

from pathlib import Path

TOML = "train.toml"
PLAN = "plan.json"
SBATCH = "job.sbatch"
JOB_ID = "JOB_ID"
EVENTS = "events.jsonl"
CANCEL = "cancel.json"
CHECKPOINTS = "checkpoints"
LAUNCHES = "launches"
HEARTBEATS = "heartbeats"
SLURM_LOGS = "slurm-*.out"         # every job's log in the run directory, as a glob
METRICS_CSV = "metrics.csv"        # [training] metrics' sinks
TENSORBOARD = "tensorboard"
WANDB = "wandb"


def slurm_log(job_id: str | int) -> str:
    """The name of job ``job_id``'s log in its run directory (``--output``)."""
    return f"slurm-{job_id}.out"


class RunDir:
    """A run directory's paths, by what they hold."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def plan(self) -> Path:
        return self.path / PLAN

    @property
    def events(self) -> Path:
        return self.path / EVENTS

    @property
    def toml(self) -> Path:
        return self.path / TOML

    @property
    def sbatch(self) -> Path:
        return self.path / SBATCH

    @property
    def job_id(self) -> Path:
        return self.path / JOB_ID

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def launches(self) -> Path:
        return self.path / LAUNCHES

    @property
    def heartbeats(self) -> Path:
        return self.path / HEARTBEATS

    def slurm_log(self, job_id: str | int) -> Path:
        return self.path / slurm_log(job_id)
