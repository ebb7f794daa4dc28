"""pipeswift_launch: the in-job launcher. The only code of pipeswift-slurm that imports torch and
deepspeed. Run as ``python -m pipeswift_launch RUN_DIR/plan.json``, one process per slot (srun
starts them under Slurm; `pswift run` starts them locally)."""
