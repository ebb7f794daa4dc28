"""pipeswift-slurm from Python, in one place: ``from pipeswift_slurm.api import Job, load_model``.

- :class:`Job` (submitit's ``Job`` for a pswift run): ``Job.attach(job id | run dir)``,
  ``state``, ``status()``, ``wait()``, ``done()``, ``result()``, ``exception()``, ``cancel()``,
  ``logs()``; ``submit.sbatch(toml)`` returns one;
- :func:`load_model`: a run's trained model without pipelining (needs the compute side, torch and
  deepspeed: the one call here that loads them, and only when made).

The package's own ``__init__`` stays empty of these (the floors of the house: what everything
imports imports nothing above it).
"""

from __future__ import annotations

# Imports inside functions: the export needs torch (the launcher's export), loaded only when asked

import os
from typing import Any

from pipeswift_slurm.submit import Job, JobFailed, Result, sbatch

__all__ = ["Job", "JobFailed", "Result", "load_model", "sbatch"]


def load_model(run_dir: str | os.PathLike[str], step: int | None = None) -> Any:
    """A run's trained model without pipelining (``torch.nn.Sequential`` of its layers, the
    newest committed checkpoint's weights or ``step``'s), in eval mode, for evaluation or
    fine-tuning. Needs ``pip install 'pipeswift-slurm[train]'``.

    Example: ``model = load_model("pswift-runs/tiny-gpt-20261205-1200-ab12")``
    """
    from pipeswift_launch.export import load_model as _load   # torch: only when asked for
    return _load(run_dir, step)
