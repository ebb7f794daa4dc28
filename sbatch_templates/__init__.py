"""Jinja2 templates of the batch scripts pipeswift-slurm renders (package data only)."""
