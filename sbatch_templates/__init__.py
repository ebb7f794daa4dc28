"""Templates (``@name`` placeholders) of the batch scripts pipeswift-slurm renders (package data only)."""
