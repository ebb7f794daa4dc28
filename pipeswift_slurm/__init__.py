"""pipeswift-slurm: login-node side (config, plan, sbatch rendering, Slurm access, CLI).

This package must never import torch or deepspeed; the in-job launcher (``pipeswift_launch``)
is the only code that does.
"""

__version__ = "0.1.0"


def load_model(run_dir: str, step: int | None = None):  # type: ignore[no-untyped-def]
    """A run's trained model without pipelining (``torch.nn.Sequential`` of its layers, the
    newest committed checkpoint's weights or ``step``'s), for evaluation or fine-tuning. Needs the
    compute side (``pip install 'pipeswift-slurm[train]'``): it is the one entry of this package
    that loads torch, and only when called (pipeswift_launch.export).

    Example: ``model = pipeswift_slurm.load_model("pswift-runs/tiny-gpt-...")``
    """
    from pipeswift_launch.export import load_model as _load   # torch: only when asked for
    return _load(run_dir, step)


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``pipeswift_slurm.Job`` (and its Result, JobFailed), imported when first named: the
    package itself stays as light as `pswift --version` needs."""
    if name in ("Job", "Result", "JobFailed"):
        from pipeswift_slurm import submit
        return getattr(submit, name)
    raise AttributeError(f"module 'pipeswift_slurm' has no attribute {name!r}")
