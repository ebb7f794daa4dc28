"""Everything that asks or tells Slurm: `client` (the one module that runs Slurm's commands),
its pyslurm backend, `records` (Slurm's answers of every version, parsed), `cluster` (the
start-time estimate from those records), `sbatch` (the batch script), `srun` (srun's report of
its tasks, read and written), `timespec` (Slurm's time syntax) and the plugins' install.
It imports only the contracts at the package's top."""
