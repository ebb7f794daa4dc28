"""The one place that names a run directory's files (submitit's ``JobPaths``): the login side,
the launcher and the plugins take every name from here (a test reads their code's literals). Light: the standard library only (the
launcher and slurmctld's plugins import it).

A run directory holds ``train.toml`` (a copy), ``plan.json`` (the one contract between the login
node and the job: read through :mod:`pipeswift_slurm.plan`), ``job.sbatch``, ``JOB_ID``, the job
log ``slurm-JOBID.out``, ``events.jsonl`` (read through :mod:`pipeswift_slurm.events`),
``cancel.json``, ``checkpoints/``, ``launches/`` and ``heartbeats/``, and the metrics sinks'
files."""

from __future__ import annotations


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
TENSORBOARD = "tensorboard"        # (W&B writes its own wandb/ folder beside them)


def slurm_log(job_id: str | int) -> str:
    """The name of job ``job_id``'s log in its run directory (``--output``)."""
    return f"slurm-{job_id}.out"

