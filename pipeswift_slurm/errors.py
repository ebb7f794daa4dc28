"""Exceptions of the library. The CLI turns each into one line on stderr and an exit code."""

from __future__ import annotations


class PswiftError(Exception):
    """Base class: a problem the user can fix; ``str()`` says what is wrong and what to change."""

    exit_code = 1


class ConfigError(PswiftError):
    """train.toml is invalid (unknown key, wrong type, impossible combination)."""

    exit_code = 2


class UsageError(PswiftError):
    """Arguments that contradict each other or the plan (sbatch options that the plan sets)."""

    exit_code = 2


class SlurmError(PswiftError):
    """A Slurm command failed; the message carries the command, exit code and Slurm's own words."""

    exit_code = 1


class SlurmAbsent(SlurmError):
    """Slurm cannot be asked on this machine at all: no client commands, a SLURM_CONF that is no
    file, no configuration a configless lookup finds. Not an outage; a command that can answer
    from a run's own records does (status, logs -f)."""


class SlurmUnreachable(SlurmError):
    """slurmctld did not answer (down, restarting, failing over): an outage, not a failure of
    the job; callers that can go on without Slurm's word say so and carry on."""


class RunDirError(PswiftError):
    """The run directory cannot be created or read."""

    exit_code = 1


class OutputRefused(PswiftError):
    """A file a command was asked to write, and did not: a folder at its name, a place it cannot
    write, or a folder that is not the caller's own."""

    exit_code = 1


class HistoryError(PswiftError):
    """The history database cannot be opened, read or written (locked, corrupt, newer)."""

    exit_code = 1


class IngestRefused(PswiftError):
    """A run directory or spool file that is not read (unsafe, too big, too slow): the reason."""

    exit_code = 1
