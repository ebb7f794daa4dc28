"""pipeswift-slurm: login-node side (config, plan, sbatch rendering, Slurm access, CLI).

This package must never import torch or deepspeed; the in-job launcher (``pipeswift_launch``)
is the only code that does.
"""

__version__ = "0.1.0"
