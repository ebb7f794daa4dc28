"""Everything that asks or tells Slurm: `client` (the one module that runs Slurm's commands),
its pyslurm backend, `records` (Slurm's answers of every version, parsed), `queue` (the
start-time estimate from those records), `sbatch` (the batch script) and the plugins' install.
It imports only the contracts at the package's top."""
