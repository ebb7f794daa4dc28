"""The Slurm-side plugins, shipped in the wheel as ``pipeswift_plugins`` so that
`pswift admin install-plugins` finds them in any installation (they are run by slurmctld as
files, never imported): ``jobcomp_pswift.py`` (JobCompType=jobcomp/script) and
``job_submit.lua`` (JobSubmitPlugins=lua)."""
