#!/usr/bin/env bash
# capture.sh OUTDIR - record Slurm's real JSON for one fixed situation on the running dev cluster
# (SLURM_CONF set; accounting on for sacct): 3 of 4 nodes held by a 60-minute job, a 4-node job
# pending behind it, one finished job. The parser unit tests read these files; the contract test
# (test_slurm_versions.py) recreates the same situation live on each Slurm version.
set -euo pipefail
out=${1:?usage: capture.sh OUTDIR}
mkdir -p "$out"
done_job=$(sbatch --parsable -N1 -t 5 -J finished -o /dev/null --wrap 'exit 3')
hold=$(sbatch --parsable -N3 -t 60 --exclusive -J holder -o /dev/null --wrap 'sleep 600')
pend=$(sbatch --parsable -N4 -t 30 -J waiter -o /dev/null --wrap 'sleep 1')
for _ in $(seq 100); do
  [ "$(squeue -h -j "$hold" -o %T)" = RUNNING ] && [ -z "$(squeue -h -j "$done_job" -o %T 2>/dev/null | grep -v COMPLETED | grep -v FAILED)" ] && break
  sleep 0.2
done
sleep 3
sinfo --json >"$out/sinfo.json"
squeue --json >"$out/squeue.json"
(scontrol show nodes --json >"$out/scontrol_nodes.json" 2>/dev/null) || rm -f "$out/scontrol_nodes.json"
(sacct --json --allusers -j "$done_job" >"$out/sacct.json" 2>/dev/null) || rm -f "$out/sacct.json"
SLURM_TIME_FORMAT=standard squeue --noheader --states=PENDING,RUNNING --format='%i|%T|%Q|%P|%D|%l|%e|%N|%U|%S' >"$out/squeue_active.txt"
scancel "$hold" "$pend"
echo "captured in $out (jobs $done_job $hold $pend)"
