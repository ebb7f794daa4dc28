--[[
pswift job_submit.lua: slurmctld runs slurm_job_submit() for every submission, under its locks,
so this is fast and does no I/O.

For pswift jobs (batch scripts that start `pipeswift_launch`):
  * adds --requeue when the request did not say (preemption in REQUEUE mode and the job's own
    `scontrol requeue` need it);
  * rejects contradictions, with a message the user sees at sbatch time:
      --no-requeue                    (a preempted pswift job must come back),
      --signal with SIGUSR1           (NCCL may catch it; pswift listens to USR2),
      --open-mode=truncate            (a requeued attempt would erase the earlier attempts' log).
Slurm 22.05's Lua interface cannot read or set open_mode, warn_signal or warn_time
("_set_job_field: unrecognized field"), so those two checks read the #SBATCH lines of the
script, and the defaults for them come from the script pswift renders (it always has
--open-mode=append, and --signal=USR2@T whenever there is a time limit).
Other jobs pass untouched.
]]

local NO_VAL16 = 65534

local function is_pswift(job_desc)
   return job_desc.script ~= nil and string.find(job_desc.script, "pipeswift_launch", 1, true) ~= nil
end

local function sbatch_lines(script)
   local lines = {}
   for line in string.gmatch(script, "[^\n]+") do
      if string.sub(line, 1, 7) == "#SBATCH" then
         table.insert(lines, line)
      end
   end
   return lines
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if not is_pswift(job_desc) then
      return slurm.SUCCESS
   end
   if job_desc.requeue == 0 then
      slurm.log_user("pswift: this pipeswift job asks --no-requeue, but a preempted or timed-out pswift job must be requeued to resume from its checkpoint; drop --no-requeue")
      return slurm.ERROR
   end
   for _, line in ipairs(sbatch_lines(job_desc.script)) do
      if string.find(line, "--signal=", 1, true) and (string.find(line, "USR1", 1, true) or string.find(line, "SIGUSR1", 1, true)) then
         slurm.log_user("pswift: --signal with SIGUSR1 conflicts with NCCL; pswift checkpoints on USR2 (use --signal=USR2@SECONDS)")
         return slurm.ERROR
      end
      if string.find(line, "--open-mode=truncate", 1, true) then
         slurm.log_user("pswift: --open-mode=truncate would erase the log of earlier attempts when the job is requeued; use --open-mode=append")
         return slurm.ERROR
      end
   end
   if job_desc.requeue == nil or job_desc.requeue == NO_VAL16 then
      job_desc.requeue = 1
      slurm.log_info("pswift job_submit: added --requeue to pswift job %s", tostring(job_desc.name))
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
