"""Estimating and choosing: the cost model, the pipeline simulator, stage cuts, the planner,
the checkpoint interval, and what follows a stop (`decide`). Pure functions; they ask Slurm only
through `slurm/` and never read the history (`autoplan` gathers those facts for them)."""
